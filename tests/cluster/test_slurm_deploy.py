"""``forge deploy --target slurm`` on a real two-node Slurm cluster (``tools/slurm_cluster.sh``, started by the
suite): the written batch script, submitted with ``sbatch``, trains the built-in tasks with the learner on both nodes
(one torchrun job), an actor, the pool service, the gateways and the rollout driver placed by the script, its model
named by Hugging Face id (a stand-in Hub on loopback) and fetched once per node; it stops on
a signal with a checkpoint of the learner's last step; a lost node requeues the job and the learner resumes from its
checkpoint, consuming no pool entry twice; and every process of a job is gone when it ends."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forge.pool import PoolReader
from forge.rollout.tasks.builtin_source import held_out, train

from conftest import REPO, script
from helpers.hub_server import HubServer, hub_env, write_model_repo

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

EXAMPLE = REPO / "examples" / "blackbox"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED"}   # NODE_FAIL: requeued

HUB_MODEL = "forge-test/tiny"        # the two-node run's model, served by a stand-in Hub (helpers/hub_server.py)

RUN_FILE = """
[deploy]
name = "{name}"
learner_nodes = 2
learner_gpus = 0
actors = 1
actor_gpus = 0
nodes = 2
shared_dir = "{shared}"
setup = "export PATH={bin}:$PATH"
ready_timeout = 600
stop_timeout = 300

[model]
path = "{model}"

[tasks]
train = "tasks/train.jsonl"
eval = "tasks/eval.jsonl"
verifier = "forge.rollout.tasks.builtin_source:score"
group_size = 4

[agent]
command = ["python", "agent.py"]
timeout_s = 300
concurrency = 8

[rollout]
groups_in_flight = 4
episodes = {episodes}

[learner]
batch_groups = 2
checkpoint_every = 2
device = "cpu"

[actor]
kv_cache_mb = 64
backend = "torch"
"""


class Job:
    """One run deployed to the cluster: its team folder and run file on the shared path, its script, its job."""

    def __init__(self, cluster, root: Path, name: str, episodes: int, model: str = "tiny",
                 env: dict[str, str] | None = None) -> None:
        self.cluster = cluster
        self.env = env or cluster.env
        self.shared = root / "shared"
        team = self.shared / "team"
        (team / "tasks").mkdir(parents=True)
        shutil.copy(EXAMPLE / "agent.py", team / "agent.py")
        (team / "tasks" / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in train(256)))
        (team / "tasks" / "eval.jsonl").write_text("".join(json.dumps(t) + "\n" for t in held_out(2)))
        self.run_file = team / "run.toml"
        self.run_file.write_text(RUN_FILE.format(name=name, shared=self.shared, bin=Path(sys.executable).parent,
                                                 episodes=episodes, model=model))
        self.dir = self.shared / name
        out = root / "deploy"
        done = subprocess.run([script("forge"), "deploy", "--config", str(self.run_file), "--target", "slurm",
                               "--out", str(out)], capture_output=True, text=True, env=self.env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        self.deploy_output = done.stdout
        self.script = out / f"{name}.sbatch"
        self.id = ""

    def submit(self) -> None:
        self.id = self.cluster.slurm("sbatch", "--parsable", f"--output={self.dir}.out", str(self.script),
                                     env=self.env).strip()

    def field(self, name: str) -> str:
        found = re.search(rf"\b{name}=(\S+)", self.cluster.slurm("scontrol", "show", "job", self.id))
        return found.group(1) if found else ""

    def wait_until(self, what: str, done, polls: int = 3000) -> None:
        """Poll ``done()`` (every 0.3 s of idle waiting) until it holds; fail saying ``what`` with the job's log."""
        for _ in range(polls):
            if done():
                return
            if self.field("JobState") in FINAL_STATES:
                break
            time.sleep(0.3)
        pytest.fail(f"{what}: never happened; job {self.id} {self.field('JobState')}\n{self.output()}")

    def wait_end(self) -> str:
        """The job's final state, once it has one."""
        for _ in range(6000):
            state = self.field("JobState")
            if state in FINAL_STATES:
                return state
            time.sleep(0.3)
        pytest.fail(f"job {self.id} did not end: {self.field('JobState')}\n{self.output()}")

    def output(self) -> str:
        path = Path(f"{self.dir}.out")
        return path.read_text() if path.exists() else ""

    def records(self) -> list[dict]:
        """The learner's metrics, each step's latest record (a step redone after a restart is written again)."""
        path = self.dir / "learner" / "metrics.jsonl"
        if not path.exists():
            return []
        latest = {}
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                latest[record["step"]] = record
        return [latest[step] for step in sorted(latest)]

    def checkpoint_step(self) -> int:
        """The step of the learner's latest checkpoint (0: none)."""
        latest = self.dir / "learner" / "checkpoints" / "latest"
        return int(latest.read_text().strip().removeprefix("step-")) if latest.exists() else 0

    def leftovers(self) -> list[str]:
        """Processes still running from this job (their command line names its run directory)."""
        found = subprocess.run(["pgrep", "-af", str(self.dir)], capture_output=True, text=True).stdout
        return [line for line in found.splitlines() if "pgrep" not in line]


def test_a_two_node_run_trains_evaluates_and_ends_by_itself(cluster, tmp_path):
    """The model named by Hugging Face id: the job fetches it once per node, then its services read the cache."""
    root = tmp_path / "hub"
    write_model_repo(root, HUB_MODEL, seed=3)
    with HubServer(root, tmp_path / "hub-server") as hub:
        env = {**hub_env(tmp_path / "hf", hub.url), "SLURM_CONF": cluster.env["SLURM_CONF"]}
        job = Job(cluster, tmp_path, "twonode", episodes=24, model=HUB_MODEL, env=env)
        two_node_run(job)
        asked = hub.requests()
    # one fetch a node (both nodes share this machine's cache, so the second may find the weights there); the
    # services, eight processes, asked the Hub nothing
    infos = [r for r in asked if r["path"].startswith(f"/api/models/{HUB_MODEL}") and "/tree/" not in r["path"]]
    assert len(infos) == 2, asked
    assert 1 <= sum(r["method"] == "GET" and r["path"].endswith(".safetensors") for r in asked) <= 2, asked
    assert sorted(p.name for p in (job.dir / "logs" / f"{job.id}.0").glob("fetch-*.log")) == ["fetch-n1.log",
                                                                                             "fetch-n2.log"]


def two_node_run(job: Job) -> None:
    assert "node 0: pool, cache, gateway(s), rollout driver(s); learner rank 1" in job.deploy_output
    assert "node 1: learner rank 0; actor 0" in job.deploy_output
    job.submit()
    assert job.wait_end() == "COMPLETED", job.output()
    assert job.field("ExitCode") == "0:0"
    steps = job.records()
    assert steps and steps[-1]["step"] >= 1
    assert job.checkpoint_step() == steps[-1]["step"]            # the learner checkpointed its last step
    summary = json.loads((job.dir / "summary.json").read_text())
    assert summary["episodes"] >= 24 and summary["failed_episodes"] == 0
    assert set(summary["eval_start"]) == set(summary["eval_end"]) == {"reasoning", "qa", "agent"}
    cursor = PoolReader(job.dir / "pool").cursor()
    assert cursor.tail > 0
    logs = job.dir / "logs" / f"{job.id}.0"
    assert "learner stopped at step" in (logs / "learner-rank0.log").read_text()
    assert job.leftovers() == []


def test_a_stop_signal_leaves_a_checkpoint_of_the_last_step(cluster, tmp_path):
    """SIGTERM to the batch script (what the time limit's warning sends, --signal=B:TERM) stops every service with a
    signal it receives: the learner checkpoints the step it was on, whatever its checkpoint_every."""
    job = Job(cluster, tmp_path, "stopped", episodes=0)
    job.submit()
    job.wait_until("three learner steps", lambda: len(job.records()) >= 3)
    cluster.slurm("scancel", "--batch", "--signal=TERM", job.id)
    job.wait_end()
    assert job.field("ExitCode") == "143:0", job.output()
    assert "signal received: stopping the services" in job.output()
    last = job.records()[-1]["step"]
    assert job.checkpoint_step() == last
    assert json.loads((job.dir / "summary.json").read_text())["episodes"] > 0
    assert job.leftovers() == []


def test_a_lost_node_requeues_the_job_and_the_learner_resumes(cluster, tmp_path):
    """Node n2 (learner rank 0 and the actor) is lost mid-run: Slurm requeues the job, which starts again once the
    node is back; the learner resumes from its last checkpoint and takes no pool entry twice. Then scancel
    --signal=TERM (to every step) stops it with a checkpoint of its last step."""
    job = Job(cluster, tmp_path, "requeued", episodes=0)
    job.submit()
    job.wait_until("a checkpoint after step 2", lambda: job.checkpoint_step() >= 2 and len(job.records()) >= 3)
    lost = cluster.run("fail", "n2")
    assert lost.returncode == 0, lost.stderr
    resumed_from = job.checkpoint_step()                       # none is written after the node is gone
    job.wait_until("the job requeued", lambda: job.field("Restarts") not in ("", "0"))
    cluster.up()                                               # the node comes back
    # Slurm holds a requeued job for two minutes (its BeginTime), and the test waits them out: the node's slurmd, back,
    # still gets the end of the first start there, and a second start begun before (an administrator's release)
    # loses the node to it (Slurm takes a node that reports a job ended off that job, whichever start it is in).
    second = job.dir / "logs" / f"{job.id}.1" / "learner-rank0.log"

    def resumed() -> bool:
        return second.exists() and "resumed from" in second.read_text() and job.records()[-1]["step"] >= resumed_from + 2

    job.wait_until("the learner resumed and trained two more steps", resumed, polls=6000)
    assert f"step-{resumed_from:08d} at step {resumed_from} " in second.read_text()
    cluster.slurm("scancel", "--signal=TERM", job.id)
    job.wait_end()
    records = job.records()
    assert job.checkpoint_step() == records[-1]["step"]
    taken = [position for record in records for position in record["positions"]]
    assert len(taken) == len(set(taken)), "a pool entry was trained on twice"
    assert job.leftovers() == []
    # The first start's script, still stopping its services when Slurm requeued the job, left the job to Slurm: its own
    # requeue would have requeued (or failed) the start after it.
    requeues = [line for line in (cluster.directory / "slurmctld.log").read_text().splitlines()
                if "_slurm_rpc_requeue" in line and f"JobId={job.id} " in line + " "]
    assert requeues == [], requeues


def test_a_job_larger_than_the_partition_is_refused_before_it_is_written(cluster, tmp_path):
    """Slurm would accept it and leave it pending for ever (Reason=PartitionConfig)."""
    job = Job(cluster, tmp_path, "small", episodes=1)
    done = subprocess.run([script("forge"), "deploy", "--config", str(job.run_file), "--target", "slurm", "--out",
                           str(tmp_path / "bigger"), "--nodes", "3"], capture_output=True, text=True, env=cluster.env,
                          timeout=300)
    assert done.returncode == 2
    assert "the job asks for 3 nodes and partition debug has 2: give --nodes 2" in done.stderr
    assert not (tmp_path / "bigger").exists()
