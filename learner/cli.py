"""``forge-learner``: train the policy on the pool's finished work and stream weights to the actors. The command is
the learner process's composition root: its settings (``LearnerConfig``) in, the trainer and its parts out."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

import click

from forge import variables
from forge.cli.common import check_port_option, entry_point, setup_logging, start_metrics, write_ready_file
from forge.cli.options import RUN_FILE, envvars_of, given_args, settings_command
from forge.learner.config import LearnerConfig
from forge.settings import entries

log = logging.getLogger("forge.learner")


def _torchrun_command(config: LearnerConfig, args: tuple[str, ...]) -> list[str]:
    """This command, given ``args``, as this node's ``--nproc`` data-parallel processes under torchrun: one host
    alone (``--standalone``), or node ``--node-rank`` of ``--nnodes`` with a static rendezvous at
    ``--rdzv-endpoint``, so that node 0 holds global rank 0 (the rank that reads the pool and serves weights and
    Stats). The ranks are given ``args`` but ``--nproc``, which torchrun's parser refuses wherever it stands (an
    ambiguous abbreviation of its --nproc-per-node): they read it from their environment (``_rank_environment``).
    A rank that fails ends the whole job (no in-place restarts): the job is started again, and every node resumes
    from the last checkpoint."""
    from forge.learner.launch import without_nproc

    if config.nnodes == 1:
        placement = ["--standalone"]
    else:
        host, _, port = config.rdzv_endpoint.rpartition(":")
        placement = [f"--nnodes={config.nnodes}", f"--node-rank={config.node_rank}",
                     f"--master-addr={host.strip('[]')}", f"--master-port={port}", "--max-restarts=0"]
    # The agent leaves SIGTERM and SIGINT to the ranks (TorchrunJob starts it ignoring them): where a scheduler
    # signals every process of the job (scancel --signal=TERM), it would otherwise end the ranks mid-checkpoint.
    return [sys.executable, "-m", "torch.distributed.run", *placement, f"--nproc-per-node={config.nproc}",
            "--signals-to-handle=SIGHUP,SIGQUIT", "-m", "forge.learner", *without_nproc(args)]


def _rank_environment(config: LearnerConfig) -> dict[str, str]:
    """What the ranks' environment adds to this command's: ``--nproc`` in its variable, so that every rank has
    this command's settings (its arguments give the rest) and checks them against the world torchrun launched."""
    nproc = next(entry for entry in entries(LearnerConfig) if entry.name == "nproc")
    return {envvars_of(nproc, learner.settings_table)[0]: str(config.nproc)}


def _run_under_torchrun(config: LearnerConfig) -> None:
    """Run the torchrun job and exit with its status. SIGTERM and SIGINT go to the ranks themselves, which stop
    together after the current step with a checkpoint; torchrun's own agent would end them as failed. The ranks
    run ``forge.learner`` with this command's own arguments, whether it was started as ``forge-learner`` or as
    ``forge learner``."""
    from forge.learner.launch import TorchrunJob

    command = _torchrun_command(config, given_args(click.get_current_context()))
    sys.exit(TorchrunJob(command, _rank_environment(config)).run())


def _open_pool(config: LearnerConfig):
    if config.pool_address:
        from forge.pool import PoolClient

        return PoolClient(config.pool_address, api_key=config.pool_api_key)
    from forge.pool import Pool

    return Pool(config.pool_path)


def _initial_model(config: LearnerConfig, restored, seed: int):
    """(policy, directory its tokenizer comes from): the checkpoint resumed from, else the initial policy. With LoRA,
    the initial policy with the run's adapters, the checkpoint's when resuming. UsageError when the checkpoint was
    written with LoRA and the run is not, or the other way round, or on another base model."""
    from forge.checkpoints import load_model
    from forge.learner.lora import add_adapters, load_adapter, set_adapter, trainable_parameters

    lora = config.lora
    if restored is not None:
        check_lora_resume(restored.adapter_dir, lora, config.model)
    source = restored.model_dir if restored is not None and not lora.enabled else config.model
    policy, ref = load_model(source, seed=seed, impl=config.model_impl)
    if lora.enabled:
        add_adapters(policy, lora)
        if restored is not None:
            set_adapter(policy, load_adapter(restored.adapter_dir))
        total, trainable = sum(p.numel() for p in policy.parameters()), trainable_parameters(policy)
        log.info("LoRA rank %d on %s: %s of %s parameters train (%.2f%%)", lora.rank, ", ".join(lora.targets),
                 f"{trainable:,}", f"{total:,}", 100 * trainable / total)
    return policy, ref.directory


def _reference_model(config: LearnerConfig, seed: int, distributed):
    """The reference KL's frozen policy: the starting checkpoint (``--model``, also when resuming), sharded as the
    policy; None without ``kl_coef`` or with LoRA (whose reference is the base, adapters off)."""
    if config.loss.kl_coef <= 0 or config.lora.enabled:
        return None
    from forge.checkpoints import load_model
    from forge.learner.parallel import shard_model
    from forge.learner.reference import frozen

    reference, _ = load_model(config.model, seed=seed, impl=config.model_impl)
    return shard_model(frozen(reference).to(distributed.device), distributed)


def check_lora_resume(adapter_dir: Path, lora, model: str) -> None:
    """UsageError unless the checkpoint in ``adapter_dir``'s parent can be resumed with ``lora`` on ``model``."""
    import json

    from forge.learner.lora import ADAPTER_CONFIG

    has_adapter = (adapter_dir / ADAPTER_CONFIG).exists()
    where = adapter_dir.parent
    if has_adapter and not lora.enabled:
        raise click.UsageError(f"{where} was written by a LoRA run: resume it with its --lora-rank, or start a new "
                               f"--run-dir from its merged model ({where / 'model'})")
    if lora.enabled and not has_adapter:
        raise click.UsageError(f"{where} was written by full fine-tuning: resume it without --lora-rank, or train "
                               f"adapters on it in a new --run-dir with --model {where / 'model'}")
    if has_adapter:
        saved = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
        if saved.get("base_model_name_or_path") != model or saved.get("r") != lora.rank:
            raise click.UsageError(f"{where}'s adapter is rank {saved.get('r')} on "
                                   f"{saved.get('base_model_name_or_path')}; this run asks rank {lora.rank} on "
                                   f"{model}: give the same, or start a new --run-dir")


def _curve_keys(config: LearnerConfig):
    """The weight channel's CURVE keys, read before anything heavy (the settings checked them already: this read
    is the one used, so a file changed since is refused too)."""
    if config.weights_key is None or config.weights_clients is None or not config.publish:
        return None
    from forge.weights.curve import KeyFileError, server_keys

    try:
        return server_keys(config.weights_key, config.weights_clients)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="'--weights-key'") from None


def _report_lost_step(exc: BaseException, trainer, checkpointer, distributed) -> None:
    """Say why a data-parallel step failed and where the job resumes; every rank of the job stops (torchrun ends the
    others), nothing of the failed step was committed."""
    restored = checkpointer.latest()
    where = f"the checkpoint of step {restored.state['step']} ({restored.path})" if restored else "the start"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    log.error("learner rank %d of %d: step %d failed: %s. With several ranks one failure stops them all (a rank or "
              "node that died, or a collective silent for --collective-timeout-s); start the job again and every "
              "node resumes from %s: the pool cursor is committed only with a checkpoint, so no entry is skipped or "
              "trained twice", distributed.rank, distributed.world_size, trainer.state.step + 1, reason, where)
    log.warning("where step %d failed on rank %d (a dead peer's error, or the cause itself)",
                trainer.state.step + 1, distributed.rank, exc_info=exc)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set: the learner stops after its current step, with a checkpoint."""
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s: stopping after this step", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    return stop


def _open_tracking(config: LearnerConfig, source_dir: Path):
    """Rank 0's sample table (RUN_DIR/samples.jsonl; None with --sample-table-every 0) and the experiment trackers
    ``--tracker`` names, which log every step's metrics, the sample tables and the settings from here (None: no
    trackers)."""
    from forge.learner.sample_table import SampleLog, tokenizer_decoder
    from forge.tracking import open_trackers, settings_json

    tracking = config.tracking
    trackers = open_trackers(tracking, config.run_dir, {"learner": settings_json(config)}) \
        if tracking.trackers else None
    if not tracking.sample_every:
        return None, trackers
    decode, parser = tokenizer_decoder(source_dir)
    on_rows = (lambda step, rows: trackers.log_table(step, "samples", rows)) if trackers else None
    return SampleLog(config.run_dir / "samples.jsonl", tracking.sample_every, tracking.sample_size, decode, parser,
                     on_rows), trackers


def _serve_stats(config: LearnerConfig, trainer, publisher):
    """Rank 0's part: serve Stats (and metrics), publish the current version for the actors to start from, and
    announce the learner in its ready file. Returns (server, metrics server)."""
    from forge.learner.servicer import LearnerServicer, serve_learner
    from forge.rpc import ServerOptions

    servicer = LearnerServicer(lambda: trainer.last, labels={"run_dir": str(config.run_dir)})
    server = serve_learner(servicer, ServerOptions(host=config.host, port=config.port))
    prometheus = start_metrics(servicer.report, config.host, config.metrics_port, on_failure=lambda: server.stop(0))
    if publisher is not None:                 # actors start from the learner's current version
        publisher.publish(trainer.state.version, trainer.published())
        trainer.checkpointer.record_published(trainer.state.version)
    if config.ready_file:
        write_ready_file(config.ready_file, address=server.address,
                         weights_fetch=publisher.fetch_endpoint if publisher else None,
                         weights_announce=publisher.announce_endpoint if publisher else None,
                         step=trainer.state.step, version=trainer.state.version,
                         **({"metrics_url": prometheus.url} if prometheus else {}))
    log.info("learner ready: stats on %s, %s", server.address,
             f"weights on {publisher.fetch_endpoint}" if publisher else "not publishing")
    return server, prometheus


def _check_teacher(config: LearnerConfig) -> None:
    """Refuse, in one line, a teacher whose tokenizer is not the student's (it scores the student's token ids)."""
    if config.teacher is None:
        return
    from forge.learner.distill import check_same_tokenizer

    try:
        check_same_tokenizer(config.model, config.teacher)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--teacher'") from None


def _distillation(config: LearnerConfig, is_main: bool):
    """On-policy distillation's part of the trainer (None without --teacher); rank 0 asks the teacher's actors."""
    if config.teacher is None:
        return None
    from forge.learner.distill import Distillation, TeacherScorer

    scorer = TeacherScorer(config.teacher_actors, config.teacher_api_key, config.teacher_requests) if is_main \
        else None
    return Distillation(config.distill_weight, scorer)


def _check_loss_function(config: LearnerConfig) -> None:
    """A team's own loss (``--loss-function``, relative to the run file's folder, else the current directory), run
    on a dry batch before anything starts: refused in one line when it fails."""
    if config.loss.function is None:
        return
    from forge.learner.losses import check_loss_function
    from forge.loading import PluginError

    run_file = click.get_current_context().meta.get(RUN_FILE)
    try:
        check_loss_function(config.loss.function, Path(run_file).resolve().parent if run_file else Path.cwd())
    except PluginError as exc:
        raise click.BadParameter(str(exc), param_hint="'--loss-function'") from None


@settings_command("learner", LearnerConfig, shared_tables=("tracking",))
def learner(config: LearnerConfig) -> None:
    """Train the policy with CISPO (or PPO-clip, GRPO, GSPO, DAPO, Dr. GRPO, a team's own loss) on windowed-FIFO
    batches from the pool, checkpoint with the pool cursor (a restart neither skips nor repeats entries), co-train
    the MTP draft, and publish every new weight version over ZeroMQ. Progress goes to stdout, metrics to RUN_DIR/metrics.jsonl (and to the experiment
    trackers --tracker names); SIGTERM stops after the current step with a checkpoint."""
    if config.pool_path is not None and not config.create_pool and not (config.pool_path / "data.mdb").exists():
        raise click.BadParameter(f"{config.pool_path} holds no pool (no data.mdb): check the path, or give "
                                 f"--create-pool to start a new pool there", param_hint="'--pool'")
    if config.planned_processes > 1 and not variables.is_set("WORLD_SIZE"):
        _run_under_torchrun(config)
    setup_logging(config.log_level)
    if variables.read("RANK") in (None, "0"):      # rank 0 serves Stats and metrics
        check_port_option(config.host, config.port, "--port")
        check_port_option(config.host, config.metrics_port, "--metrics-port")
    _check_loss_function(config)
    _check_teacher(config)
    curve = _curve_keys(config)
    import torch

    from forge.learner.checkpoint import Checkpointer
    from forge.learner.metrics import MetricsWriter, scalars, summary
    from forge.learner.parallel import check_shared_run_dir, init_distributed, shard_model
    from forge.learner.trainer import Trainer
    from forge.sampling.grammar import Grammars

    distributed = init_distributed(config.device, timeout_s=config.collective_timeout_s)
    check_shared_run_dir(config.run_dir, distributed)
    seed = config.trainer.seed
    torch.manual_seed(seed)
    checkpointer = Checkpointer(config.run_dir / "checkpoints", keep=config.keep_checkpoints)
    restored = checkpointer.latest() if config.resume else None
    policy, source_dir = _initial_model(config, restored, seed)
    checkpointer.tokenizer_dir = source_dir
    grammars = Grammars(source_dir, policy.config.vocab_size, tuple(policy.config.eos_token_ids))
    policy = shard_model(policy.to(distributed.device), distributed)
    reference = _reference_model(config, seed, distributed)
    pool = _open_pool(config) if distributed.is_main else None
    publisher = metrics = server = prometheus = sample_log = trackers = None
    if distributed.is_main:
        sample_log, trackers = _open_tracking(config, source_dir)
        if config.publish:
            from forge.weights import WeightPublisher

            publisher = WeightPublisher(config.weights_fetch, config.weights_announce, curve=curve)
        metrics = MetricsWriter(config.run_dir / "metrics.jsonl")
    trainer = Trainer(policy, distributed, config=config.trainer, loss=config.loss, rewards=config.reward,
                      window=config.window, pool=pool, checkpointer=checkpointer, publisher=publisher,
                      metrics=metrics, grammars=grammars, lora=config.lora if config.lora.enabled else None,
                      base_model=config.model, sample_log=sample_log, reference=reference,
                      distillation=_distillation(config, distributed.is_main))
    if restored is not None:
        trainer.restore()
    # Only now does a stop wait for the current step: until here the default action ends the rank at once, also
    # where it blocks in C (a rendezvous or process group whose peer died before it joined).
    stop = _stop_on_signals()

    if distributed.is_main:
        server, prometheus = _serve_stats(config, trainer, publisher)
    elif config.publish:
        trainer.published()                     # rank 0 gathers the initial version for publishing

    def on_step(record: dict) -> None:
        if distributed.is_main:
            click.echo(summary(record))
            if trackers is not None:
                trackers.log_metrics(record["step"], scalars(record))

    failed = False
    try:
        trainer.run(stop.is_set, on_step)
        if trainer.state.step and trainer.state.step % config.trainer.checkpoint_every:
            trainer.save_checkpoint()
    except Exception as exc:
        if not distributed.enabled:
            raise
        failed = True
        _report_lost_step(exc, trainer, checkpointer, distributed)
    finally:
        if prometheus is not None:
            prometheus.close()
        if server is not None:
            server.stop(1)
        if publisher is not None:
            publisher.close()
        if metrics is not None:
            metrics.close()
        if trackers is not None:
            trackers.close()
        if pool is not None:
            pool.close()
        if trainer.distillation is not None:
            trainer.distillation.close()
        distributed.close(failed=failed)
    if failed:
        sys.exit(1)
    log.info("learner stopped at step %d (version %d)", trainer.state.step, trainer.state.version)


main = entry_point(learner, "learner")
