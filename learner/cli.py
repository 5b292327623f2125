"""``forge-learner``: train the policy on the pool's finished work and stream weights to the actors."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

import click

from forge.cli.common import CONTEXT_SETTINGS, config_option, log_level_option, setup_logging, write_ready_file

log = logging.getLogger("forge.learner")


def _relaunch_under_torchrun(nproc: int) -> None:
    """Re-run this command as ``nproc`` data-parallel processes (torchrun, one host)."""
    args = [a for a in sys.argv[1:]]
    for flag in ("--nproc",):
        while flag in args:
            index = args.index(flag)
            del args[index:index + 2]
    args = [a for a in args if not a.startswith("--nproc=")]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "forge.learner", *args]
    os.execv(sys.executable, command)


def _open_pool(pool: Path | None, pool_address: str | None, api_key: str | None):
    if pool_address:
        from forge.pool import PoolClient

        return PoolClient(pool_address, api_key=api_key)
    from forge.pool import Pool

    return Pool(pool)


def _initial_model(model: str, resume_dir: Path | None, seed: int):
    from forge.builtin import TINY_DIR, is_builtin, tiny_model
    from forge.model import CausalLM

    if resume_dir is not None:
        return CausalLM.from_pretrained(resume_dir), resume_dir
    if is_builtin(model):
        if any(TINY_DIR.glob("*.safetensors")):
            return CausalLM.from_pretrained(TINY_DIR), TINY_DIR
        log.warning("the built-in tiny model has no trained weights in this installation: starting from a fresh init")
        return tiny_model(seed), TINY_DIR
    path = Path(model)
    if not (path / "config.json").exists():
        raise click.BadParameter(f"{model} is not a checkpoint directory nor 'tiny'", param_hint="--model")
    return CausalLM.from_pretrained(path), path


@click.command("learner", context_settings=CONTEXT_SETTINGS)
@config_option
@click.option("--model", default="tiny", show_default=True,
              help="Initial policy: a checkpoint directory (HF layout) or 'tiny'. Ignored when resuming.")
@click.option("--pool", "pool_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local pool directory (LMDB), opened in this process.")
@click.option("--pool-address", default=None, help="host:port of a remote Pool service instead of --pool.")
@click.option("--pool-api-key", default=None, envvar="FORGE_POOL_API_KEY", help="API key of the remote pool.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/learner"),
              show_default=True, help="Checkpoints and metrics.jsonl go here.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue from the run directory's latest checkpoint when there is one.")
@click.option("--weights-fetch", default="tcp://127.0.0.1:5701", show_default=True,
              help="ZeroMQ endpoint actors fetch weight chunks from ('tcp://127.0.0.1:*' picks a free port).")
@click.option("--weights-announce", default="tcp://127.0.0.1:5702", show_default=True,
              help="ZeroMQ endpoint new weight versions are announced on.")
@click.option("--publish/--no-publish", default=True, show_default=True, help="Stream weights to actors.")
@click.option("--loss", type=click.Choice(["cispo", "ppo", "grpo"]), default="cispo", show_default=True)
@click.option("--lr", default=1e-5, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--eps-low", default=1.0, show_default=True, help="CISPO: IS weight lower bound is 1 - eps_low.")
@click.option("--eps-high", default=1.0, show_default=True, help="CISPO: IS weight upper bound is 1 + eps_high.")
@click.option("--clip-eps", default=0.2, show_default=True, help="PPO-clip and GRPO clipping.")
@click.option("--alpha", default=1.0, show_default=True, help="Weight of process rewards.")
@click.option("--beta", default=0.0, show_default=True, help="Weight of the completion-time reward.")
@click.option("--gamma", default=1.0, show_default=True, help="Discount of the reward-to-go over calls.")
@click.option("--baseline", type=click.Choice(["group", "none"]), default="group", show_default=True)
@click.option("--normalize", type=click.Choice(["none", "group", "domain"]), default="none", show_default=True)
@click.option("--failure-reward", default=0.0, show_default=True, help="Outcome reward of a failed session.")
@click.option("--speed-on", type=click.Choice(["success", "all"]), default="success", show_default=True,
              help="Sessions the completion-time reward applies to: successful ones only, or every finished one.")
@click.option("--speed-domains", default="", show_default=True,
              help="Comma-separated domains the completion-time reward applies to (empty: all).")
@click.option("--mtp-weight", default=0.1, show_default=True, help="Weight of the MTP draft's distillation loss.")
@click.option("--mtp-top-k", default=32, show_default=True, type=click.IntRange(1))
@click.option("--token-norm", type=click.Choice(["token", "sequence"]), default="token", show_default=True,
              help="CISPO/PPO: average over the batch's tokens, or within each sequence then over sequences.")
@click.option("--mode", type=click.Choice(["fifo", "windowed", "greedy"]), default="windowed", show_default=True,
              help="fifo: W = 1; windowed: W = --window; greedy: W = all entries in flight.")
@click.option("--window", default=0.3, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="W as a count (>= 1) or a fraction of the entries in flight (< 1).")
@click.option("--batch-groups", default=8, show_default=True, type=click.IntRange(1),
              help="Queue entries (groups of rollouts) per step.")
@click.option("--min-groups", default=1, show_default=True, type=click.IntRange(1))
@click.option("--max-wait", default=30.0, show_default=True, help="Seconds to wait for a full batch.")
@click.option("--max-staleness", default=0, show_default=True, type=click.IntRange(0),
              help="Versions a sample may lag behind the learner (0 = no limit).")
@click.option("--staleness-policy", type=click.Choice(["drop", "keep"]), default="drop", show_default=True)
@click.option("--warmup-steps", default=0, show_default=True, type=click.IntRange(0),
              help="Linear learning-rate warm-up over this many steps.")
@click.option("--micro-batch-tokens", default=8192, show_default=True, type=click.IntRange(16),
              help="Token budget of one micro-batch (of one packed prefix tree with --tree).")
@click.option("--tree/--no-tree", default=True, show_default=True,
              help="Merge the batch's shared prefixes into packed tries and train them once (exact); "
                   "--no-tree trains sample by sample.")
@click.option("--tree-stem/--no-tree-stem", default=True, show_default=True,
              help="With --tree: compute the context several packed trees of a step share once (its activations "
                   "are held for the step); --no-tree-stem recomputes it in every tree.")
@click.option("--max-steps", default=0, show_default=True, type=click.IntRange(0), help="0 = until stopped.")
@click.option("--checkpoint-every", default=10, show_default=True, type=click.IntRange(1))
@click.option("--keep-checkpoints", default=3, show_default=True, type=click.IntRange(1))
@click.option("--publish-every", default=1, show_default=True, type=click.IntRange(1))
@click.option("--device", default="auto", show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--nproc", default=1, show_default=True, type=click.IntRange(1),
              help="Data-parallel processes (FSDP2, relaunched under torchrun).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface of the Stats service.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the Stats service (0 = any free port).")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write {address, pid, weights_fetch, weights_announce} as JSON once ready.")
@log_level_option
def learner(model: str, pool_path: Path | None, pool_address: str | None, pool_api_key: str | None, run_dir: Path,
            resume: bool, weights_fetch: str, weights_announce: str, publish: bool, loss: str, lr: float,
            eps_low: float, eps_high: float, clip_eps: float, alpha: float, beta: float, gamma: float, baseline: str,
            normalize: str, failure_reward: float, speed_on: str, speed_domains: str, mtp_weight: float, mtp_top_k: int, token_norm: str, mode: str, window: float,
            batch_groups: int, min_groups: int, max_wait: float, max_staleness: int, staleness_policy: str,
            warmup_steps: int, micro_batch_tokens: int, tree: bool, tree_stem: bool, max_steps: int, checkpoint_every: int, keep_checkpoints: int,
            publish_every: int, device: str, seed: int, nproc: int, host: str, port: int, ready_file: Path | None,
            log_level: str) -> None:
    """Train the policy with CISPO (or PPO-clip, GRPO) on windowed-FIFO batches from the pool, checkpoint with the
    pool cursor (a restart neither skips nor repeats entries), co-train the MTP draft, and publish every new
    weight version over ZeroMQ. Progress goes to stdout, metrics to RUN_DIR/metrics.jsonl; SIGTERM stops after the
    current step with a checkpoint."""
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        _relaunch_under_torchrun(nproc)
    if (pool_path is None) == (pool_address is None):
        raise click.UsageError("give exactly one of --pool and --pool-address")
    setup_logging(log_level)
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s: stopping after this step", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    import torch

    from forge.learner.checkpoint import Checkpointer
    from forge.learner.losses import LossConfig
    from forge.learner.metrics import MetricsWriter, summary
    from forge.learner.parallel import init_distributed, shard_model
    from forge.learner.rewards import RewardConfig
    from forge.learner.trainer import Trainer, TrainerConfig
    from forge.pool import WindowConfig

    try:
        configs = (LossConfig(loss, eps_low, eps_high, clip_eps, mtp_weight, mtp_top_k, token_norm),
                   RewardConfig(alpha, beta, gamma, baseline, normalize, failure_reward, speed_on,
                                tuple(d.strip() for d in speed_domains.split(",") if d.strip())),
                   WindowConfig(mode, window, batch_groups, min(min_groups, batch_groups), max_wait),
                   TrainerConfig(lr=lr, warmup_steps=warmup_steps, micro_batch_tokens=micro_batch_tokens, tree=tree,
                                 tree_stem=tree_stem, max_steps=max_steps,
                                 checkpoint_every=checkpoint_every, publish_every=publish_every,
                                 max_staleness=max_staleness, staleness_policy=staleness_policy, seed=seed))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    distributed = init_distributed(device)
    torch.manual_seed(seed)
    checkpointer = Checkpointer(run_dir / "checkpoints", keep=keep_checkpoints)
    restored = checkpointer.latest() if resume else None
    policy, source_dir = _initial_model(model, restored.model_dir if restored else None, seed)
    checkpointer.tokenizer_dir = source_dir
    policy = shard_model(policy.to(distributed.device), distributed)
    pool = _open_pool(pool_path, pool_address, pool_api_key) if distributed.is_main else None
    publisher = metrics = server = None
    if distributed.is_main:
        if publish:
            from forge.weights import WeightPublisher

            publisher = WeightPublisher(weights_fetch, weights_announce)
        metrics = MetricsWriter(run_dir / "metrics.jsonl")
    trainer = Trainer(policy, distributed, configs[3], configs[0], configs[1], configs[2], pool, checkpointer,
                      publisher, metrics)
    if restored is not None:
        trainer.restore()

    if distributed.is_main:
        from forge.learner.service import LearnerServicer, serve_learner
        from forge.rpc import ServerOptions

        server = serve_learner(LearnerServicer(lambda: trainer.last, labels={"run_dir": str(run_dir)}),
                               ServerOptions(host=host, port=port))
        if publisher is not None:                 # actors start from the learner's current version
            from forge.learner.parallel import full_state_dict

            publisher.publish(trainer.state.version, full_state_dict(policy, distributed))
            checkpointer.record_published(trainer.state.version)
        if ready_file:
            write_ready_file(ready_file, address=server.address,
                             weights_fetch=publisher.fetch_endpoint if publisher else None,
                             weights_announce=publisher.announce_endpoint if publisher else None,
                             step=trainer.state.step, version=trainer.state.version)
        log.info("learner ready: stats on %s, %s", server.address,
                 f"weights on {publisher.fetch_endpoint}" if publisher else "not publishing")
    elif publish:
        from forge.learner.parallel import full_state_dict

        full_state_dict(policy, distributed)     # rank 0 gathers the initial version for publishing

    def on_step(record: dict) -> None:
        if distributed.is_main:
            click.echo(summary(record))

    try:
        trainer.run(stop.is_set, on_step)
        if trainer.state.step and trainer.state.step % checkpoint_every:
            trainer.save_checkpoint()
    finally:
        if server is not None:
            server.stop(1)
        if publisher is not None:
            publisher.close()
        if metrics is not None:
            metrics.close()
        if pool is not None:
            pool.close()
        distributed.close()
    log.info("learner stopped at step %d (version %d)", trainer.state.step, trainer.state.version)
