"""Settings of a team's rollouts, as a run file's ``[tasks]`` and ``[agent]`` tables give them: where the tasks
and the verifier come from, and the agent that plays each session; and ``forge rollout``'s own. Paths are relative
to the run file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.checkpoints import IMPLS, resolve_model
from forge.rollout.sandbox.config import SandboxConfig
from forge.sampling.params import SamplingParams
from forge.settings import Settings, SettingsError, log_level_setting, setting


@dataclass(frozen=True, kw_only=True)
class ModelChoice(Settings):
    """The run file's ``[model]`` table: the policy every service of the run serves or trains."""

    path: str = setting("tiny", flag="model", validate=resolve_model,
                        help="'tiny', 'tiny-moe', a checkpoint directory or a Hugging Face id (org/name, "
                             "org/name@revision).")
    impl: str = setting("auto", flag="model-impl", choices=IMPLS,
                        help="What the learner trains it with: Forge's own implementation (native), transformers', "
                             "or auto: native where Forge implements the family.")


@dataclass(frozen=True, kw_only=True)
class TasksConfig(Settings):
    train: str | None = setting(None, flag="tasks", metavar="FILE",
                                help="The team's training tasks: a JSONL file, one task a line (none: the built-in "
                                     "tasks).")
    source: str | None = setting(None, flag="task-source", metavar="MODULE:FUNCTION",
                                 help="Or Python code that makes them: a function returning task dicts.")
    dataset: str | None = setting(None, metavar="ID|FILE",
                                  help="Or a dataset, one task a row: a Hugging Face dataset id (org/name, "
                                       "org/name@revision) or a local parquet, JSONL, JSON or CSV file or folder, "
                                       "read with the datasets extra (see docs/agents.md).")
    dataset_config: str | None = setting(None, metavar="NAME", help="The dataset's configuration (subset), e.g. main.")
    split: str = setting("train", flag="dataset-split", help="The dataset's split the training tasks come from.")
    eval_split: str | None = setting(None, flag="dataset-eval-split", metavar="SPLIT",
                                     help="Held-out tasks: this split of the dataset.")
    columns: dict[str, str] = setting(factory=dict, flag="dataset-columns",
                                      help="The dataset's column of each task field (id, prompt, messages, answer, "
                                           "domain), e.g. {prompt = \"question\"} [default: the usual names].")
    system_prompt: str | None = setting(None, flag="dataset-system-prompt", metavar="TEXT",
                                        help="A system message put before each dataset task's prompt.")
    limit: int = setting(0, min=0, flag="dataset-limit",
                         help="At most this many tasks of each dataset split (0: all); the rest is not read.")
    eval: str | None = setting(None, flag="eval-tasks", metavar="FILE",
                               help="Held-out tasks (JSONL), read at the start and the end of the run.")
    eval_fraction: float = setting(0.0, min=0, max=0.9,
                                   help="Or hold out this fraction of the training tasks (0: none).")
    verifier: str | None = setting(None, metavar="FILE.py:FUNCTION",
                                   help="score(task, reply, session) -> float or {name: float}: the outcome reward "
                                        "of each session.")
    verifier_workers: int = setting(4, min=1, help="Threads the verifier runs on (rollouts never wait on it).")
    verifier_timeout_s: float = setting(60.0, flag="verifier-timeout", min=0, min_open=True,
                                        help="Seconds a verifier call may take; a slower one fails its session.")
    group_size: int = setting(4, min=1, max=64, help="Rollouts per task (G).")

    @property
    def team(self) -> bool:
        """Whether the run uses the team's tasks rather than the built-in ones."""
        return bool(self.train or self.source or self.dataset)

    def dataset_spec(self, split: str | None = None):
        """The dataset's ``split`` (the training one by default) as a ``DatasetSpec``; None without a dataset."""
        from forge.rollout.tasks.dataset_source import DatasetSpec

        if not self.dataset:
            return None
        return DatasetSpec(self.dataset, split or self.split, self.dataset_config, dict(self.columns),
                           self.system_prompt, self.limit)

    def check(self) -> None:
        from forge.rollout.tasks.dataset_source import FIELDS

        if sum(bool(x) for x in (self.train, self.source, self.dataset)) > 1:
            raise SettingsError("give one of --tasks, --task-source and --dataset")
        if sum(bool(x) for x in (self.eval, self.eval_fraction, self.eval_split)) > 1:
            raise SettingsError("give one of --eval-tasks, --eval-fraction and --dataset-eval-split")
        if self.eval_split and not self.dataset:
            raise SettingsError("--dataset-eval-split is a split of the dataset: give --dataset too")
        unknown = sorted(set(self.columns) - set(FIELDS))
        if unknown:
            raise SettingsError(f"columns names a field Forge does not read: {', '.join(unknown)} (fields: "
                                f"{', '.join(FIELDS)})")
        if self.eval_split == self.split and self.dataset:
            raise SettingsError(f"--dataset-eval-split {self.eval_split!r} is the training split too")
        if self.team and not self.verifier:
            raise SettingsError("the team's tasks need a verifier: give --verifier (FILE.py:FUNCTION)")
        if not self.team and (self.verifier or self.eval or self.eval_fraction or self.eval_split):
            raise SettingsError("--verifier and held-out tasks go with the team's tasks: give --tasks too")


@dataclass(frozen=True, kw_only=True)
class EnvConfig(Settings):
    """The run file's ``[env]`` table: an environment the ecosystem already has, played unchanged in place of the
    team's ``[tasks]`` and ``[agent]``: its tasks, its own rollout logic and its rewards (see docs/agents.md)."""

    verifiers: str | None = setting(None, metavar="FILE.py:FUNCTION|MODULE",
                                    help="A verifiers environment: a function returning a verifiers.v1 Env (a file, "
                                         "relative to the run file, or a module), or a taskset's module.")
    openenv: str | None = setting(None, metavar="MODULE:CLASS",
                                  help="An OpenEnv environment class (openenv-core), served by Forge on loopback.")
    openenv_url: str | None = setting(None, metavar="URL",
                                      help="Or an OpenEnv environment already served at http://HOST:PORT.")
    args: dict[str, Any] = setting(factory=dict, flag="env-args",
                                   help="Keyword arguments for the environment: the verifiers function's (or its "
                                        "taskset's settings), or an OpenEnv reset's besides the seed.")
    seeds: int = setting(64, flag="env-seeds", min=1,
                         help="OpenEnv: the tasks are the reset seeds 0 .. N-1.")
    max_turns: int = setting(8, flag="env-max-turns", min=1,
                             help="OpenEnv: the model's replies per episode at most (a verifiers environment sets "
                                  "its own).")
    tool_choice: str = setting("auto", flag="env-tool-choice", choices=("auto", "required"),
                               help="OpenEnv with tools: may the model answer without one (auto: that ends the "
                                    "episode), or must every reply call one (required: the gateway's grammar holds it to "
                                    "the tool's schema).")
    concurrency: int = setting(16, flag="env-concurrency", min=1,
                               help="OpenEnv: episodes at once at most (one for a class that does not support "
                                    "concurrent sessions).")
    eval_fraction: float = setting(0.0, flag="env-eval-fraction", min=0, max=0.9,
                                   help="Hold out this fraction of the environment's tasks for the held-out reward.")
    group_size: int = setting(4, flag="env-group-size", min=1, max=64, help="Rollouts per task (G).")
    timeout_s: float = setting(600.0, flag="env-timeout", min=0, min_open=True,
                               help="Seconds one episode may take; a slower one fails its session.")

    @property
    def given(self) -> bool:
        return bool(self.verifiers or self.openenv or self.openenv_url)

    def check(self) -> None:
        named = [flag for flag, value in (("--verifiers", self.verifiers), ("--openenv", self.openenv),
                                          ("--openenv-url", self.openenv_url)) if value]
        if len(named) > 1:
            raise SettingsError(f"give one environment: {' or '.join(named)}, not both")
        if self.openenv_url and not self.openenv_url.startswith(("http://", "https://")):
            raise SettingsError(f"must be an http:// or https:// URL, got {self.openenv_url!r}", "--openenv-url")


@dataclass(frozen=True, kw_only=True)
class McpConfig(Settings):
    """The run file's ``[agent.mcp]`` table: MCP tool servers for Forge's built-in tool agent, which plays each task
    with their tools (``forge.rollout.mcp_agent``)."""

    servers: tuple[str, ...] = setting((), flag="mcp-server", metavar="COMMAND|URL",
                                       help="An MCP server: a command line run over stdio (relative to the run file) "
                                            "or a streamable-HTTP URL (repeatable).")
    shared: bool = setting(False, flag="mcp-shared",
                           help="Connect to each server once for the run rather than once per session (a stdio "
                                "server then serves every session; one that crashes is restarted).")
    max_turns: int = setting(8, flag="mcp-max-turns", min=1, help="Model calls per session at most.")
    tool_timeout_s: float = setting(60.0, flag="mcp-tool-timeout", min=0, min_open=True,
                                    help="Seconds a tool call may take; a slower one fails its session.")


@dataclass(frozen=True, kw_only=True)
class AgentConfig(Settings):
    command: tuple[str, ...] = setting((), flag="agent", separator="shell", metavar="COMMAND",
                                       help="The agent program run once per session, e.g. 'python my_agent.py' (a "
                                            "list in a run file); it reads OPENAI_BASE_URL and OPENAI_API_KEY.")
    python: str | None = setting(None, flag="agent-class", metavar="FILE.py:CLASS",
                                 help="Or a white-box agent: a forge.agents.Agent subclass, built once per session.")
    timeout_s: float = setting(600.0, flag="agent-timeout", min=0, min_open=True,
                               help="Seconds a session's program may run; a slower one is killed and the session "
                                    "fails.")
    concurrency: int = setting(16, flag="agent-concurrency", min=1, help="Agent programs running at once at most.")
    mcp: McpConfig = field(default_factory=McpConfig)

    @property
    def given(self) -> bool:
        return bool(self.command or self.python or self.mcp.servers)

    def check(self) -> None:
        named = [flag for flag, value in (("--agent (a program)", self.command), ("--agent-class (a Python class)",
                                          self.python), ("--mcp-server (the built-in tool agent)", self.mcp.servers))
                 if value]
        if len(named) > 1:
            raise SettingsError(f"give {' or '.join(named)}, not both")


@dataclass(frozen=True, kw_only=True)
class DriverSettings(Settings):
    """How a rollout driver plays: how many task groups at once, and the sampling of its white-box agents' calls.
    ``forge rollout`` and ``forge up`` share it, each with defaults of its own (``forge.settings.group``)."""

    groups_in_flight: int = setting(4, min=1, help="Task groups being rolled out at once.")
    temperature: float = setting(1.0, min=0, max=2.0, help="Sampling temperature of a white-box agent's calls.")
    max_tokens: int = setting(256, min=1, help="Tokens per call of a white-box agent (unless it says otherwise).")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens)


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(Settings):
    """``forge rollout``: the team's rollouts against a gateway that already runs (the learner reads its pool)."""

    gateway: str | None = setting(None, metavar="HOST:PORT", help="The gateway's gRPC address. Required.")
    http: str | None = setting(None, metavar="URL", help="The gateway's HTTP root (http://HOST:PORT), where agent "
                                                         "programs get their sessions' base URLs.")
    api_key: str | None = setting(None, secret=True, help="The gateway's API key, when it requires one.")
    episodes: int = setting(0, min=0, help="Stop after this many sessions have ended, counted over the run's starts "
                                           "with --summary (0: until stopped).")
    minutes: float = setting(0.0, min=0, help="Stop after this long (0: until stopped).")
    seed: int = setting(0, help="Seed of the task order.")
    eval_gateway: str | None = setting(None, metavar="HOST:PORT",
                                       help="A gateway whose pool no learner reads (gRPC): the held-out tasks "
                                            "([tasks] eval, or the environment's) are played through it at the start "
                                            "and at the end, each --eval-samples times.")
    eval_http: str | None = setting(None, metavar="URL", help="That gateway's HTTP root, for agent programs.")
    eval_samples: int = setting(1, min=1, help="Sessions of each held-out task at each evaluation.")
    summary: Path | None = setting(None, path="file",
                                   help="Write the run's summary here at the end (JSON): sessions, failures, "
                                        "training reward and held-out reward per domain at the start and the end.")
    log_level: str = log_level_setting()
    driver: DriverSettings = field(default_factory=DriverSettings)
    model: ModelChoice = field(default_factory=ModelChoice)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    @property
    def group_size(self) -> int:
        return self.env.group_size if self.env.given else self.tasks.group_size

    def check(self) -> None:
        if not self.gateway:
            raise SettingsError("give --gateway HOST:PORT (the gateway's gRPC address)")
        check_one_workload(self.tasks, self.agent, self.env)
        if not self.env.given and not (self.tasks.team and self.agent.given):
            raise SettingsError("forge rollout plays the team's tasks: give [tasks] (train and verifier) and [agent] "
                                "(command or python), or an environment ([env])")
        if (self.agent.command or self.env.given) and not self.http:
            what = "an environment's agent" if self.env.given else "an agent program"
            raise SettingsError(f"{what} reaches its session over HTTP: give --http http://HOST:PORT")
        if (self.agent.command or self.env.given) and self.eval_gateway and not self.eval_http:
            raise SettingsError("held-out sessions reach the eval gateway over HTTP too: give --eval-http "
                                "http://HOST:PORT")


def check_one_workload(tasks: TasksConfig, agent: AgentConfig, env: EnvConfig) -> None:
    """An environment brings its own tasks and agent: SettingsError when [tasks] or [agent] come with it."""
    if env.given and (tasks.team or agent.given):
        raise SettingsError("an environment ([env]) brings its own tasks, rewards and agent: give [env] or [tasks] "
                            "and [agent], not both")
