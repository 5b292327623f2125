"""``forge deploy --target k8s``: Kubernetes manifests for one run, applied with ``kubectl apply -f OUT/``.

Every kind of service is a StatefulSet with a headless Service, so that each pod has a stable DNS name
(``actor-3.actor.NAMESPACE.svc``): the gateway lists the actors by name, an actor finds its parent in the weights
relay tree by name, and the learner's nodes meet at ``learner-0``. The pool and the cache are one-replica
StatefulSets; the learner is one of ``--learner-nodes`` pods, its node rank the pod's ordinal; the rollout drivers
are an Indexed Job, one per gateway. The run file is a ConfigMap mounted at /etc/forge; the keys are one Secret,
given to the services as environment variables; the shared volume is mounted at /forge in every pod."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from forge.app.command_line import Shell, option_words, quote
from forge.app.deploy import services
from forge.app.deploy.config import (
    ACTOR_PORT,
    CACHE_PORT,
    GATEWAY_GRPC_PORT,
    GATEWAY_HTTP_PORT,
    HF_HOME_IN_POD,
    LEARNER_PORT,
    POOL_MOUNT,
    POOL_PORT,
    RDZV_PORT,
    RUN_FILE_IN_POD,
    SHARED_MOUNT,
    DeployConfig,
    OutFile,
)
from forge.app.deploy.runfile import RunFile
from forge.app.deploy.services import ANY, Command, shell_words
from forge.app.registry import KEY_KINDS, service
from forge.weights.endpoints import RELAY_ANNOUNCE_PORT, RELAY_FETCH_PORT, WEIGHTS_ANNOUNCE_PORT, WEIGHTS_FETCH_PORT

KUBERNETES_VERSION = "1.30"         # the oldest Kubernetes the manifests are checked against (tests/unit/app/test_deploy_units.py)
SECRET = "forge-keys"
RUN_CONFIG = "forge-run"
POD_NAME = "FORGE_POD_NAME"         # every pod's own name (the downward API), whose ordinal is its rank or index
GPU = "nvidia.com/gpu"
# Seconds a service may take to start before its liveness probe counts (model loading, vLLM's engine start-up).
START_S = {"learner": 1800, "actor": 900, "teacher": 900, "gateway": 300, "pool": 300, "cache": 300}
# Seconds a pod is given to stop on SIGTERM (the learner checkpoints after its current step).
STOP_S = {"learner": 600, "actor": 60, "teacher": 60, "gateway": 60, "pool": 60, "cache": 30, "rollout": 60}
HUB_READERS = ("learner", "actor", "teacher", "gateway", "rollout")   # the pods that load a model (a Hub one from the cache)


class _Dumper(yaml.SafeDumper):
    """Block-style YAML without anchors; multi-line strings (the pods' start-up scripts) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style=style)


_Dumper.add_representer(str, _string)
_Dumper.add_representer(Shell, _string)


def dump(documents: Sequence[dict[str, Any]], header: str) -> str:
    body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120,
                         explicit_start=True)
    return "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + body


class Manifests:
    """The manifests of one run: ``files()`` renders them, ``commands()`` lists the services' command lines."""

    def __init__(self, config: DeployConfig, run: RunFile, keys: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.run = run
        self.keys = dict(keys) if keys is not None else {k: secrets.token_urlsafe(32) for k in KEY_KINDS}
        ns = config.namespace
        self.base = f"{SHARED_MOUNT}/{config.name}"
        self.pool_address = f"pool-0.pool.{ns}.svc:{POOL_PORT}"
        self.learner_host = f"learner-rank0.{ns}.svc"
        self.cache_on = config.cache and run.cache_serves_actors

    # Names and addresses.
    def labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "forge", "app.kubernetes.io/instance": self.config.name,
                "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "forge-deploy"}

    def selector(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/instance": self.config.name, "app.kubernetes.io/component": component}

    def meta(self, name: str, component: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.config.namespace, "labels": self.labels(component)}

    def actor_host(self, index: int | str) -> str:
        return f"actor-{index}.actor.{self.config.namespace}.svc"

    def teacher_host(self, index: int | str) -> str:
        return f"teacher-{index}.teacher.{self.config.namespace}.svc"

    @property
    def teachers(self) -> int:
        """The teacher's actors (on-policy distillation): none without a [learner] teacher."""
        return self.config.teacher_actors if self.run.teacher is not None else 0

    def gateway_host(self, index: int | str) -> str:
        return f"gateway-{index}.gateway-pods.{self.config.namespace}.svc"

    @property
    def team_dir(self) -> str:
        return self.config.team_dir or f"{self.base}/team"

    # The services' command lines.
    def learner_command(self) -> Command:
        rank = Shell("$rank") if self.config.learner_nodes > 1 else 0
        return services.learner(self.run, self.config, name="learner", run_file=RUN_FILE_IN_POD, rank=rank,
                                rdzv=f"learner-0.learner.{self.config.namespace}.svc:{RDZV_PORT}",
                                pool=self.pool_address, run_dir=f"{self.base}/learner",
                                teachers=[f"{self.teacher_host(k)}:{ACTOR_PORT}" for k in range(self.teachers)])

    def teacher_command(self) -> Command:
        """The teacher's actors' command (on-policy distillation)."""
        return services.teacher(self.run, self.config, name=Shell(f"${POD_NAME}"), run_file=RUN_FILE_IN_POD,
                                host=ANY, port=ACTOR_PORT)

    def actor_command(self, relay: bool = False) -> Command:
        """The actors' command (``relay``: with the relay options, which the pods add where they have children)."""
        return services.actor(self.run, self.config, name=Shell(f"${POD_NAME}"), run_file=RUN_FILE_IN_POD,
                              host=ANY, port=ACTOR_PORT, fetch=Shell("$fetch"), announce=Shell("$announce"),
                              relay=self.relay_endpoints if relay else None,
                              cache=f"cache-0.cache.{self.config.namespace}.svc:{CACHE_PORT}" if self.cache_on
                              else None)

    @property
    def relay_endpoints(self) -> tuple[str, str]:
        return f"tcp://{ANY}:{RELAY_FETCH_PORT}", f"tcp://{ANY}:{RELAY_ANNOUNCE_PORT}"

    def gateway_command(self) -> Command:
        return services.gateway(self.run, self.config, name="gateway", run_file=RUN_FILE_IN_POD,
                                grpc_port=GATEWAY_GRPC_PORT, http_port=GATEWAY_HTTP_PORT, pool=self.pool_address,
                                actors=[f"{self.actor_host(i)}:{ACTOR_PORT}" for i in range(self.config.actors)])

    def pool_command(self) -> Command:
        path = f"{POOL_MOUNT}/pool" if self.config.pool_volume_size else f"{self.base}/pool"
        return services.pool(self.run, self.config, run_file=RUN_FILE_IN_POD, path=path, port=POOL_PORT)

    def cache_command(self) -> Command:
        return services.cache(self.run, self.config, run_file=RUN_FILE_IN_POD, directory=f"{self.base}/cache",
                              port=CACHE_PORT)

    def rollout_command(self) -> Command:
        return services.rollout(self.run, self.config, name="rollout", run_file=Shell("$run_file"),
                                gateway=Shell(f"{self.gateway_host('$i')}:{GATEWAY_GRPC_PORT}"),
                                http=Shell(f"http://{self.gateway_host('$i')}:{GATEWAY_HTTP_PORT}"),
                                seed=Shell("$seed"))

    def commands(self) -> list[Command]:
        """Every service's command (the actors' both with and without the relay options)."""
        found = [self.pool_command(), *([self.cache_command()] if self.cache_on else []), self.learner_command(),
                 self.actor_command(), self.gateway_command()]
        if self.config.relay_fanout:
            found.append(self.actor_command(relay=True))
        if self.run.rollout:
            found.append(self.rollout_command())
        return found

    # The pods.
    def env(self, command: Command) -> list[dict[str, Any]]:
        variables: list[dict[str, Any]] = [{"name": POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        for name, kind in command.key_variables():
            variables.append({"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": kind}}})
        return variables

    def container(self, command: Command, argv: list[str], *, ports: Mapping[str, int], probes: dict[str, Any],
                  gpus: int = 0) -> dict[str, Any]:
        mounts = [{"name": "run-file", "mountPath": RUN_FILE_IN_POD.rsplit("/", 1)[0], "readOnly": True},
                  {"name": "shared", "mountPath": SHARED_MOUNT}]
        if command.kind in ("learner", "actor"):
            mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        if command.kind == "pool" and self.config.pool_volume_size:
            mounts.append({"name": "pool-data", "mountPath": POOL_MOUNT})
        container: dict[str, Any] = {
            "name": command.kind, "image": self.config.image, "command": argv, "env": self.env(command),
            "ports": [{"name": name, "containerPort": port} for name, port in ports.items()],
            "volumeMounts": mounts, **probes}
        if not container["ports"]:
            del container["ports"]
        if self.run.hub_models and command.kind in HUB_READERS:
            container["env"] += self.hub_env(offline=command.kind != "rollout")
        if gpus:
            container["resources"] = {"limits": {GPU: gpus}}
        elif command.kind in ("learner", "actor"):      # a CPU one, even where the runtime shows every GPU
            container["env"].append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
        return container

    @staticmethod
    def hub_env(offline: bool) -> list[dict[str, Any]]:
        """A pod's Hugging Face cache on the shared volume (fetched into once for every pod), read only by the
        services (the rollout driver may fetch a dataset)."""
        return [{"name": "HF_HOME", "value": HF_HOME_IN_POD},
                *([{"name": "HF_HUB_OFFLINE", "value": "1"}] if offline else [])]

    def fetch_container(self) -> dict[str, Any]:
        """The init container fetching the run's Hub models into the shared cache before a service starts."""
        fetches = " && ".join(f"forge model fetch {quote(model)}" for model in self.run.hub_models)
        return {"name": "fetch-model", "image": self.config.image, "command": ["/bin/sh", "-c", fetches],
                "env": self.hub_env(offline=False), "volumeMounts": [{"name": "shared", "mountPath": SHARED_MOUNT}]}

    def pod(self, component: str, container: dict[str, Any]) -> dict[str, Any]:
        volumes: list[dict[str, Any]] = [
            {"name": "run-file", "configMap": {"name": RUN_CONFIG}},
            {"name": "shared", "persistentVolumeClaim": {"claimName": self.config.volume}}]
        if component in ("learner", "actor", "teacher"):
            volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        spec: dict[str, Any] = {"enableServiceLinks": False, "terminationGracePeriodSeconds": STOP_S[component],
                                "containers": [container], "volumes": volumes}
        if self.run.hub_models and component in HUB_READERS:
            spec["initContainers"] = [self.fetch_container()]
        if component == "rollout":
            spec["restartPolicy"] = "OnFailure"
        return {"metadata": {"labels": self.labels(component)}, "spec": spec}

    @staticmethod
    def grpc_probes(port: int, component: str) -> dict[str, Any]:
        """Kubernetes' own gRPC probes against the gRPC health service every Forge server serves."""
        check = {"grpc": {"port": port}}
        return {"startupProbe": {**check, "periodSeconds": 10, "failureThreshold": START_S[component] // 10},
                "readinessProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 5},
                "livenessProbe": {**check, "periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 6}}

    def learner_probes(self) -> dict[str, Any]:
        """Rank 0 alone serves gRPC: one learner pod is probed natively; several run the health check on rank 0
        only (``forge.app.deploy.probe``), their other ranks passing."""
        if self.config.learner_nodes == 1:
            return self.grpc_probes(LEARNER_PORT, "learner")
        check = {"exec": {"command": ["python", "-m", "forge.app.deploy.probe", "--rank0-only", f"127.0.0.1:{LEARNER_PORT}"]}}
        return {"startupProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 10,
                                 "failureThreshold": START_S["learner"] // 10},
                "readinessProbe": {**check, "periodSeconds": 15, "timeoutSeconds": 10},
                "livenessProbe": {**check, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 6}}

    def stateful_set(self, name: str, component: str, service: str, replicas: int, container: dict[str, Any],
                     claims: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        spec: dict[str, Any] = {"serviceName": service, "replicas": replicas, "podManagementPolicy": "Parallel",
                                "selector": {"matchLabels": self.selector(component)},
                                "template": self.pod(component, container)}
        if claims:
            spec["volumeClaimTemplates"] = list(claims)
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": self.meta(name, component), "spec": spec}

    def service(self, name: str, component: str, ports: Mapping[str, int], *, headless: bool = True,
                selector: Mapping[str, str] | None = None, kind: str = "ClusterIP") -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": {**self.selector(component), **(selector or {})},
                                "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()]}
        if headless:          # every pod's DNS name, ready or not (the learner's nodes meet before they serve)
            spec = {"clusterIP": "None", "publishNotReadyAddresses": True, **spec}
        else:
            spec = {"type": kind, **spec}
        return {"apiVersion": "v1", "kind": "Service", "metadata": self.meta(name, component), "spec": spec}

    # The files.
    def files(self) -> list[OutFile]:
        c, run = self.config, self.run
        services.check_wiring(run, self.commands())
        source = f"Written by forge deploy from {run.path}."
        found: list[OutFile] = []

        def add(name: str, what: str, documents: list[dict[str, Any]], secret: bool = False) -> None:
            found.append(OutFile(name, dump(documents, f"{what}\n{source}"), secret))

        if c.create_namespace:
            add("00-namespace.yaml", "The run's namespace.", [
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": c.namespace, "labels": self.labels("namespace")}}])
        if c.volume_size:
            claim: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": c.volume_size}}}
            if c.storage_class:
                claim["storageClassName"] = c.storage_class
            add("01-storage.yaml", f"The shared volume, mounted at {SHARED_MOUNT} in every pod.", [
                {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": self.meta(c.volume, "storage"),
                 "spec": claim}])
        add("02-keys.yaml", "The run's API keys, made afresh by forge deploy: keep this file private (mode 0600).", [
            {"apiVersion": "v1", "kind": "Secret", "metadata": self.meta(SECRET, "keys"), "type": "Opaque",
             "stringData": dict(self.keys)}], secret=True)
        add("03-run-file.yaml", f"The run file, mounted at {RUN_FILE_IN_POD} in every pod.", [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(RUN_CONFIG, "run-file"),
             "data": {"run.toml": run.text}}])
        add("10-pool.yaml", "The Data Pool service: one replica over the pool directory.", self.pool_documents())
        if self.cache_on:
            add("11-cache.yaml", "forge-cache, the L3 KV cache: one replica over its block directory.", [
                self.service("cache", "cache", {"grpc": CACHE_PORT}),
                self.stateful_set("cache", "cache", "cache", 1, self.container(
                    self.cache_command(), self.cache_command().words(), ports={"grpc": CACHE_PORT},
                    probes=self.grpc_probes(CACHE_PORT, "cache")))])
        add("20-learner.yaml", f"The learner: {c.learner_nodes} node(s) of {c.learner_processes} process(es); "
                               "rank 0 (pod learner-0) serves Stats and the weights.", self.learner_documents())
        if self.teachers:
            add("25-teacher.yaml", f"The teacher's actors ([learner] teacher: {run.teacher}): {self.teachers}, which "
                                   "the learner asks for the log-probs of the student's samples.",
                self.teacher_documents())
        add("30-actors.yaml", f"The actors: {c.actors}" + (f", in a weights relay tree of fan-out {c.relay_fanout}"
                                                           if c.relay_fanout else "") + ".", self.actor_documents())
        add("40-gateway.yaml", f"The gateway(s): {c.gateways}, behind the Service 'gateway' (the agents' door).",
            self.gateway_documents())
        if run.rollout:
            add("50-rollout.yaml", "The rollout drivers: the team's tasks played by its agent, one per gateway.",
                [self.rollout_job()])
        return found

    def pool_documents(self) -> list[dict[str, Any]]:
        command = self.pool_command()
        claims = []
        if self.config.pool_volume_size:
            spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                    "resources": {"requests": {"storage": self.config.pool_volume_size}}}
            if self.config.storage_class:
                spec["storageClassName"] = self.config.storage_class
            claims.append({"metadata": {"name": "pool-data"}, "spec": spec})
        return [self.service("pool", "pool", {"grpc": POOL_PORT}),
                self.stateful_set("pool", "pool", "pool", 1, self.container(
                    command, command.words(), ports={"grpc": POOL_PORT}, probes=self.grpc_probes(POOL_PORT, "pool")),
                    claims)]

    def learner_documents(self) -> list[dict[str, Any]]:
        c = self.config
        command = self.learner_command()
        ports = {"stats": LEARNER_PORT, "fetch": WEIGHTS_FETCH_PORT, "announce": WEIGHTS_ANNOUNCE_PORT}
        if c.learner_nodes > 1:
            argv = ["/bin/sh", "-c", script([f'rank="${{{POD_NAME}##*-}}"'], command.words())]
            ports["rdzv"] = RDZV_PORT
        else:
            argv = command.words()
        container = self.container(command, argv, ports=ports, probes=self.learner_probes(), gpus=c.learner_gpus)
        main = {k: v for k, v in ports.items() if k != "rdzv"}
        return [self.service("learner", "learner", ports),
                self.service("learner-rank0", "learner", main, headless=False,
                             selector={"statefulset.kubernetes.io/pod-name": "learner-0"}),
                self.stateful_set("learner", "learner", "learner", c.learner_nodes, container)]

    def actor_prelude(self) -> tuple[list[str], str]:
        """The actor pods' start-up lines (their index, their parent in the relay tree, whether they relay) and
        what ends their command line."""
        c = self.config
        f = c.relay_fanout
        lines = [f'i="${{{POD_NAME}##*-}}"',
                 f"fetch=tcp://{self.learner_host}:{WEIGHTS_FETCH_PORT} "
                 f"announce=tcp://{self.learner_host}:{WEIGHTS_ANNOUNCE_PORT}"]
        if not f or c.actors <= f:
            return lines, ""
        parent = self.actor_host(f"$(( (i - {f}) / {f} ))")
        lines += [f'if [ "$i" -ge {f} ]; then      # actor i fetches from actor (i - {f}) / {f}',
                  f'  parent="{parent}"',
                  f'  fetch="tcp://$parent:{RELAY_FETCH_PORT}" announce="tcp://$parent:{RELAY_ANNOUNCE_PORT}"',
                  "fi",
                  "set --",
                  f"if [ $(( {f} + i * {f} )) -lt {c.actors} ]; then      # it has children: relay the weights",
                  "  set -- " + " ".join(option_words(service("actor"), services.relay_values(*self.relay_endpoints))),
                  "fi"]
        return lines, ' "$@"'

    def actor_documents(self) -> list[dict[str, Any]]:
        c = self.config
        command = self.actor_command()
        prelude, tail = self.actor_prelude()
        ports = {"grpc": ACTOR_PORT}
        if tail:
            ports |= {"relay-fetch": RELAY_FETCH_PORT, "relay-announce": RELAY_ANNOUNCE_PORT}
        container = self.container(command, ["/bin/sh", "-c", script(prelude, command.words(), tail)], ports=ports,
                                   probes=self.grpc_probes(ACTOR_PORT, "actor"), gpus=c.actor_gpus)
        return [self.service("actor", "actor", ports), self.stateful_set("actor", "actor", "actor", c.actors, container)]

    def teacher_documents(self) -> list[dict[str, Any]]:
        command = self.teacher_command()
        container = self.container(command, ["/bin/sh", "-c", script([], command.words())], ports={"grpc": ACTOR_PORT},
                                   probes=self.grpc_probes(ACTOR_PORT, "teacher"), gpus=self.config.actor_gpus)
        return [self.service("teacher", "teacher", {"grpc": ACTOR_PORT}),
                self.stateful_set("teacher", "teacher", "teacher", self.teachers, container)]

    def gateway_documents(self) -> list[dict[str, Any]]:
        command = self.gateway_command()
        ports = {"grpc": GATEWAY_GRPC_PORT, "http": GATEWAY_HTTP_PORT}
        door = self.service("gateway", "gateway", ports, headless=False, kind=self.config.gateway_service_type)
        door["spec"]["sessionAffinity"] = "ClientIP"      # a client's calls stay with the gateway holding its session
        container = self.container(command, command.words(), ports=ports,
                                   probes=self.grpc_probes(GATEWAY_GRPC_PORT, "gateway"))
        return [self.service("gateway-pods", "gateway", ports), door,
                self.stateful_set("gateway", "gateway", "gateway-pods", self.config.gateways, container)]

    def rollout_job(self) -> dict[str, Any]:
        c = self.config
        command = self.rollout_command()
        team = quote(self.team_dir)
        prelude = ['i="$JOB_COMPLETION_INDEX"',
                   f"seed=$(( {services.rollout_seed(self.run)} + i ))",
                   f"if [ ! -d {team} ]; then",
                   f"  echo \"forge deploy: {self.team_dir} does not exist: put the team's tasks, verifier and agent "
                   "there (see docs/deploy.md)\" >&2",
                   "  exit 1",
                   "fi",
                   "# The run file beside the team's files, where its relative paths resolve.",
                   f'run_file={team}/".forge-run-{c.name}-$i.toml"',
                   f'cp {RUN_FILE_IN_POD} "$run_file"']
        container = self.container(command, ["/bin/sh", "-c", script(prelude, command.words())], ports={},
                                   probes={})
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": self.meta("rollout", "rollout"),
                "spec": {"completionMode": "Indexed", "completions": c.gateways, "parallelism": c.gateways,
                         "backoffLimit": 6 * c.gateways, "template": self.pod("rollout", container)}}


def script(prelude: Sequence[str], words: Sequence[str], tail: str = "") -> str:
    """A pod's start-up script: ``prelude`` lines, then the service's command line in place of the shell."""
    return "\n".join(["set -eu", *prelude, "exec " + shell_words(words) + tail]) + "\n"


def render(config: DeployConfig, run: RunFile) -> list[OutFile]:
    return Manifests(config, run).files()
