"""The cluster suite's Slurm cluster: ``tools/slurm_cluster.sh up`` once for the session (munge, slurmctld and two
slurmd nodes on loopback, Debian's packages installed when missing), ``down`` after it, every daemon checked gone."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import warnings
from pathlib import Path

import pytest

from conftest import REPO

CLUSTER = REPO / "tools" / "slurm_cluster.sh"


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports free now (slurmctld's, then each node's)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as held:
                    held.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports")


class Cluster:
    """The running cluster: its client environment and the script's commands."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.env = {**os.environ, "FORGE_SLURM_DIR": str(directory), "FORGE_SLURM_PORT": str(_free_ports(3)),
                    "SLURM_CONF": str(directory / "slurm.conf")}

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLUSTER), *args], env=self.env, capture_output=True, text=True, timeout=900)

    def up(self) -> None:
        done = self.run("up")
        assert done.returncode == 0, done.stdout + done.stderr

    def daemon_pids(self) -> list[int]:
        """The pids the cluster's pid files name that are alive."""
        alive = []
        for pid_file in self.directory.glob("*.pid"):
            text = pid_file.read_text().strip()
            if text.isdigit() and Path(f"/proc/{text}").exists():
                alive.append(int(text))
        return alive

    def slurm(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        """A Slurm client command (sbatch, scontrol, scancel, ...) against this cluster (with ``env``: in that
        environment, which sbatch passes on to the job); its stdout."""
        done = subprocess.run(list(args), env=env or self.env, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout


RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
# The fixed ports a deployed job listens on (forge.app.deploy.config, forge.weights.endpoints, a second service of a
# kind on a node adding 10): inside the kernel's ephemeral range, where any outgoing connection of this machine (a
# package download beside the suite, a fetch over loopback) may hold one when a service starts.
DEPLOY_PORTS = "5701-5706,8000-8010,29500,50051-50070"


@contextlib.contextmanager
def _ephemeral_ports_kept_off(ports: str):
    """Keep ``ports`` out of the kernel's ephemeral range while the suite runs (as a cluster's administrator would
    for Forge's nodes); restored after. Where the setting cannot be written, the suite runs without it."""
    try:
        before = RESERVED_PORTS.read_text().strip()
        RESERVED_PORTS.write_text(",".join(p for p in (before, ports) if p) + "\n")
    except OSError as exc:
        warnings.warn(f"cannot reserve the deployed services' ports ({exc}): a port in use may fail a job", stacklevel=1)
        yield
        return
    try:
        yield
    finally:
        RESERVED_PORTS.write_text(before + "\n")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Cluster:
    if os.geteuid() != 0:
        pytest.skip("the Slurm daemons run as root here (make test-cluster, as CI does)")
    with _ephemeral_ports_kept_off(DEPLOY_PORTS):
        started = Cluster(tmp_path_factory.mktemp("slurm"))
        started.up()
        yield started
        done = started.run("down")
        assert done.returncode == 0, done.stdout + done.stderr
        assert started.daemon_pids() == []
