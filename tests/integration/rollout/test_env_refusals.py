"""Environments Forge cannot play, refused by ``forge up`` before anything starts: a verifiers environment that
cannot be made (its loader raises, runs in a hosted runtime, is missing, takes other arguments, holds one task to
split), an OpenEnv class or server Forge cannot play, an environment beside the team's own tasks; and the examples'
environments loaded as ``forge up`` loads them. Each refusal is a ``forge up`` command that starts no service, so
these run beside the other tests, not in the serial group of whole runs; the module's refusals run one after another
in one process (``short_runs.forge_ups_refused``), which imports verifiers and OpenEnv once, not once per refusal."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import short_runs

VF_ENVS = Path(__file__).parent / "vf_envs"
OE_ENVS = Path(__file__).parent / "openenv_envs"


VERIFIERS_REFUSED = [
    (f'verifiers = "{VF_ENVS / "envs.py"}:broken"', "RuntimeError: the dataset is missing"),
    (f'verifiers = "{VF_ENVS / "envs.py"}:hosted"', "runs in a 'docker' runtime"),
    (f'verifiers = "{VF_ENVS / "envs.py"}:nothing"', "has no attribute 'nothing'"),
    (f'verifiers = "{VF_ENVS / "envs.py"}:single_turn"\nargs = {{ colour = "red" }}', "unexpected keyword argument"),
    ('verifiers = "no_such_taskset_module"', "taskset 'no_such_taskset_module' not found"),
    (f'verifiers = "{VF_ENVS / "envs.py"}:single_turn"\nargs = {{ num_examples = 1 }}\neval_fraction = 0.5',
     "one task cannot be split"),
]
OPENENV_REFUSED = [
    (f'openenv = "{OE_ENVS / "oe_envs.py"}:Reply"', "is not a subclass of openenv's Environment"),
    (f'openenv = "{OE_ENVS / "oe_envs.py"}:TwoFieldEnvironment"', "its action has the fields ['confidence', 'text']"),
    (f'openenv = "{OE_ENVS / "missing.py"}:Env"', "does not exist"),
    ('openenv_url = "http://127.0.0.1:1"', "its server cannot be reached"),
    ('openenv_url = "127.0.0.1:8000"', "must be an http:// or https:// URL"),
    (f'openenv = "{OE_ENVS / "oe_envs.py"}:QAEnvironment"\nverifiers = "x.py:f"', "give one environment"),
]
BESIDE_TASKS = (f'verifiers = "{VF_ENVS / "envs.py"}:single_turn"\n\n[tasks]\ntrain = "tasks.jsonl"\n'
                'verifier = "verify.py:score"')


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Each [env] table the tests give ``forge up``: the folder it ran in (its run directory would be run/ there) and
    how it ended."""
    tables = [env for env, _ in VERIFIERS_REFUSED + OPENENV_REFUSED] + [BESIDE_TASKS]
    folders = [tmp_path_factory.mktemp("refused") for _ in tables]
    results = short_runs.forge_ups_refused([(folder, f"[env]\n{env}\n") for folder, env in zip(folders, tables,
                                                                                               strict=True)])
    return {env: (folder, result) for env, folder, result in zip(tables, folders, results, strict=True)}


@pytest.mark.parametrize(("env", "message"), VERIFIERS_REFUSED)
def test_a_verifiers_environment_that_cannot_be_made_is_refused_before_anything_starts(refused, env, message):
    folder, result = refused[env]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stderr, result.stderr
    assert not (folder / "run").exists(), "nothing was started"


def test_an_environment_and_the_teams_own_tasks_do_not_mix(refused):
    _, result = refused[BESIDE_TASKS]
    assert result.returncode == 2 and "give [env] or [tasks]" in result.stderr, result.stderr


def test_the_verifiers_example_loads_and_holds_out_its_share(monkeypatch):
    import os
    import sys
    import tomllib

    from forge.rollout.config import EnvConfig
    from forge.rollout.team import Team

    monkeypatch.setattr(sys, "path", [*sys.path])                     # the example's folder goes on both
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    example = Path(__file__).parents[3] / "examples" / "verifiers"
    table = tomllib.loads((example / "run.toml").read_text())["env"]
    team = Team.load_env(EnvConfig(**table), example)
    assert len(team.tasks.train) == 180 and len(team.tasks.eval) == 20
    assert {t["domain"] for t in team.tasks.train} == {"arith"}
    assert not {t["id"] for t in team.tasks.train} & {t["id"] for t in team.tasks.eval}


def test_a_harness_that_runs_commands_on_this_host_is_said_at_start(monkeypatch):
    import os
    import sys

    from forge.rollout.verifiers_env import VerifiersEnvironment

    monkeypatch.setattr(sys, "path", [*sys.path])
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    plain = VerifiersEnvironment.load("vftest_tool", {}, VF_ENVS)           # a taskset alone: verifiers' bash harness
    assert "harness bash" in plain.describe() and "outside any sandbox" in plain.describe()
    assert "outside any sandbox" not in VerifiersEnvironment.load("envs.py:single_turn", {}, VF_ENVS).describe()


@pytest.mark.parametrize(("env", "message"), OPENENV_REFUSED)
def test_an_openenv_environment_forge_cannot_play_is_refused_before_anything_starts(refused, env, message):
    folder, result = refused[env]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stderr, result.stderr
    assert not (folder / "run").exists(), "nothing was started"


def test_the_openenv_example_loads_and_holds_out_its_share():
    import tomllib

    from forge.rollout.config import EnvConfig
    from forge.rollout.team import Team

    example = Path(__file__).parents[3] / "examples" / "openenv"
    table = tomllib.loads((example / "run.toml").read_text())["env"]
    team = Team.load_env(EnvConfig(**table), example)
    assert team.environment.interface.text_field == "text" and team.environment.interface.name == "GuessEnvironment"
    assert len(team.tasks.train) + len(team.tasks.eval) == 256 and len(team.tasks.eval) == 26
