"""``forge up``: the whole system on one machine — learner, actors, gateway as separate processes on loopback, the
rollout driver in this process — with a live summary, held-out evaluation at the start and the end, and a run
directory holding metrics, checkpoints, logs and a reward-curve PNG."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from forge.cli.common import CONTEXT_SETTINGS, setup_logging
from forge.launch import ServiceProcess
from forge.tasks import DOMAINS

log = logging.getLogger("forge.up")


@dataclass
class UpConfig:
    run_dir: Path
    minutes: float = 10.0
    actors: int = 1
    group_size: int = 4
    groups_in_flight: int = 6
    batch_groups: int = 4
    window: float = 0.3
    lr: float = 2e-4
    warmup_steps: int = 25
    token_norm: str = "sequence"        # the learner's --token-norm: short answers weigh as much as long tool turns
    advantage_norm: str = "domain"      # the learner's --normalize
    speed_weight: float = 0.2           # β of the completion-time reward …
    speed_domains: tuple[str, ...] = ("agent",)   # … paid where time is tool-call parallelism
    max_tokens: int = 96                # per call; enough for three parallel tool calls, so truncation is rare
    temperature: float = 1.0
    eval_size: int = 48
    eval_samples: int = 4               # sampled episodes per held-out task (at the training temperature)
    blackbox_every: int = 6
    domains: tuple[str, ...] = DOMAINS
    model: str = "tiny"
    seed: int = 0
    cache: bool = True                  # start forge-cache and let the actors share KV blocks through it
    cache_mb: int = 512


@dataclass
class RunState:
    started: float = field(default_factory=time.time)
    eval_start: dict[str, float] = field(default_factory=dict)          # sampled: the policy RL trains
    eval_end: dict[str, float] = field(default_factory=dict)
    eval_greedy_start: dict[str, float] = field(default_factory=dict)
    eval_greedy_end: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)


class System:
    """The service processes of one run, started in dependency order and stopped in reverse."""

    def __init__(self, config: UpConfig) -> None:
        self.config = config
        self.services: list[ServiceProcess] = []

    def start(self) -> None:
        c, run = self.config, self.config.run_dir
        l3: list[str] = []
        if c.cache:
            cache = self._start("cache", "forge-cache", ["--dir", str(run / "cache"), "--port", "0",
                                                         "--capacity-mb", str(c.cache_mb)])
            l3 = ["--l3-cache", cache.info["address"]]
        learner = self._start("learner", "forge-learner", [
            "--model", c.model, "--pool", str(run / "pool"), "--run-dir", str(run / "learner"),
            "--weights-fetch", "tcp://127.0.0.1:*", "--weights-announce", "tcp://127.0.0.1:*",
            "--batch-groups", str(c.batch_groups), "--window", str(c.window), "--lr", str(c.lr),
            "--warmup-steps", str(c.warmup_steps), "--token-norm", c.token_norm, "--normalize", c.advantage_norm,
            "--beta", str(c.speed_weight), "--speed-domains", ",".join(c.speed_domains),
            "--max-wait", "10", "--checkpoint-every", "25", "--port", "0", "--seed", str(c.seed)],
            env={"OMP_NUM_THREADS": "1"})
        actors = [self._start(f"actor-{i}", "forge-actor", [
            "--model", c.model, "--port", "0", "--name", f"actor-{i}", "--threads", "1", "--kv-cache-mb", "96",
            "--weights-fetch", learner.info["weights_fetch"], "--weights-announce", learner.info["weights_announce"],
            "--seed", str(c.seed + i), *l3]) for i in range(c.actors)]
        self._start("gateway", "forge-gateway", [
            "--model", c.model, *[arg for a in actors for arg in ("--actor", a.info["address"])],
            "--pool", str(run / "pool"), "--grpc-port", "0", "--http-port", "0"])
        services = [{"name": s.name, "kind": s.name.split("-")[0], **s.info} for s in self.services]
        (run / "services.json").write_text(json.dumps(services, indent=2))

    def _start(self, name: str, command: str, args: list[str], env: dict[str, str] | None = None) -> ServiceProcess:
        service = ServiceProcess(name, command, args, self.config.run_dir, env)
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
    channels = {s.name: connect(s.info.get("address") or s.info["grpc_address"]) for s in system.services}
    while not stop.wait(2.0):
        for name, channel in channels.items():
            try:
                report = stubs[name.split("-")[0]](channel).Stats(common_pb2.StatsRequest(), timeout=2)
                live.gauges[name] = dict(report.gauges)
            except Exception:  # a busy or restarting service: keep its last figures
                continue
    for channel in channels.values():
        channel.close()


def summary_table(config: UpConfig, live: RunState, driver) -> Table:
    elapsed = time.time() - live.started
    table = Table(title=f"forge up — {elapsed / 60:.1f} of {config.minutes:.0f} min — {config.run_dir}")
    table.add_column("domain")
    table.add_column("train reward (last 64)", justify="right")
    table.add_column("eval at start", justify="right")
    rewards = driver.stats.reward()
    for domain in config.domains:
        table.add_row(domain, f"{rewards.get(domain, float('nan')):.2f}",
                      f"{live.eval_start.get(domain, float('nan')):.2f}")
    learner = live.gauges.get("learner", {})
    gateway = live.gauges.get("gateway", {})
    actor = live.gauges.get("actor-0", {})
    table.caption = (f"episodes {driver.stats.episodes} (black-box {driver.stats.blackbox}) · "
                     f"calls/s {gateway.get('calls_per_s', 0):.1f} · actor weight version "
                     f"{actor.get('weight_version', 0):.0f} · learner step {learner.get('step', 0):.0f} "
                     f"(window head {learner.get('head', 0):.0f}, staleness {learner.get('staleness_mean', 0):.1f}) · "
                     f"actor {actor.get('tokens_per_s', 0):.0f} tok/s")
    return table


async def run(config: UpConfig, console: Console) -> dict[str, Any]:
    from forge.builtin import tiny_tokenizer
    from forge.pool import PoolReader
    from forge.rollout.driver import DriverConfig, RolloutDriver
    from forge.tokenizer import Tokenizer

    if (config.run_dir / "learner").is_dir():
        console.print(f"continuing the run in {config.run_dir}: the learner resumes from its latest checkpoint")
    config.run_dir.mkdir(parents=True, exist_ok=True)
    system = System(config)
    live = RunState()
    stop_polling = threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        with console.status("starting learner, actors and gateway …"):
            system.start()
        tokenizer = tiny_tokenizer() if config.model == "tiny" else Tokenizer.from_dir(config.model)
        actor = system.get("actor-0").info["address"]
        with console.status(f"held-out evaluation at the start ({config.eval_size} tasks per domain) …"):
            live.eval_start, live.eval_greedy_start = await evaluate_both(config, actor, tokenizer)
        console.print(f"eval at start: sampled {_rounded(live.eval_start)}, greedy {_rounded(live.eval_greedy_start)}")
        gateway = system.get("gateway").info
        pool = PoolReader(config.run_dir / "pool")

        def queued_groups() -> int:
            cursor = pool.cursor()
            return cursor.tail - cursor.head

        driver = RolloutDriver(DriverConfig(gateway["grpc_address"], gateway.get("http_address", ""),
                                            domains=config.domains, group_size=config.group_size,
                                            groups_in_flight=config.groups_in_flight, temperature=config.temperature,
                                            max_tokens=config.max_tokens, blackbox_every=config.blackbox_every,
                                            max_queued_groups=config.groups_in_flight + 2 * config.batch_groups,
                                            seed=config.seed), queued_groups=queued_groups)
        poller = threading.Thread(target=poll_stats, args=(system, live, stop_polling), daemon=True)
        poller.start()
        driving = asyncio.create_task(driver.run(stop))
        deadline = live.started + config.minutes * 60
        with Live(summary_table(config, live, driver), console=console, refresh_per_second=1) as view:
            while not stop.is_set() and time.time() < deadline and not driving.done():
                await asyncio.sleep(1.0)
                view.update(summary_table(config, live, driver))
        stop.set()
        await driving
        with console.status("held-out evaluation at the end …"):
            live.eval_end, live.eval_greedy_end = await evaluate_both(config, actor, tokenizer)
        result = {"config": {k: str(v) for k, v in asdict(config).items()}, "eval_start": live.eval_start,
                  "eval_end": live.eval_end, "eval_greedy_start": live.eval_greedy_start,
                  "eval_greedy_end": live.eval_greedy_end, "episodes": driver.stats.episodes,
                  "blackbox_episodes": driver.stats.blackbox, "train_reward": driver.stats.reward(),
                  "learner": live.gauges.get("learner", {}), "minutes": (time.time() - live.started) / 60}
    finally:
        stop_polling.set()
        with console.status("stopping services …"):
            system.stop()
    plot = _plot(config.run_dir)            # after the learner stopped: its metrics are complete
    result["plot"] = str(plot) if plot else None
    (config.run_dir / "summary.json").write_text(json.dumps(result, indent=2))
    return result


async def evaluate_both(config: UpConfig, actor: str, tokenizer) -> tuple[dict[str, float], dict[str, float]]:
    """The held-out reward sampled at the training temperature (``eval_samples`` per task), then greedy."""
    from forge.rollout.evaluate import evaluate_readings

    sampled, greedy = await evaluate_readings(actor, tokenizer, [(config.temperature, config.eval_samples), (0.0, 1)],
                                              config.domains, config.eval_size, config.max_tokens)
    return sampled, greedy


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {domain: round(value, 3) for domain, value in scores.items()}


def _plot(run_dir: Path) -> Path | None:
    """The run's reward, loss and throughput curves as run_dir/curves.png (None before the first step)."""
    from forge.top.plot import NoMetrics, draw, load_records, metrics_path, run_series

    try:
        records, _ = load_records(metrics_path(run_dir))
        return draw(run_series(records), run_dir / "curves.png", title=f"forge up: {run_dir.name}")
    except NoMetrics:
        log.warning("no learner metrics in %s: no curves drawn", run_dir)
        return None


def report(result: dict[str, Any], console: Console) -> None:
    table = Table(title="held-out reward per domain (sampled at the training temperature; greedy)")
    for column in ("domain", "start", "end", "change", "greedy start", "greedy end"):
        table.add_column(column, justify="right" if column != "domain" else "left")
    for domain, start in result["eval_start"].items():
        end = result["eval_end"][domain]
        table.add_row(domain, f"{start:.3f}", f"{end:.3f}", f"{end - start:+.3f}",
                      f"{result['eval_greedy_start'][domain]:.3f}", f"{result['eval_greedy_end'][domain]:.3f}")
    console.print(table)


@click.command("up", context_settings=CONTEXT_SETTINGS)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where logs, the pool, checkpoints, metrics and plots go [default: runs/up-<time>].")
@click.option("--minutes", default=10.0, show_default=True, type=click.FloatRange(min=0.1),
              help="How long to train.")
@click.option("--actors", default=1, show_default=True, type=click.IntRange(1, 16))
@click.option("--group-size", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Rollouts per task (G).")
@click.option("--groups-in-flight", default=6, show_default=True, type=click.IntRange(1))
@click.option("--batch-groups", default=4, show_default=True, type=click.IntRange(1), help="Groups per step.")
@click.option("--window", default=0.3, show_default=True, help="Windowed FIFO: count (>= 1) or fraction (< 1).")
@click.option("--lr", default=2e-4, show_default=True, help="The learner's learning rate (Adam).")
@click.option("--warmup-steps", default=25, show_default=True, type=click.IntRange(0),
              help="Learner steps of linear learning-rate warm-up.")
@click.option("--token-norm", type=click.Choice(["token", "sequence"]), default="sequence", show_default=True,
              help="Policy loss averaged over the batch's tokens, or within each call then over calls.")
@click.option("--max-tokens", default=96, show_default=True, type=click.IntRange(1),
              help="Tokens per model call (rollouts and evaluation).")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(0.05, 2.0),
              help="Sampling temperature of the rollouts and of the sampled evaluation.")
@click.option("--eval-size", default=48, show_default=True, type=click.IntRange(1, 64), help="Held-out tasks per domain.")
@click.option("--eval-samples", default=4, show_default=True, type=click.IntRange(1),
              help="Sampled episodes per held-out task (the greedy reading takes one).")
@click.option("--blackbox-every", default=6, show_default=True, type=click.IntRange(0),
              help="Every n-th single-turn group is played by the black-box OpenAI-client agent (0 = never).")
@click.option("--domains", default=",".join(DOMAINS), show_default=True)
@click.option("--model", default="tiny", show_default=True, help="'tiny' or a checkpoint directory.")
@click.option("--seed", default=0, show_default=True)
@click.option("--cache/--no-cache", default=True, show_default=True,
              help="Start forge-cache (the global L3 KV cache) and connect the actors to it.")
@click.option("--cache-mb", default=512, show_default=True, type=click.IntRange(16), help="forge-cache's capacity.")
@click.option("--log-level", default="WARNING", show_default=True)
def up(run_dir: Path | None, domains: str, log_level: str, **options: Any) -> None:
    """Run the whole system locally on the built-in tiny model and tasks: learner, actors and gateway as separate
    processes on loopback, white-box and black-box agents rolling out reasoning, QA and agent tasks, training with
    CISPO; held-out evaluation at the start and the end. Ctrl-C stops early (cleanly)."""
    setup_logging(log_level)
    chosen = tuple(d.strip() for d in domains.split(",") if d.strip())
    unknown = set(chosen) - set(DOMAINS)
    if unknown:
        raise click.BadParameter(f"unknown domains {sorted(unknown)} (have {', '.join(DOMAINS)})", param_hint="--domains")
    run_dir = run_dir or Path("runs") / time.strftime("up-%Y%m%d-%H%M%S")
    config = UpConfig(run_dir, domains=chosen, **options)
    console = Console()
    result = asyncio.run(run(config, console))
    report(result, console)
    console.print(f"run directory: {run_dir} (summary.json, curves.png, learner/metrics.jsonl, logs/)")
