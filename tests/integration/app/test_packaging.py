"""Packaging: everything installs under the single namespace ``forge``, and every console script answers --help."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import REPO, script

SERVICE_SCRIPTS = ("forge-learner", "forge-actor", "forge-gateway", "forge-cache")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The wheel, and what building it printed (pip's and setuptools' output, not quietened)."""
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w",
                             str(out), str(REPO)], check=True, capture_output=True, text=True)
    (path,) = out.glob("forge_rl-*.whl")
    return zipfile.ZipFile(path), result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(built):
    return built[0]


def test_building_the_package_warns_of_nothing(built):
    """Every directory of data is declared (setuptools warns of one it would ignore otherwise)."""
    printed = built[1]
    assert "running bdist_wheel" in printed                          # the build's own output was seen
    assert "would be ignored" not in printed and "absent from the `packages` configuration" not in printed


def test_wheel_installs_only_under_forge(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"forge", next(t for t in tops if t.endswith(".dist-info"))}


def test_wheel_holds_every_source_file_and_the_assets(wheel):
    names = set(wheel.namelist())
    for folder, package in (("learner", "learner"), ("actors", "actors"), ("gateway", "gateway"), ("cache", "cache"),
                            ("protos/forge/v1", "v1"), ("forge", "")):
        for source in (REPO / folder).rglob("*.py"):
            relative = source.relative_to(REPO / folder).as_posix()
            if "__pycache__" in relative or (folder == "forge" and relative.startswith(("v1/",))):
                continue
            expected = "/".join(p for p in ("forge", package, relative) if p)
            assert expected in names, f"{source} is not packaged (add its package to pyproject.toml)"
    for asset in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert f"forge/assets/tiny/{asset}" in names
    assert "forge/v1/actor.proto" in names
    assert "forge/actors/engine/csrc/paged_attention.c" in names          # built on first use
    for asset in ("index.html", "login.html", "dash.js", "dash.css", "favicon.svg"):
        assert f"forge/app/dash/static/{asset}" in names                    # forge dash's page
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = wheel.read(entry_points).decode()
    for name in ("forge", *SERVICE_SCRIPTS):
        assert f"{name} = " in text


@pytest.mark.parametrize("name", ["forge", *SERVICE_SCRIPTS])
def test_console_scripts_answer_help(name):
    result = subprocess.run([script(name), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


@pytest.mark.parametrize("command", ["up", "learner", "actor", "gateway", "cache", "top", "model", "model info",
                                     "model init", "model generate", "model eval", "pool", "pool stats", "pool show",
                                     "pool entries", "pool export", "pool serve", "plot", "dash"])
def test_every_forge_subcommand_answers_help(command):
    result = subprocess.run([script("forge"), *command.split(), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout and len(result.stdout.splitlines()) > 3
