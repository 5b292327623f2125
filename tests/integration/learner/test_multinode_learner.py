"""The learner as a two-node torchrun job on one machine, each node on its own loopback address (127.0.0.2 and
127.0.0.3): it trains every pool entry exactly once across a rank that dies and a restart of the job, and it refuses
a run directory that its nodes do not share."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from forge.learner.checkpoint import Checkpointer
from forge.reaper import child_pids

from conftest import free_port, script
from helpers.learner_runs import lineage, write_model_and_pool
from helpers.waiting import wait_for

HOSTS = ("127.0.0.2", "127.0.0.3")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200),    # two torchrun jobs, restarted: minutes when loaded
              pytest.mark.xdist_group("serial")]  # one at a time (conftest.SERIAL)


def start_node(rank: int, pool: Path, run_dir: Path, model: Path, rendezvous: str, *extra: str) -> subprocess.Popen:
    """Node ``rank`` of a two-node learner job: one process on this node, its services on its own address."""
    return subprocess.Popen([script("forge-learner"), "--pool", str(pool), "--run-dir", str(run_dir), "--model",
                             str(model), "--no-publish", "--batch-groups", "2", "--window", "4", "--lr", "1e-3",
                             "--max-wait", "0.5", "--host", HOSTS[rank], "--nnodes", "2", "--node-rank", str(rank),
                             "--rdzv-endpoint", rendezvous, "--device", "cpu", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def ranks_of(node: subprocess.Popen) -> list[int]:
    """The node's learner ranks: forge-learner runs torchrun's agent, which runs the ranks."""
    return [rank for agent in child_pids(node.pid) for rank in child_pids(agent)]


@pytest.fixture
def filled_pool(tmp_path):
    write_model_and_pool(tmp_path, seed=1, groups=16)
    return tmp_path


def test_a_rank_that_dies_stops_the_job_and_a_restart_trains_every_entry_once(filled_pool):
    base = filled_pool
    run_dir, metrics = base / "run", base / "run" / "metrics.jsonl"
    args = (base / "pool", run_dir, base / "model")
    rendezvous = f"{HOSTS[0]}:{free_port(HOSTS[0])}"
    nodes = [start_node(rank, *args, rendezvous, "--checkpoint-every", "2", "--max-steps", "8") for rank in (0, 1)]
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "the job's third step", 300,
             watched=nodes)
    doomed = ranks_of(nodes[1])
    assert len(doomed) == 1
    os.kill(doomed[0], signal.SIGKILL)          # rank 1 dies; its node's torchrun agent and node 0 follow
    outputs = [n.communicate(timeout=300)[0] for n in nodes]
    assert nodes[0].returncode != 0 and nodes[1].returncode != 0, outputs
    assert "failed" in outputs[0] and "resumes from the checkpoint of step" in outputs[0], outputs[0][-3000:]

    rendezvous = f"{HOSTS[0]}:{free_port(HOSTS[0])}"
    nodes = [start_node(rank, *args, rendezvous, "--checkpoint-every", "2", "--max-steps", "8") for rank in (0, 1)]
    outputs = [n.communicate(timeout=600)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "resumed from" in outputs[0]
    steps = lineage(metrics)
    assert sorted(steps) == list(range(1, 9))
    trained = [p for step in sorted(steps) for p in steps[step]]
    assert sorted(trained) == list(range(16)), trained       # every entry once: none skipped, none trained twice


def test_nodes_that_do_not_share_the_run_directory_are_refused(filled_pool):
    base = filled_pool
    rendezvous = f"{HOSTS[0]}:{free_port(HOSTS[0])}"
    nodes = [start_node(rank, base / "pool", base / f"run-{rank}", base / "model", rendezvous, "--max-steps", "1")
             for rank in (0, 1)]
    outputs = [n.communicate(timeout=300)[0] for n in nodes]
    assert all(n.returncode != 0 for n in nodes)
    assert "is not shared by the learner's nodes" in outputs[0] + outputs[1]
    assert not (base / "run-0" / "metrics.jsonl").exists() or not (base / "run-0" / "metrics.jsonl").read_text()


def test_a_multi_node_learner_needs_its_rendezvous(tmp_path):
    done = subprocess.run([script("forge-learner"), "--pool", str(tmp_path), "--create-pool", "--nnodes", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--rdzv-endpoint" in done.stderr
    done = subprocess.run([script("forge-learner"), "--pool", str(tmp_path), "--create-pool", "--nnodes", "2",
                           "--node-rank", "2", "--rdzv-endpoint", "127.0.0.2:29400"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--node-rank 2 is not below --nnodes 2" in done.stderr


def test_sigterm_to_every_node_stops_the_job_cleanly(filled_pool):
    base = filled_pool
    run_dir, metrics = base / "run", base / "run" / "metrics.jsonl"
    rendezvous = f"{HOSTS[0]}:{free_port(HOSTS[0])}"
    nodes = [start_node(rank, base / "pool", run_dir, base / "model", rendezvous, "--checkpoint-every", "100")
             for rank in (0, 1)]
    wait_for(lambda: metrics.exists() and metrics.read_text().strip(), "the job's first step", 300, watched=nodes)
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    outputs = [n.communicate(timeout=300)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    latest = Checkpointer(run_dir / "checkpoints").latest()
    assert latest is not None and latest.state["step"] == len(lineage(metrics))    # the last step, saved
