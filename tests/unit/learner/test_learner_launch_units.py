"""How forge-learner relaunches itself under torchrun for several processes, without starting any: the command
torchrun's own parser must take whatever learner options it carries, the settings every rank builds (this command's,
--nproc from the environment), the same from ``forge-learner`` and ``forge learner``, and the check of
--context-parallel against the world torchrun launched (WORLD_SIZE). The launches themselves:
integration/test_learner_launch.py."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from torch.distributed.run import get_args_parser

from forge.app.main import forge
from forge.cli.options import sources
from forge.learner import launch
from forge.learner.cli import _rank_environment, _torchrun_command, learner
from forge.learner.config import LearnerConfig
from forge.settings import SettingsError, build

MULTI_NODE = ("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.1:29400")


def every_option() -> list[str]:
    """Every option of forge-learner but --nproc, with a value (a switch alone, in both forms)."""
    words = []
    for param in learner.params:
        if isinstance(param, click.Option) and param.name != "nproc":
            words += [*param.opts, *param.secondary_opts] if param.is_flag else [param.opts[0], "1"]
    return words


def settings(args: list[str]) -> LearnerConfig:
    values, _ = sources(learner, args)
    return learner.settings_from(values)


@pytest.mark.parametrize("placement", [(), MULTI_NODE], ids=["one-node", "two-nodes"])
def test_torchrun_takes_every_learner_option_after_the_module(placement):
    """torchrun's parser reads the words after ``-m forge.learner`` as options of its own where they abbreviate
    one of them: --nproc (of --nproc-per-node) would stop it; the ranks get it from the environment."""
    args = [*placement, "--nproc", "2", *every_option(), "--nproc=2"]
    command = _torchrun_command(settings(["--pool", "p", "--nproc", "2", *placement]), tuple(args))
    assert command[1:3] == ["-m", "torch.distributed.run"]
    parsed = get_args_parser().parse_args(command[3:])
    assert (parsed.module, parsed.training_script, parsed.nproc_per_node) == (True, "forge.learner", "2")
    assert parsed.training_script_args == [*placement, *every_option()]


def test_every_rank_builds_the_commands_settings(tmp_path, monkeypatch):
    """The ranks' arguments (this command's less --nproc) and environment give the settings this command has,
    --nproc from a run file included (the variable is above the file, below the command line)."""
    run_file = tmp_path / "run.toml"
    run_file.write_text("[learner]\nnproc = 4\ncontext_parallel = 2\n")
    for args in (["--pool", "p", "--nproc", "2", "--context-parallel", "2", "--lr", "1e-3"],
                 ["--pool", "p", "--config", str(run_file), "--nproc=2"], ["--config", str(run_file), "--pool", "p"]):
        launcher = settings(args)
        command = _torchrun_command(launcher, tuple(args))
        rank_args = command[command.index("forge.learner") + 1:]
        monkeypatch.setenv("WORLD_SIZE", str(launcher.nproc))
        for name, value in _rank_environment(launcher).items():
            monkeypatch.setenv(name, value)
        assert settings(rank_args) == launcher
        monkeypatch.delenv("WORLD_SIZE")
    assert _rank_environment(settings(["--pool", "p", "--nproc", "3"])) == {"FORGE_LEARNER_NPROC": "3"}


@pytest.mark.parametrize("program", [("learner",), ()], ids=["forge learner", "forge-learner"])
def test_both_programs_give_the_ranks_the_learners_own_arguments(tmp_path, monkeypatch, program):
    started = []

    class Job:
        def __init__(self, command: list[str], env: dict[str, str]) -> None:
            started.append((command, env))

        def run(self) -> int:
            return 0

    monkeypatch.setattr(launch, "TorchrunJob", Job)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = ["--pool", str(tmp_path / "pool"), "--create-pool", "--nproc", "2", "--context-parallel", "2"]
    result = CliRunner().invoke(forge if program else learner, [*program, *args])
    assert result.exit_code == 0, result.output
    [(command, env)] = started
    assert command[command.index("forge.learner") + 1:] == [*args[:3], "--context-parallel", "2"]
    assert env == {"FORGE_LEARNER_NPROC": "2"}


def build_learner(**values) -> LearnerConfig:
    return build(LearnerConfig, {"pool": Path("p"), **values})


def test_context_parallel_is_checked_against_the_world_torchrun_launched(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SettingsError, match=r"must divide the job's 2 processes \(--nproc 2 x --nnodes 1\)"):
        build_learner(nproc=2, context_parallel=4)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert build_learner(nproc=2, nnodes=2, rdzv_endpoint="h:1", context_parallel=4).trainer.context_parallel == 4
    assert build_learner(context_parallel=4).trainer.context_parallel == 4       # torchrun started by hand
    with pytest.raises(SettingsError, match=r"--nproc 2 x --nnodes 1 asks for 2 processes, but torchrun launched 4"):
        build_learner(nproc=2, context_parallel=2)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SettingsError, match=r"must divide the job's 3 processes launched by torchrun \(WORLD_SIZE\)"):
        build_learner(context_parallel=2)
