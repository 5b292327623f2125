"""forge deploy's output run by a shell: a Kubernetes actor pod's start-up script computes the relay tree, and the
Slurm batch script is valid bash that runs its services in order (stand-ins for srun and the services) and stops
them on a signal. (The manifests and scripts as written: unit/test_deploy.py.)"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from forge.app.deploy.config import relay_parent, relays

from conftest import free_port
from helpers.deploy import containers, deploy, slurm_starts


@pytest.mark.parametrize(("actors", "fanout"), [(7, 2), (10, 3), (3, 4), (5, 1)])
def test_k8s_actor_pods_compute_the_same_tree(tmp_path, actors, fanout):
    result, out = deploy(tmp_path, "k8s", "--actors", str(actors), "--relay-fanout", str(fanout))
    assert result.exit_code == 0, result.output
    script = next(c for c in containers(out) if c["name"] == "actor")["command"][2]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "forge-actor").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake / "forge-actor").chmod(0o755)
    for i in range(actors):
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FORGE_POD_NAME": f"actor-{i}"}
        args = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout.split()
        fetch = args[args.index("--weights-fetch") + 1]
        parent = relay_parent(i, fanout)
        expected = ("tcp://learner-rank0.forge.svc:5701" if parent is None else
                    f"tcp://actor-{parent}.actor.forge.svc:5703")
        assert fetch == expected, (i, args)
        assert ("--relay-fetch" in args) == relays(i, actors, fanout), (i, args)
        assert args[args.index("--name") + 1] == f"actor-{i}"


def test_slurm_script_is_valid_bash_and_names_every_service(tmp_path):
    result, out = deploy(tmp_path, "slurm", "--learner-nodes", "2", "--actors", "3", "--gateways", "2",
                         "--partition", "gpu", "--account", "team", "--time", "1-00:00:00")
    assert result.exit_code == 0, result.output
    script = out / "forge.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    names = [name for name, _ in slurm_starts(text)]
    assert names == ["pool", "cache", "learner-rank0", "learner-rank1", "actor-0", "actor-1", "actor-2", "gateway-0",
                     "gateway-1", "gateway-eval", "rollout-0", "rollout-1"]
    for line in ("#SBATCH --nodes=6", "#SBATCH --gres=gpu:1", "#SBATCH --partition=gpu", "#SBATCH --account=team",
                 "#SBATCH --time=1-00:00:00", 'scontrol show hostnames "$SLURM_JOB_NODELIST"', "trap "):
        assert line in text
    starts = dict(slurm_starts(text))
    rank1 = starts["learner-rank1"]
    assert rank1[rank1.index("--node-rank") + 1] == "1"
    assert rank1[rank1.index("--rdzv-endpoint") + 1] == "${ADDRS[1]}:29500"
    assert starts["gateway-1"][starts["gateway-1"].index("--grpc-port") + 1] == "50063"
    assert starts["rollout-1"][starts["rollout-1"].index("--gateway") + 1] == "${ADDRS[0]}:50063"
    assert starts["rollout-1"][starts["rollout-1"].index("--seed") + 1] == "1"


def test_slurm_script_runs_its_services_in_order_and_stops_them_on_a_signal(tmp_path):
    """The script itself, run with stand-ins for srun, scontrol and the services: each service starts once the one
    before it is ready, and SIGTERM reaches every step."""
    result, out = deploy(tmp_path, "slurm", "--learner-nodes", "2", "--actors", "2")
    assert result.exit_code == 0, result.output
    text = (out / "forge.sbatch").read_text()
    shared = tmp_path / "shared"
    text = text.replace("RUN=/shared/forge/forge", f"RUN={shared}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "steps.log"
    port = free_port()
    # srun: record the step, write its ready file (the services would; the pool listens instead), then wait for
    # SIGTERM.
    (bin_dir / "srun").write_text(f"""#!/bin/bash
name=""; while [ "${{1#--}}" != "$1" ]; do case "$1" in --job-name=*) name="${{1#--job-name=}}";; esac; shift; done
echo "start $name" >> {log}
listener=""
if [ "$name" = pool ]; then
    python3 -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", {port})); s.listen(); time.sleep(120)' &
    listener=$!
fi
trap 'echo "stop $name" >> {log}; [ -z "$listener" ] || kill "$listener"; exit 0' TERM
prev=""; for a in "$@"; do [ "$prev" = --ready-file ] && echo '{{}}' > "$a"; prev="$a"; done
while true; do sleep 0.1; done
""")
    # scontrol: the job's nodes, each at 127.0.0.1; squeue: no steps known (the script then signals the sruns)
    (bin_dir / "scontrol").write_text("#!/bin/sh\n[ \"$2\" = node ] && echo 'NodeName=x NodeAddr=127.0.0.1 State=IDLE' "
                                      "&& exit 0\nprintf 'n0\\nn1\\nn2\\nn3\\nn4\\n'\n")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("srun", "scontrol", "squeue"):
        (bin_dir / tool).chmod(0o755)
    text = text.replace('wait_port pool "${ADDRS[0]}" 50057', f"wait_port pool 127.0.0.1 {port}")
    text = text.replace("sleep 5", "sleep 0.1")
    script = tmp_path / "job.sh"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n[0-4]",
           "SLURM_JOB_ID": "7"}
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(300):
            if log.exists() and "start rollout-0" in log.read_text():
                break
            subprocess.run(["sleep", "0.1"])
        job.terminate()
        output, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    assert log.exists(), output
    steps = log.read_text().splitlines()
    started = [s.split()[1] for s in steps if s.startswith("start")]
    assert sorted(started) == sorted(["pool", "cache", "learner-rank0", "learner-rank1", "actor-0", "actor-1",
                                      "gateway-0", "gateway-eval", "rollout-0"]), output
    # the script's own lines, not the stand-ins' log: a backgrounded srun may write its line after the next starts
    launched = [line.split()[1] for line in output.splitlines() if line.startswith("started ")]
    assert sorted(launched) == sorted(started), output
    phases = [("pool", "cache", "learner", "actor", "gateway", "rollout").index(s.split("-")[0]) for s in launched]
    assert phases == sorted(phases), output                 # a phase starts once the one before is ready
    stopped = [s.split()[1] for s in steps if s.startswith("stop")]
    assert sorted(stopped) == sorted(started), output
    assert stopped[0] == "rollout-0" and stopped[-1] == "pool"
    keys = shared / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    for kind in ("gateway", "actor", "pool", "cache", "session"):
        assert stat.S_IMODE((keys / f"{kind}.key").stat().st_mode) == 0o600
        assert len((keys / f"{kind}.key").read_text().strip()) >= 40
