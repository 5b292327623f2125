"""Shared by both trees (unit/ and integration/): free loopback ports, the venv's console scripts, the repository
root and the helpers' folder; and the process fixtures several integration modules use: a cache server, a random
actor and a gateway stack."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HELPERS = REPO / "tests" / "helpers"        # helpers/*.py: imported as helpers.NAME, some run as programs
BIN = Path(sys.executable).parent
# The runs that must not run beside many others (forge up, several hosts' services, torchrun jobs), each module marked
# xdist_group("serial"): on a loaded machine several of them side by side could run past their timeouts, so they run
# in two lanes, the modules of a lane one after another on one worker (see pytest_xdist_make_scheduler), at most two
# at a time. The lanes hold about the same work, so that neither worker waits on the other at the end.
SERIAL_LANES = (
    frozenset({"tests/integration/app/test_e2e.py", "tests/integration/rollout/test_openenv_env.py",
               "tests/integration/app/test_up_hub_model.py", "tests/integration/learner/test_tinker_ranks.py",
               "tests/integration/rollout/test_mcp_agent.py", "tests/integration/rollout/test_long_tasks.py"}),
    frozenset({"tests/integration/app/test_team_run.py", "tests/integration/rollout/test_verifiers_env.py",
               "tests/integration/learner/test_learner_launch.py", "tests/integration/app/test_multihost.py",
               "tests/integration/learner/test_multinode_learner.py"}),
)
SERIAL_LANE = {module: f"serial-{n}" for n, lane in enumerate(SERIAL_LANES) for module in lane}   # the unit of work
SERIAL = frozenset(SERIAL_LANE)
# The heavy suite (`make test-heavy`, which .ci/run runs too): the serial runs and the other long multi-process and
# long-context modules. Its tests are marked `heavy`; `make test` (the README's command) leaves them out.
HEAVY = SERIAL | frozenset({
    "tests/integration/learner/test_learner.py",            # FSDP2 over two processes, per family; kill and restart
    "tests/integration/learner/test_context_parallel.py",   # context-parallel ranks as processes
    "tests/integration/actors/test_long_context.py",        # a 64k-token prompt beside a decoding session
    "tests/integration/gateway/test_long_session_step.py",  # a learner step on a 64k-token session
    "tests/integration/cache/test_cache_long_prompt.py",    # long prompts through the L3 cache
    "tests/integration/actors/test_disaggregated.py",       # prefill and decode actors against a both actor
    "tests/integration/gateway/test_gateway_disaggregated.py",
    "tests/integration/gateway/test_gateway_discovery.py",  # actors joining, killed and restarted
    "tests/integration/actors/test_adapter_runs.py",        # two runs' learners sharing one actor
    "tests/integration/rollout/test_code_example.py",       # a sandboxed team run
    "tests/integration/gateway/test_gateway_grpc.py",       # incl. hundreds of open streams through one gateway
    "tests/integration/app/test_model_check.py",            # the engine and the learner on each family checked
    "tests/integration/app/test_model_fetch.py",            # Hub models through a stand-in Hub, each command a process
    "tests/integration/rollout/test_dataset_hub.py",        # a Hub dataset through a stand-in Hub, then offline
    "tests/integration/rollout/test_env_refusals.py",       # forge up refusing environments, a process each
    "tests/integration/core/test_tracking_mlflow.py",       # forge-learner against a real MLflow server, killed too
    "tests/integration/app/test_distill_up.py",             # a forge up run distilling from a teacher's actor
})


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the system picks it: tests never share a fixed port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def script(name: str) -> str:
    """Path of a console script installed beside the running interpreter."""
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"console script {name} is not installed (pip install -e '.[dev]')")
    return found


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory):
    """A ``forge-cache`` process for a module's tests, started once and stopped after them."""
    from helpers.processes import start_cache

    proc = start_cache(tmp_path_factory.mktemp("cache"), "cache")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tiny_actor(tmp_path_factory):
    """A ``forge-actor`` serving a random-weight tiny model, for a module's tests (started once, stopped after)."""
    from helpers.gateway_procs import random_actor

    proc = random_actor(tmp_path_factory.mktemp("actor"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory):
    """A ``forge-actor`` serving a random-weight tiny model and a ``forge-gateway`` in front of it, started once for a
    module's tests and stopped after them (a ``helpers.gateway_procs.Stack``). The module parameterises them:
    ``GATEWAY_ARGS``, the gateway's options (``{checkpoint}`` stands for the actor's checkpoint folder), and
    ``prepare_checkpoint(folder)``, run on that folder before the gateway reads it."""
    from helpers.gateway_procs import gateway_stack

    module = request.module
    directory = tmp_path_factory.mktemp(module.__name__.rpartition(".")[2])
    with gateway_stack(directory, getattr(module, "GATEWAY_ARGS", ()),
                       getattr(module, "prepare_checkpoint", None)) as started:
        yield started


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _bwrap() -> str | None:
    """Why sandboxes cannot run here, or None."""
    from forge.rollout.sandbox import find_bwrap

    try:
        find_bwrap()
    except RuntimeError as exc:
        return str(exc)
    return None


@pytest.hookimpl(tryfirst=True)         # before -m selects on the heavy mark
def pytest_collection_modifyitems(config, items) -> None:
    """Tests of the HEAVY modules are marked heavy; tests marked gpu, trtllm, vllm, agents, tinker or sandbox are
    skipped (and say why) where the hardware, backend or isolation tool is absent; a module marked
    xdist_group("serial") must be one of SERIAL, and the other way round."""
    import torch

    absent = {
        "gpu": None if torch.cuda.is_available() else "no CUDA GPU on this machine",
        "trtllm": None if _importable("tensorrt_llm") else "TensorRT-LLM is not installed (GPU extra)",
        "vllm": None if _importable("vllm") else "vLLM is not installed (make test-vllm runs these)",
        "agents": None if os.environ.get("FORGE_AGENTS_PYTHON") else "the agent frameworks' environment is not "
                                                                     "given (make test-agents runs these)",
        "tinker": None if os.environ.get("FORGE_TINKER_PYTHON") else "the Tinker SDK's environment is not given "
                                                                     "(make test-tinker runs these)",
        "sandbox": _bwrap(),
    }
    for item in items:
        for marker, reason in absent.items():
            if reason and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))
        if _module(item.nodeid) in HEAVY:
            item.add_marker(pytest.mark.heavy)
        serial = any("serial" in (*mark.args, mark.kwargs.get("name")) for mark in item.iter_markers("xdist_group"))
        if serial != (_module(item.nodeid) in SERIAL):
            raise pytest.UsageError(f"{item.nodeid}: mark its module xdist_group(\"serial\") and list it in SERIAL "
                                    "(tests/conftest.py), or neither")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class _SerialFirst(OrderedDict):
    """A work queue whose serial lanes come first: the longest units of work start at once."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if key in SERIAL_LANE.values():
            self.move_to_end(key, last=False)


@pytest.hookimpl(tryfirst=True)         # before pytest-xdist turns -n N into --dist load
def pytest_cmdline_main(config) -> None:
    """``-n N`` without ``--dist`` distributes as ``--dist loadgroup`` (see pytest_xdist_make_scheduler)."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "no":
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` as make test runs it: each test module is one unit of work, run on one worker (its
    module-scoped fixtures, servers among them, start once), and each lane of SERIAL modules is one unit, its modules
    run one after another on one worker, the lanes first. (pytest-xdist 3.8 cannot read xdist_group marks under
    pytest 9.2, so the scheduler groups by module path: https://github.com/pytest-dev/pytest-xdist/issues/1386.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            self.workqueue = _SerialFirst()

        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return SERIAL_LANE.get(module, module)

    return ModuleGroups(config, log)
