"""forge deploy: the Kubernetes manifests pass Kubernetes' own schemas, the Slurm script is valid bash naming every
service, every generated command uses only options its service has, the weights relay tree is the documented one,
bad input is refused in one line writing nothing, and the keys appear in the Secret alone."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from forge.app.deploy.config import relay_parent, relays
from forge.app.deploy.k8s import KUBERNETES_VERSION
from forge.app.main import forge
from forge.cli.options import envvars_of, sources
from forge.settings import entries

from conftest import REPO, free_port

TEAM = """
[model]
path = "tiny"

[tasks]
train = "tasks/train.jsonl"
eval = "tasks/eval.jsonl"
verifier = "verify.py:score"

[agent]
command = ["python", "agent.py"]

[learner]
lr = 2e-4

[actor]
kv_cache_mb = 96

[pool]
session_timeout = 600
"""

SHAPES = {
    "single": [],
    "multi": ["--learner-nodes", "3", "--learner-gpus", "8", "--actors", "11", "--relay-fanout", "3", "--gateways", "2",
              "--volume-size", "500Gi", "--storage-class", "nfs", "--pool-volume-size", "50Gi", "--actors-per-node", "4",
              "--gateway-service-type", "LoadBalancer"],
    "cpu": ["--learner-gpus", "0", "--actor-gpus", "0", "--actors", "2", "--no-cache", "--no-create-namespace"],
}


def run_file(tmp_path: Path, text: str = TEAM, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def deploy(tmp_path: Path, target: str, *args: str, text: str = TEAM) -> tuple[click.testing.Result, Path]:
    out = tmp_path / f"out-{target}"
    extra = ["--shared-dir", "/shared/forge"] if target == "slurm" else []
    result = CliRunner().invoke(forge, ["deploy", "--config", str(run_file(tmp_path, text)), "--target", target,
                                        "--out", str(out), *extra, *args])
    return result, out


def documents(out: Path) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(out.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


def containers(out: Path) -> list[dict[str, Any]]:
    found = []
    for _, doc in documents(out):
        if doc["kind"] in ("StatefulSet", "Job"):
            found += doc["spec"]["template"]["spec"]["containers"]
    return found


def service_commands() -> dict[tuple[str, ...], click.Command]:
    """The click command of each program a deployment runs, found from the real CLI."""
    groups: dict[str, Any] = forge.commands
    return {("forge-learner",): groups["learner"], ("forge-actor",): groups["actor"],
            ("forge-gateway",): groups["gateway"], ("forge-cache",): groups["cache"],
            ("forge", "pool", "serve"): groups["pool"].commands["serve"], ("forge", "rollout"): groups["rollout"]}


def program_of(words: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(program, its arguments) in a command line's words (``env VAR=...`` and ``exec`` set aside)."""
    while words and (words[0] in ("exec", "env") or re.fullmatch(r"[A-Z_]+=.*", words[0])):
        words = words[1:]
    for program in sorted(service_commands(), key=len, reverse=True):
        if tuple(words[:len(program)]) == program:
            return program, words[len(program):]
    raise AssertionError(f"no Forge service in {words}")


def flags(words: list[str]) -> set[str]:
    return {w for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*", w)}


def options_of(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def script_words(script: str) -> list[list[str]]:
    """The command lines of a start-up script that run a service (its ``exec``) or set its options (``set --``)."""
    lines = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["exec"] or words[:2] == ["set", "--"]:
            lines.append(words)
    return lines


def k8s_service_flags(out: Path) -> dict[tuple[str, ...], set[str]]:
    """Every flag each program is given in the manifests."""
    found: dict[tuple[str, ...], set[str]] = {}
    for container in containers(out):
        command = container["command"]
        if command[:2] == ["/bin/sh", "-c"]:
            lines = script_words(command[2])
            program, _ = program_of(next(w for w in lines if w[0] == "exec"))
            given = set().union(*(flags(w) for w in lines))
        else:
            program, args = program_of(command)
            given = flags(args)
        found.setdefault(program, set()).update(given)
    return found


def slurm_starts(script: str) -> list[tuple[str, list[str]]]:
    """(step name, command words) of every ``start NAME NODE COMMAND...`` of a batch script."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True) if line.startswith("start ") else []
        if words:
            found.append((words[1], words[3:]))
    return found


# Kubernetes.

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_k8s_manifests_pass_the_kubernetes_schemas(tmp_path, shape):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    result, out = deploy(tmp_path, "k8s", *SHAPES[shape])
    assert result.exit_code == 0, result.output
    found = documents(out)
    kinds = {doc["kind"] for _, doc in found}
    assert {"ConfigMap", "Secret", "Service", "StatefulSet", "Job"} <= kinds
    for name, doc in found:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at "
                                 f"{'.'.join(map(str, exc.path))}") from None


def test_k8s_wires_every_service_by_its_stable_name(tmp_path):
    result, out = deploy(tmp_path, "k8s", *SHAPES["multi"])
    assert result.exit_code == 0, result.output
    by_name = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in documents(out)}
    assert by_name["StatefulSet", "learner"]["spec"]["replicas"] == 3
    assert by_name["StatefulSet", "actor"]["spec"]["replicas"] == 11
    assert by_name["StatefulSet", "gateway"]["spec"]["replicas"] == 2
    assert by_name["Service", "learner-rank0"]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == "learner-0"
    for name in ("learner", "actor", "pool", "cache", "gateway-pods"):
        assert by_name["Service", name]["spec"]["clusterIP"] == "None"
    assert by_name["Service", "gateway"]["spec"]["type"] == "LoadBalancer"
    gateway = by_name["StatefulSet", "gateway"]["spec"]["template"]["spec"]["containers"][0]
    actors = [gateway["command"][i + 1] for i, w in enumerate(gateway["command"]) if w == "--actor"]
    assert actors == [f"actor-{i}.actor.forge.svc:50051" for i in range(11)]
    assert gateway["readinessProbe"] == {"grpc": {"port": 50053}, "periodSeconds": 10, "timeoutSeconds": 5}
    learner = by_name["StatefulSet", "learner"]["spec"]["template"]["spec"]["containers"][0]
    assert learner["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert "--rdzv-endpoint learner-0.learner.forge.svc:29500" in learner["command"][2]
    assert '--node-rank "$rank"' in learner["command"][2]
    job = by_name["Job", "rollout"]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == 2
    pool = by_name["StatefulSet", "pool"]["spec"]
    assert pool["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
    for container in containers(out):
        if container["name"] != "rollout":
            assert "--config" in " ".join(container["command"]) and "/etc/forge/run.toml" in " ".join(
                container["command"])
        if container["name"] in ("pool", "cache", "gateway", "actor"):
            assert "grpc" in container["livenessProbe"] and "grpc" in container["readinessProbe"]
            assert "0.0.0.0" in " ".join(container["command"])


def test_a_single_learner_node_is_probed_natively_and_runs_without_a_shell(tmp_path):
    result, out = deploy(tmp_path, "k8s")
    assert result.exit_code == 0, result.output
    learner = next(c for c in containers(out) if c["name"] == "learner")
    assert learner["command"][0] == "forge-learner" and "--nnodes" not in learner["command"]
    assert learner["livenessProbe"]["grpc"] == {"port": 50052}


@pytest.mark.parametrize("target", ["k8s", "slurm"])
def test_generated_commands_use_only_options_the_services_have(tmp_path, target):
    result, out = deploy(tmp_path, target, *SHAPES["multi"])
    assert result.exit_code == 0, result.output
    commands = service_commands()
    if target == "k8s":
        given = k8s_service_flags(out)
    else:
        given = {}
        for _, words in slurm_starts(next(out.glob("*.sbatch")).read_text()):
            program, args = program_of(words)
            given.setdefault(program, set()).update(flags(args))
    assert set(given) == set(commands)                  # every service runs
    unknown = {" ".join(p): sorted(f - options_of(commands[p])) for p, f in given.items() if f - options_of(commands[p])}
    assert not unknown, f"options the services do not have: {unknown}"


def test_k8s_key_variables_are_the_services_own(tmp_path):
    result, out = deploy(tmp_path, "k8s")
    assert result.exit_code == 0, result.output
    commands = service_commands()
    for container in containers(out):
        command = container["command"]
        words = next(w for w in script_words(command[2]) if w[0] == "exec") if command[0] == "/bin/sh" else command
        program, _ = program_of(words)
        target = commands[program]
        known = {v for e in entries(target.settings_class) for v in envvars_of(e, target.settings_table)}
        for variable in container["env"]:
            if "secretKeyRef" in variable.get("valueFrom", {}):
                assert variable["name"] in known, (program, variable["name"])


def test_every_service_reads_its_own_table_of_the_run_file_it_is_given(tmp_path):
    path = run_file(tmp_path, TEAM + "\n[gateway]\nrouter = 'round-robin'\n\n[cache]\ncapacity_mb = 64\n")
    expected = {("forge-learner",): ("lr", 2e-4), ("forge-actor",): ("kv_cache_mb", 96),
                ("forge-gateway",): ("router", "round-robin"), ("forge-cache",): ("capacity_mb", 64),
                ("forge", "pool", "serve"): ("session_timeout", 600), ("forge", "rollout"): ("tasks", "tasks/train.jsonl")}
    for program, command in service_commands().items():
        values, where = sources(command, ["--config", str(path)])
        name, value = expected[program]
        assert (values[name], where[name]) == (value, "file"), program


# The relay tree.

def test_the_relay_tree_gives_every_server_at_most_fanout_children():
    assert [relay_parent(i, 2) for i in range(8)] == [None, None, 0, 0, 1, 1, 2, 2]
    assert [relay_parent(i, 0) for i in range(4)] == [None] * 4
    for fanout in (1, 2, 3, 5):
        children: dict[int | None, int] = {}
        for i in range(40):
            parent = relay_parent(i, fanout)
            assert parent is None or parent < i
            children[parent] = children.get(parent, 0) + 1
            assert relays(i, 40, fanout) == any(relay_parent(j, fanout) == i for j in range(40))
        assert max(children.values()) <= fanout


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


def test_slurm_actors_fetch_from_their_parents_node_and_port(tmp_path):
    result, out = deploy(tmp_path, "slurm", "--actors", "7", "--relay-fanout", "2", "--actors-per-node", "2")
    assert result.exit_code == 0, result.output
    starts = dict(slurm_starts(next(out.glob("*.sbatch")).read_text()))
    for i in range(7):
        words = starts[f"actor-{i}"]
        fetch = words[words.index("--weights-fetch") + 1]
        parent = relay_parent(i, 2)
        expected = ("tcp://${LEARNER_NODES[0]}:5701" if parent is None else
                    f"tcp://${{ACTOR_NODES[{parent // 2}]}}:{5703 + 10 * (parent % 2)}")
        assert fetch == expected, (i, fetch)
        assert ("--relay-fetch" in words) == relays(i, 7, 2)
        if relays(i, 7, 2):
            assert words[words.index("--relay-fetch") + 1] == f"tcp://0.0.0.0:{5703 + 10 * (i % 2)}"
        assert words[:2] == ["env", f"CUDA_VISIBLE_DEVICES={i % 2}"]


# Slurm.

def test_slurm_script_is_valid_bash_and_names_every_service(tmp_path):
    result, out = deploy(tmp_path, "slurm", "--learner-nodes", "2", "--actors", "3", "--gateways", "2",
                         "--partition", "gpu", "--account", "team", "--time", "1-00:00:00")
    assert result.exit_code == 0, result.output
    script = out / "forge.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    names = [name for name, _ in slurm_starts(text)]
    assert names == ["pool", "cache", "learner-rank0", "learner-rank1", "actor-0", "actor-1", "actor-2", "gateway-0",
                     "gateway-1", "rollout-0", "rollout-1"]
    for line in ("#SBATCH --nodes=6", "#SBATCH --gres=gpu:1", "#SBATCH --partition=gpu", "#SBATCH --account=team",
                 "#SBATCH --time=1-00:00:00", 'scontrol show hostnames "$SLURM_JOB_NODELIST"', "trap "):
        assert line in text
    starts = dict(slurm_starts(text))
    rank1 = starts["learner-rank1"]
    assert rank1[rank1.index("--node-rank") + 1] == "1"
    assert rank1[rank1.index("--rdzv-endpoint") + 1] == "${LEARNER_NODES[0]}:29500"
    assert starts["gateway-1"][starts["gateway-1"].index("--grpc-port") + 1] == "50063"
    assert starts["rollout-1"][starts["rollout-1"].index("--gateway") + 1] == "$SERVICE_NODE:50063"
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
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'n0\\nn1\\nn2\\nn3\\nn4\\n'\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    text = text.replace('wait_port pool "$SERVICE_NODE" 50057', f"wait_port pool 127.0.0.1 {port}")
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
                                      "gateway-0", "rollout-0"]), output
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


# Keys.

def test_keys_are_in_the_secret_alone_never_printed(tmp_path):
    result, out = deploy(tmp_path, "k8s", *SHAPES["multi"])
    assert result.exit_code == 0, result.output
    secret = out / "02-keys.yaml"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert "mode 0600" in result.output
    keys = list(next(d for _, d in documents(out) if d["kind"] == "Secret")["stringData"].values())
    assert len(keys) == 5 and len(set(keys)) == 5 and all(len(k) >= 40 for k in keys)
    for path in out.iterdir():
        if path != secret:
            assert not any(k in path.read_text() for k in keys), path
    assert not any(k in result.output for k in keys)
    again, _ = deploy(tmp_path, "k8s", *SHAPES["multi"])
    fresh = next(d for _, d in documents(out) if d["kind"] == "Secret")["stringData"].values()
    assert not set(fresh) & set(keys), "keys are made afresh"
    assert again.exit_code == 0


def test_slurm_script_holds_no_key(tmp_path):
    result, out = deploy(tmp_path, "slurm")
    assert result.exit_code == 0, result.output
    text = (out / "forge.sbatch").read_text()
    assert "token_urlsafe" in text and "--api-key-file" in text
    assert "--api-key " not in text and "API_KEY=" not in text


# Bad input.

@pytest.mark.parametrize(("args", "text", "message"), [
    ([], TEAM, "give --target k8s or --target slurm"),
    (["--target", "slurm"], TEAM, "--target slurm needs --shared-dir"),
    (["--target", "k8s", "--namespace", "Forge_NS"], TEAM, "is not a DNS label"),
    (["--target", "k8s", "--volume-size", "lots"], TEAM, "is not a storage size"),
    (["--target", "k8s", "--actors", "0"], TEAM, "--actors"),
    (["--target", "slurm", "--shared-dir", "relative/dir"], TEAM, "is not an absolute path"),
    (["--target", "slurm", "--shared-dir", "/s", "--time", "tomorrow"], TEAM, "is not a Slurm time limit"),
    (["--target", "k8s"], TEAM + "\n[actor]\n", "Cannot declare"),
    (["--target", "k8s"], TEAM.replace("kv_cache_mb", "kv_cache_gb"), "[actor]: unknown setting kv_cache_gb"),
    (["--target", "k8s"], TEAM.replace("[pool]", "[gateway]\npool_address = 'x:1'\n[pool]"),
     "[gateway] sets pool_address, which forge deploy wires"),
    (["--target", "k8s"], TEAM.replace("[pool]", "[pool]\napi_key_file = '/k'"), "[pool] sets api_key_file"),
    (["--target", "slurm", "--shared-dir", "/s"], TEAM.replace("lr = 2e-4", "nproc = 4"), "[learner] sets nproc"),
    (["--target", "k8s"], TEAM.split("[agent]")[0], "give [tasks] (train or source, and verifier) and [agent]"),
    (["--target", "k8s"], TEAM.replace('verifier = "verify.py:score"\n', ""), "need a verifier"),
    (["--target", "k8s"], TEAM.replace("kv_cache_mb = 96", "role = 'prefill'"), "role = 'prefill'"),
    (["--target", "k8s"], "[deploy]\nactors = -1\n", "--actors"),
    (["--target", "k8s"], "[deploy]\ncolour = 'blue'\n", "unknown setting colour"),
])
def test_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, args, text, message):
    out = tmp_path / "out"
    result = CliRunner().invoke(forge, ["deploy", "--config", str(run_file(tmp_path, text)), "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and message in error[0], result.output
    assert not out.exists()


def test_a_run_file_is_required(tmp_path):
    result = CliRunner().invoke(forge, ["deploy", "--target", "k8s", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "give --config RUN_FILE" in result.output
    assert not (tmp_path / "out").exists()


# The run file and the out directory.

def test_the_deploy_table_holds_the_settings_and_the_other_tables_go_to_the_pods(tmp_path):
    text = "[deploy]\ntarget = 'k8s'\nactors = 3\nnamespace = 'team-a'\nimage = 'reg.example/forge:1'\n" + TEAM
    out = tmp_path / "out"
    result = CliRunner().invoke(forge, ["deploy", "--config", str(run_file(tmp_path, text)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    found = {(d["kind"], d["metadata"]["name"]): d for _, d in documents(out)}
    assert found["StatefulSet", "actor"]["spec"]["replicas"] == 3
    assert found["StatefulSet", "actor"]["metadata"]["namespace"] == "team-a"
    assert found["ConfigMap", "forge-run"]["data"]["run.toml"] == text
    assert {c["image"] for c in containers(out)} == {"reg.example/forge:1"}


def test_a_run_file_without_a_team_deploys_no_rollout_and_stale_manifests_go(tmp_path):
    result, out = deploy(tmp_path, "k8s")
    assert (out / "50-rollout.yaml").exists()
    result, out = deploy(tmp_path, "k8s", text="[actor]\nbackend = 'vllm'\n")
    assert result.exit_code == 0, result.output
    assert not (out / "50-rollout.yaml").exists() and not (out / "11-cache.yaml").exists()
    assert "no cache: the [actor] backend is vllm" in result.output
    actor = next(c for c in containers(out) if c["name"] == "actor")
    assert "--l3-cache" not in actor["command"][2]


def test_the_example_deploy_run_file_deploys_to_both_targets(tmp_path):
    for target in ("k8s", "slurm"):
        out = tmp_path / target
        result = CliRunner().invoke(forge, ["deploy", "--config", str(REPO / "examples/blackbox/deploy.toml"),
                                            "--target", target, "--out", str(out)])
        assert result.exit_code == 0, result.output


# The multi-node learner's probe.

def test_the_learner_probe_asks_rank_0_only(monkeypatch):
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from forge.app.deploy import probe

    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("FORGE_POD_NAME", "learner-0")
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe.main(["--rank0-only", f"127.0.0.1:{port}"]) == 1
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert probe.main(["--rank0-only", f"127.0.0.1:{port}"]) == 0
        monkeypatch.setenv("FORGE_POD_NAME", "learner-10")
        assert probe.main(["--rank0-only", "127.0.0.1:1"]) == 0
    finally:
        server.stop(0)
    monkeypatch.setenv("FORGE_POD_NAME", "learner-0")
    assert probe.main(["--rank0-only", "--timeout", "0.5", "127.0.0.1:1"]) == 1
