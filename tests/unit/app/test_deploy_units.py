"""forge deploy: the Kubernetes manifests pass Kubernetes' own schemas, the Slurm script is valid bash naming every
service, every generated command uses only options its service has, the weights relay tree is the documented one,
bad input is refused in one line writing nothing, and the keys appear in the Secret alone."""

from __future__ import annotations

import re
import shlex
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from forge.app.deploy.config import relay_parent, relays
from forge.app.deploy.k8s import KUBERNETES_VERSION
from forge.app.main import forge
from forge.cli.options import envvars_of, sources
from forge.settings import entries

from conftest import REPO
from helpers.deploy import TEAM, containers, deploy, documents, run_file, slurm_starts

SHAPES = {
    "single": [],
    "multi": ["--learner-nodes", "3", "--learner-gpus", "8", "--actors", "11", "--relay-fanout", "3", "--gateways", "2",
              "--volume-size", "500Gi", "--storage-class", "nfs", "--pool-volume-size", "50Gi", "--actors-per-node", "4",
              "--gateway-service-type", "LoadBalancer"],
    "cpu": ["--learner-gpus", "0", "--actor-gpus", "0", "--actors", "2", "--no-cache", "--no-create-namespace"],
}


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


def test_slurm_actors_fetch_from_their_parents_node_and_port(tmp_path):
    result, out = deploy(tmp_path, "slurm", "--actors", "7", "--relay-fanout", "2", "--actors-per-node", "2")
    assert result.exit_code == 0, result.output
    starts = dict(slurm_starts(next(out.glob("*.sbatch")).read_text()))
    for i in range(7):
        words = starts[f"actor-{i}"]
        fetch = words[words.index("--weights-fetch") + 1]
        parent = relay_parent(i, 2)
        # node 0: the services, node 1: the learner, nodes 2-5: the actors, two a node
        expected = ("tcp://${ADDRS[1]}:5701" if parent is None else
                    f"tcp://${{ADDRS[{2 + parent // 2}]}}:{5703 + 10 * (parent % 2)}")
        assert fetch == expected, (i, fetch)
        assert ("--relay-fetch" in words) == relays(i, 7, 2)
        if relays(i, 7, 2):
            assert words[words.index("--relay-fetch") + 1] == f"tcp://0.0.0.0:{5703 + 10 * (i % 2)}"
        assert words[:2] == ["env", f"CUDA_VISIBLE_DEVICES={i % 2}"]


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
    (["--target", "k8s", "--learner-gpus", "3"], TEAM.replace("lr = 2e-4", "context_parallel = 2"),
     "[learner] context_parallel = 2 must divide the learner job's 3 processes"),
    (["--target", "k8s"], TEAM.split("[agent]")[0], "give [tasks] (train or source, and verifier) and [agent]"),
    (["--target", "k8s"], TEAM.replace('verifier = "verify.py:score"\n', ""), "need a verifier"),
    (["--target", "k8s"], TEAM + '\n[env]\nverifiers = "env.py:load"\n', "give [env] or [tasks] and [agent]"),
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


def test_an_environment_run_file_deploys_rollout_drivers_that_read_it(tmp_path):
    text = '[model]\npath = "tiny"\n\n[env]\nverifiers = "env.py:load_environment"\nargs = { num_examples = 64 }\n'
    result, out = deploy(tmp_path, "k8s", text=text)
    assert result.exit_code == 0, result.output
    rollout = next(c for c in containers(out) if c["name"] == "rollout")
    assert "forge rollout" in " ".join(rollout["command"]) and "--config" in " ".join(rollout["command"])


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


def test_the_model_tables_impl_reaches_the_learner_not_the_servers(tmp_path):
    result, out = deploy(tmp_path, "slurm", text=TEAM.replace('path = "tiny"', 'path = "tiny"\nimpl = "transformers"'))
    assert result.exit_code == 0, result.output
    starts = slurm_starts(next(out.glob("*.sbatch")).read_text())
    with_impl = {name for name, words in starts if "--model-impl" in words}
    assert {name.split("-")[0] for name in with_impl} == {"learner", "rollout"}, with_impl
    learner = next(words for name, words in starts if name.startswith("learner"))
    assert learner[learner.index("--model-impl") + 1] == "transformers"


def test_a_hub_model_is_fetched_where_the_services_run_which_then_read_the_cache(tmp_path):
    """Slurm: once per node, before any service; Kubernetes: an init container into the cache on the shared
    volume. The services run offline (HF_HUB_OFFLINE), the rollout drivers excepted (they may fetch a dataset)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    text = TEAM.replace('path = "tiny"', 'path = "org/model@v2"').replace("kv_cache_mb = 96",
                                                                          'kv_cache_mb = 96\nbackend = "torch"')
    result, out = deploy(tmp_path, "slurm", text=text)
    assert result.exit_code == 0, result.output
    script = (out / "forge.sbatch").read_text()
    fetch, offline, first_start = (script.index("fetch_model org/model@v2\n"), script.index("export HF_HUB_OFFLINE=1"),
                                   script.index("\nstart "))
    assert fetch < offline < first_start
    starts = dict(slurm_starts(script))
    assert starts["learner-rank0"][starts["learner-rank0"].index("--model") + 1] == "org/model@v2"
    assert starts["rollout-0"][:2] == ["env", "HF_HUB_OFFLINE=$HUB_OFFLINE_GIVEN"]

    (tmp_path / "k8s").mkdir()
    result, out = deploy(tmp_path / "k8s", "k8s", text=text)
    assert result.exit_code == 0, result.output
    pods = {}
    for _, doc in documents(out):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        if doc["kind"] in ("StatefulSet", "Job"):
            spec = doc["spec"]["template"]["spec"]
            pods[doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]] = spec
    for component in ("learner", "actor", "gateway", "rollout"):
        (init,) = pods[component]["initContainers"]
        assert init["command"] == ["/bin/sh", "-c", "forge model fetch org/model@v2"]
        env = {e["name"]: e.get("value") for e in pods[component]["containers"][0]["env"]}
        assert env["HF_HOME"] == "/forge/hf"
        assert env.get("HF_HUB_OFFLINE") == (None if component == "rollout" else "1")
    assert "initContainers" not in pods["pool"]
    plain, out = deploy(tmp_path / "k8s", "k8s")
    assert plain.exit_code == 0, plain.output
    assert all("initContainers" not in doc["spec"]["template"]["spec"] for _, doc in documents(out)
               if doc["kind"] in ("StatefulSet", "Job"))


# On-policy distillation: the teacher's actors.

TEACHING = TEAM.replace("[learner]\nlr = 2e-4\n", '[learner]\nlr = 2e-4\nteacher = "tiny-moe"\n')


def test_slurm_starts_the_teacher_s_actors_beside_the_actors_before_the_learner(tmp_path):
    result, out = deploy(tmp_path, "slurm", "--actors", "3", "--actors-per-node", "2", "--teacher-actors", "2",
                         "--actor-gpus", "1", "--learner-gpus", "0", text=TEACHING)
    assert result.exit_code == 0, result.output
    script = next(out.glob("*.sbatch")).read_text()
    starts = slurm_starts(script)
    names = [name for name, _ in starts]
    assert names.index("teacher-1") < names.index("learner-rank0")
    assert script.index('wait_file teacher-1 "$READY/teachers/teacher-1.json"') < script.index("start learner-rank0")
    by_name = dict(starts)
    # node 0: the services, node 1: the learner, node 2: actors 0 and 1, node 3: actor 2; the teacher's actors
    # beside actors 0 and 1, after them on node 2 (ports and GPUs)
    for k, (port, gpu) in enumerate(((50071, 2), (50081, 3))):
        words = by_name[f"teacher-{k}"]
        assert words[:2] == ["env", f"CUDA_VISIBLE_DEVICES={gpu}"]
        assert words[words.index("--model") + 1] == "tiny-moe" and words[words.index("--backend") + 1] == "auto"
        assert words[words.index("--port") + 1] == str(port) and words[words.index("--host") + 1] == "${ADDRS[2]}"
        assert "--weights-fetch" not in words and "--l3-cache" not in words and "--api-key-file" in words
    learner = by_name["learner-rank0"]
    given = [learner[i + 1] for i, word in enumerate(learner) if word == "--teacher-actor"]
    assert given == ["${ADDRS[2]}:50071", "${ADDRS[2]}:50081"] and "--teacher-api-key-file" in learner
    assert "actors 0, 1; teacher actors 0, 1" in script and "#SBATCH --gres=gpu:4" in script
    assert "learner teacher cache pool" in script             # stopped after the learner's last step
    (tmp_path / "plain").mkdir()
    plain, out = deploy(tmp_path / "plain", "slurm", "--teacher-actors", "2")
    written = next(out.glob("*.sbatch")).read_text()
    assert plain.exit_code == 0 and "start teacher-" not in written and "--teacher-actor" not in written


def test_k8s_runs_the_teacher_s_actors_as_a_stateful_set_the_learner_is_given(tmp_path):
    result, out = deploy(tmp_path, "k8s", "--teacher-actors", "2", text=TEACHING)
    assert result.exit_code == 0, result.output
    found = {(doc["kind"], doc["metadata"]["name"]): (name, doc) for name, doc in documents(out)}
    name, teachers = found["StatefulSet", "teacher"]
    assert name == "25-teacher.yaml" and teachers["spec"]["replicas"] == 2 and ("Service", "teacher") in found
    container = teachers["spec"]["template"]["spec"]["containers"][0]
    words = shlex.split(container["command"][-1].replace("\\\n", " ").split("exec ", 1)[1])
    assert words[words.index("--model") + 1] == "tiny-moe" and words[words.index("--backend") + 1] == "auto"
    assert "--weights-fetch" not in words
    learner = found["StatefulSet", "learner"][1]["spec"]["template"]["spec"]["containers"][0]
    argv = learner["command"]
    assert [argv[i + 1] for i, w in enumerate(argv) if w == "--teacher-actor"] == [
        f"teacher-{k}.teacher.forge.svc:50051" for k in range(2)]
    keyed = {v["name"]: v["valueFrom"]["secretKeyRef"]["key"] for v in learner["env"] if "secretKeyRef" in
             v.get("valueFrom", {})}
    assert [kind for name, kind in keyed.items() if "TEACHER_API_KEY" in name] == ["actor"]
    (tmp_path / "plain").mkdir()
    plain, out = deploy(tmp_path / "plain", "k8s")
    assert plain.exit_code == 0 and not (out / "25-teacher.yaml").exists()


@pytest.mark.parametrize("target", ["k8s", "slurm"])
def test_a_run_file_with_the_load_test_backend_is_refused(tmp_path, target):
    """It samples no model: a deployment that trains refuses it before writing anything."""
    result, out = deploy(tmp_path, target, text="[actor]\nbackend = 'loadtest'\n")
    assert result.exit_code != 0 and "samples no model" in result.output
    assert not out.exists() or not any(out.iterdir())
