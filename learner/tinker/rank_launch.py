"""``forge-tinker --nproc N`` as N processes: the command relaunches itself under torchrun on this machine
(``--standalone``; the learner's ``TorchrunJob``, so that a stop signal reaches the ranks, not torchrun's agent), and
each rank joins the job here: rank 0 gets the ``RankedTraining`` the server is composed of, every other rank follows
rank 0's operations until it is told to stop, then exits (see ``forge.learner.tinker.ranks``).

A rank that dies ends the job: torchrun stops the others, and rank 0, whose next collective fails at once (or after
``--collective-timeout-s`` for a silent rank), stops the server with the reason in its log and a failed status."""

from __future__ import annotations

import logging
import os
import signal
import sys

import click

from forge.cli.options import envvars_of, given_args
from forge.learner.tinker.config import TinkerConfig
from forge.learner.tinker.ranks import RankedTraining, RankTraining, first_line, follow, ignore_stop_signals
from forge.settings import entries

log = logging.getLogger("forge.tinker")


def torchrun_command(args: tuple[str, ...], nproc: int) -> list[str]:
    """``forge-tinker ARGS`` as ``nproc`` ranks under torchrun; the ranks read ``--nproc`` from their environment
    (torchrun's own parser would take it as its ``--nproc-per-node``)."""
    from forge.learner.launch import without_nproc

    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--signals-to-handle=SIGHUP,SIGQUIT", "-m", "forge.learner.tinker", *without_nproc(args)]


def run_under_torchrun(config: TinkerConfig) -> None:
    """Run this command's ranks and exit with the job's status."""
    from forge.learner.launch import TorchrunJob

    nproc = next(entry for entry in entries(TinkerConfig) if entry.name == "nproc")
    environment = {envvars_of(nproc, "tinker")[0]: str(config.nproc)}
    command = torchrun_command(given_args(click.get_current_context()), config.nproc)
    log.info("starting %d training ranks under torchrun", config.nproc)
    sys.exit(TorchrunJob(command, environment).run())


def open_ranks(config: TinkerConfig, dtype: str) -> RankedTraining:
    """Join the job (each rank on its own GPU, or the CPU) and train in ``dtype``: rank 0 returns its
    ``RankedTraining``; any other rank follows rank 0 and exits here."""
    from forge.learner.parallel import init_distributed

    distributed = init_distributed(config.device, timeout_s=config.collective_timeout_s)
    training = RankTraining(config.run_dir, distributed, device=str(distributed.device), dtype=dtype,
                            token_budget=config.token_budget)
    if distributed.is_main:
        log.info("rank 0 of %d: serving the API; training on %s", distributed.world_size, distributed.device)
        return RankedTraining(training, on_failure=lambda reason: os.kill(os.getpid(), signal.SIGTERM))
    ignore_stop_signals(distributed.rank)
    try:
        follow(training)
    except Exception as exc:
        log.error("training rank %d of %d stops: %s (rank 0 or another rank is gone or silent)", distributed.rank,
                  distributed.world_size, first_line(exc))
        distributed.close(failed=True)
        sys.exit(1)
    distributed.close()
    sys.exit(0)


def close_ranks(training: RankedTraining) -> None:
    """After the server stopped: the other ranks stop too; a failed status when the ranks had failed."""
    training.close()
    if training.failure is not None:
        raise click.ClickException(training.failure)
