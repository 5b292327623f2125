"""Settings of a team's rollouts, as a run file's ``[tasks]`` and ``[agent]`` tables give them: where the tasks
and the verifier come from, and the agent that plays each session; and ``forge rollout``'s own. Paths are relative
to the run file."""

from __future__ import annotations

from dataclasses import dataclass, field

from forge.builtin import IMPLS, resolve_model
from forge.model.sampling import SamplingParams
from forge.sandbox.config import SandboxConfig
from forge.settings import Settings, SettingsError, log_level_setting, setting


@dataclass(frozen=True, kw_only=True)
class ModelChoice(Settings):
    """The run file's ``[model]`` table: the policy every service of the run serves or trains."""

    path: str = setting("tiny", flag="model", validate=resolve_model, help="'tiny', 'tiny-moe' or a checkpoint directory.")
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
        return bool(self.train or self.source)

    def check(self) -> None:
        if self.train and self.source:
            raise SettingsError("give --tasks or --task-source, not both")
        if self.eval and self.eval_fraction:
            raise SettingsError("give --eval-tasks or --eval-fraction, not both")
        if self.team and not self.verifier:
            raise SettingsError("the team's tasks need a verifier: give --verifier (FILE.py:FUNCTION)")
        if not self.team and (self.verifier or self.eval or self.eval_fraction):
            raise SettingsError("--verifier and held-out tasks go with the team's tasks: give --tasks too")


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

    @property
    def given(self) -> bool:
        return bool(self.command or self.python)

    def check(self) -> None:
        if self.command and self.python:
            raise SettingsError("give --agent (a program) or --agent-class (a Python class), not both")


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
    episodes: int = setting(0, min=0, help="Stop after this many sessions have ended (0: until stopped).")
    minutes: float = setting(0.0, min=0, help="Stop after this long (0: until stopped).")
    seed: int = setting(0, help="Seed of the task order.")
    log_level: str = log_level_setting()
    driver: DriverSettings = field(default_factory=DriverSettings)
    model: ModelChoice = field(default_factory=ModelChoice)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def check(self) -> None:
        if not self.gateway:
            raise SettingsError("give --gateway HOST:PORT (the gateway's gRPC address)")
        if not self.tasks.team or not self.agent.given:
            raise SettingsError("forge rollout plays the team's tasks: give [tasks] (train and verifier) and [agent] "
                                "(command or python)")
        if self.agent.command and not self.http:
            raise SettingsError("an agent program reaches its session over HTTP: give --http http://HOST:PORT")
