"""Settings of ``forge up``: its own (how long, how many actors, the held-out readings, keys), its rollout driver's
(``DriverSettings``, with the main job's defaults), and the services' settings as overrides of their own fields.

The services' settings are never declared again here. ``MAIN_JOB`` is the main job's tuning of them, written as a
run file's tables would write it (``[learner] lr = 2e-4``); a run file's ``[learner]``, ``[actor]``, ``[gateway]``
and ``[cache]`` tables, their ``FORGE_<SERVICE>_*`` variables and ``--set learner.lr=VALUE`` go on top
(``UpConfig.services``). forge up itself wires what makes the processes one system: addresses, ports, directories
and keys (``forge.app.up.plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forge.adapter_names import check_adapter_name
from forge.app.registry import SERVICES
from forge.checkpoints import hub_id_of
from forge.cli.overrides import Overrides
from forge.rollout.config import (
    AgentConfig,
    DriverSettings,
    EnvConfig,
    ModelChoice,
    TasksConfig,
    check_one_workload,
)
from forge.rollout.sandbox.config import SandboxConfig
from forge.rollout.tasks import ALL_DOMAINS, DOMAINS
from forge.rollout.tasks.long import PAGE_LINES
from forge.settings import Settings, SettingsError, group, log_level_setting, setting
from forge.tracking import TrackingConfig

# The services forge up runs, whose settings a run file's tables (and --set) override.
SERVICE_KINDS = ("learner", "actor", "gateway", "cache")

# The main job's tuning of the services: a short run of a tiny model on CPU.
MAIN_JOB: dict[str, dict[str, Any]] = {
    "learner": {"lr": 2e-4, "warmup_steps": 25, "token_norm": "sequence", "normalize": "domain", "beta": 0.2,
                "speed_domains": ["agent"], "batch_groups": 4, "max_wait": 10, "checkpoint_every": 25},
    "actor": {"threads": 1, "kv_cache_mb": 96},
    "gateway": {},
    "cache": {"capacity_mb": 512},
}

# forge up's options that were its own copies of a service's setting: they still work, with a warning naming the
# setting (old option name → SERVICE.OPTION).
RENAMED: dict[str, str] = {
    "lr": "learner.lr", "warmup_steps": "learner.warmup_steps", "token_norm": "learner.token_norm",
    "advantage_norm": "learner.normalize", "speed_weight": "learner.beta", "speed_domains": "learner.speed_domains",
    "batch_groups": "learner.batch_groups", "window": "learner.window", "backend": "actor.backend",
    "cache_mb": "cache.capacity_mb",
}


def parse_assignment(text: str) -> tuple[str, str, str]:
    """``SERVICE.OPTION=VALUE`` as (service, option with underscores, value); ValueError saying what is wrong."""
    target, equals, value = text.partition("=")
    kind, dot, option = target.strip().partition(".")
    if not equals or not dot or not option:
        raise ValueError(f"{text!r}: expected SERVICE.OPTION=VALUE, e.g. learner.lr=1e-4")
    if kind not in SERVICE_KINDS:
        raise ValueError(f"{text!r}: forge up runs no service {kind!r} (one of {', '.join(SERVICE_KINDS)})")
    return kind, option.replace("-", "_"), value


def check_run_names(names: tuple[str, ...]) -> None:
    for name in names:
        check_adapter_name(name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"run {repeated[0]!r} is given twice")


def main_job(kind: str) -> Overrides:
    """The main job's tuning of the service ``kind``."""
    return Overrides.of(SERVICES[kind].settings_class, MAIN_JOB[kind], "forge up")


@dataclass(frozen=True, kw_only=True)
class UpConfig(Settings):
    """``forge up``: the main job. Its ``[model]``, ``[tasks]`` and ``[agent]`` tables are its groups: with ``[tasks]``
    and ``[agent]``, the run trains on the team's tasks with its agent program instead of the built-in ones;
    ``[tracking]`` names the experiment trackers the run is logged to."""

    run_dir: Path | None = setting(None, path="dir", help="Where logs, the pool, checkpoints, metrics and plots go "
                                                          "[default: runs/up-<time>].")
    minutes: float = setting(10.0, min=0.1, help="How long to train (the held-out readings come on top).")
    steps: int = setting(0, min=0, help="Train this many learner steps: the learner stops at the last (its "
                                        "max_steps) and the run ends with it (0: train for --minutes, which still "
                                        "bounds the run).")
    actors: int = setting(1, min=1, max=16, help="Actor processes (with --prefill-actors: decode actors, unless "
                                                 "--decode-actors says how many).")
    prefill_actors: int = setting(0, min=0, max=16, help="Prefill actors: calls are prefilled there and continued on "
                                                         "the decode actors, their KV handed over through forge-cache "
                                                         "(torch backend, --cache); 0: every actor does both.")
    decode_actors: int = setting(0, min=0, max=16, help="With --prefill-actors: the decode actors (0: as many as "
                                                        "--actors).")
    teacher_actors: int = setting(1, min=1, max=16, help="With [learner] teacher (on-policy distillation): actor "
                                                         "processes serving the teacher model, which score the "
                                                         "student's samples.")
    runs: tuple[str, ...] = setting((), flag="run", metavar="NAME", validate=check_run_names,
                                    help="Train several runs on one actor fleet (repeatable): per NAME a learner "
                                         "training LoRA adapters ([learner] lora_rank), a gateway, a pool and its "
                                         "rollouts in RUN_DIR/NAME; the actors serve every run's adapter beside the "
                                         "shared base model.")
    eval_size: int = setting(48, min=1, max=64, help="Held-out tasks per domain.")
    eval_samples: int = setting(4, min=1, help="Sampled episodes per held-out task (the greedy reading takes one).")
    blackbox_every: int = setting(6, min=0, help="Every n-th single-turn group is played by the black-box "
                                                 "OpenAI-client agent (0 = never).")
    domains: tuple[str, ...] = setting(DOMAINS, separator=",", choices=ALL_DOMAINS,
                                       help="Task domains to train on (long: agent tasks whose tool outputs are long "
                                            "pages; not in the default mix).")
    long_page_lines: int = setting(PAGE_LINES, min=1, help="Lines in each tool output of the long tasks (about 8 "
                                                           "tokens a line on the built-in tokenizer).")
    seed: int = setting(0, help="Seed of the learner, the actors (the actor's own plus its index) and the rollouts, "
                                "unless a service's settings give one.")
    cache: bool = setting(True, help="Start forge-cache (the global L3 KV cache) and connect the actors to it (torch "
                                     "backend).")
    weights_curve: bool = setting(True, help="Encrypt and authenticate the learner-to-actor weight channel with "
                                             "CURVE, with key pairs made for the run in RUN_DIR/keys/weights.")
    keys: bool = setting(True, help="Secure the run with API keys: fresh random ones per run for the gateways, actors "
                                    "and cache, given to them as files in RUN_DIR/keys (mode 0600); --no-keys "
                                    "serves them without keys.")
    metrics: bool = setting(True, help="Give the learner, actors and cache a Prometheus /metrics port each (a free "
                                       "one, keyed as the service is; the gateways serve /metrics on their HTTP "
                                       "port anyway); services.json lists every metrics_url.")
    settings: tuple[str, ...] = setting((), flag="set", metavar="SERVICE.OPTION=VALUE",
                                        help="A setting of one of the services for this run, e.g. --set "
                                             "learner.lr=1e-4 or --set actor.backend=vllm (repeatable); above the "
                                             "run file's [learner], [actor], [gateway] and [cache] tables and their "
                                             "FORGE_<SERVICE>_* variables.")
    log_level: str = log_level_setting("WARNING")
    driver: DriverSettings = group(DriverSettings, groups_in_flight=6, max_tokens=96)
    model: ModelChoice = field(default_factory=ModelChoice)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    # The services' settings from the run file's tables and the environment, by service (see ``with_services``).
    services: Mapping[str, Overrides] = field(default_factory=dict)

    @property
    def group_size(self) -> int:
        return self.env.group_size if self.env.given else self.tasks.group_size

    @property
    def team(self) -> bool:
        """Whether the run plays the team's own tasks or an environment, rather than the built-in tasks."""
        return self.tasks.team or self.env.given

    def check(self) -> None:
        check_one_workload(self.tasks, self.agent, self.env)
        if not self.domains:
            raise SettingsError("--domains names no domain")
        if self.driver.temperature < 0.05:
            raise SettingsError("must be >= 0.05: forge up trains on sampled rollouts", "--temperature")
        if self.tasks.team and not self.agent.given:
            raise SettingsError("the team's tasks need an agent: give --agent (the program run per session) or "
                                "--agent-class (a Python class)")
        if self.agent.given and not self.tasks.team:
            raise SettingsError("an agent plays the team's tasks: give --tasks (or --task-source) too")
        if self.runs and self.prefill_actors:
            raise SettingsError("--run serves whole calls on the shared actors: it does not go with --prefill-actors")
        if self.decode_actors and not self.prefill_actors:
            raise SettingsError("--decode-actors goes with --prefill-actors (otherwise every actor does both)")
        for kind, overrides in self.services.items():
            if kind not in SERVICE_KINDS or overrides.settings_class is not SERVICES[kind].settings_class:
                raise SettingsError(f"forge up runs no service {kind!r} with these settings")
        for kind in SERVICE_KINDS:              # every --set names a real setting and gives it a value it takes
            self.overrides(kind)

    def overrides(self, kind: str) -> Overrides:
        """What the run file, the environment and --set say of the service ``kind``'s settings (later first)."""
        settings_class = SERVICES[kind].settings_class
        found = self.services.get(kind, Overrides(settings_class))
        for text in self.settings:
            try:
                target, option, value = parse_assignment(text)
                if target == kind:
                    found = found | Overrides.of(settings_class, {option: value}, "--set", f"--set {text}")
            except ValueError as exc:                 # SettingsError is one
                raise SettingsError(str(exc), "--set") from None
        return found

    def hub_models(self) -> tuple[str, ...]:
        """The Hugging Face models the run's services name (``[model] path``, or a service's own model setting),
        each once: forge up fetches them before it starts any service. (A service's own is checked where its table
        is read, in the cache: it must have been fetched already.)"""
        named = [self.model.path, *(str(found.values["model"]) for kind in SERVICE_KINDS
                                    if "model" in (found := self.overrides(kind)).values)]
        return tuple(dict.fromkeys(name for name in named if hub_id_of(name) is not None))

    def with_services(self, **tables: Mapping[str, Any]) -> UpConfig:
        """This configuration with services' settings given as run-file tables (``actor={"backend": "vllm"}``),
        on top of those it has."""
        services = dict(self.services)
        for kind, table in tables.items():
            if kind not in SERVICE_KINDS:
                raise SettingsError(f"forge up runs no service {kind!r} (one of {', '.join(SERVICE_KINDS)})")
            settings_class = SERVICES[kind].settings_class
            services[kind] = services.get(kind, Overrides(settings_class)) | Overrides.of(
                settings_class, table, "code", f"[{kind}]")
        return replace(self, services=services)
