"""Settings of ``forge deploy`` (the run file's ``[deploy]`` table, ``FORGE_DEPLOY_*`` variables and flags): the
target, the shape of the system (learner nodes, actors, gateways, the weights' relay tree), storage, and each
target's own settings; and the fixed ports and paths the generated services use."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from forge.settings import Settings, SettingsError, setting

TARGETS = ("k8s", "slurm")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")

# Ports of the services, the same in every pod (Kubernetes) or offset by a slot on a shared node (Slurm).
ACTOR_PORT = 50051
LEARNER_PORT = 50052                 # the learner's Stats service (rank 0)
GATEWAY_GRPC_PORT = 50053
CACHE_PORT = 50055
POOL_PORT = 50057
GATEWAY_HTTP_PORT = 8000
RDZV_PORT = 29500                    # torchrun's rendezvous on the first learner node
SLOT_STRIDE = 10                     # Slurm: the k-th service of a kind on one node adds k * SLOT_STRIDE to its ports

# Kubernetes: where the pods see the run file and the shared volume.
CONFIG_DIR = "/etc/forge"
RUN_FILE_IN_POD = f"{CONFIG_DIR}/run.toml"
SHARED_MOUNT = "/forge"
HF_HOME_IN_POD = f"{SHARED_MOUNT}/hf"  # the Hugging Face cache every pod shares: a Hub model is fetched into it once
POOL_MOUNT = "/var/lib/forge"        # the pool's own volume, with --pool-volume-size

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|infinite")
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.,-]+")


def _dns_label(most: int):
    def check(value: str) -> None:
        if not _DNS_LABEL.fullmatch(value) or len(value) > most:
            raise ValueError(f"{value!r} is not a DNS label (lower-case letters, digits and '-', at most {most} "
                             "characters, starting and ending with a letter or digit)")
    return check


def _dns_subdomain(value: str) -> None:
    if not _DNS_SUBDOMAIN.fullmatch(value) or len(value) > 253:
        raise ValueError(f"{value!r} is not a Kubernetes object name (lower-case letters, digits, '-' and '.')")


def _quantity(value: str) -> None:
    if not _QUANTITY.fullmatch(value):
        raise ValueError(f"{value!r} is not a storage size such as 500Gi or 2Ti")


def _image(value: str) -> None:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not a container image reference (e.g. registry.example.com/forge-rl:1.0)")


def _absolute(value: str | Path) -> None:
    if not str(value).startswith("/"):
        raise ValueError(f"{str(value)!r} is not an absolute path")


def _slurm_time(value: str) -> None:
    if not _SLURM_TIME.fullmatch(value):
        raise ValueError(f"{value!r} is not a Slurm time limit (MINUTES, HH:MM:SS or DAYS-HH:MM:SS)")


def _slurm_name(value: str) -> None:
    if not _SLURM_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a Slurm partition or account name")


@dataclass(frozen=True, kw_only=True)
class DeployConfig(Settings):
    """``forge deploy``: the run file's ``[deploy]`` table. The other tables go to the services unchanged."""

    target: str | None = setting(None, choices=TARGETS, help="What to write: Kubernetes manifests (k8s) or a Slurm "
                                                             "batch script (slurm). Required.")
    out: Path = setting(Path("deploy"), path="dir", help="Directory the manifests or the script are written to.")
    name: str = setting("forge", validate=_dns_label(40),
                        help="The deployment's name: its Kubernetes labels, its Slurm job name, and its directory on "
                             "the shared storage.")
    learner_nodes: int = setting(1, min=1, max=1024, help="Learner nodes (a multi-node torchrun job; rank 0 serves "
                                                          "Stats and the weights).")
    learner_gpus: int = setting(1, min=0, max=64, help="GPUs of each learner node, one learner process each (0: one "
                                                       "CPU process).")
    actors: int = setting(1, min=1, max=4096, help="Actors (inference servers).")
    actor_gpus: int = setting(1, min=0, max=64, help="GPUs of each actor (0: a CPU actor).")
    teacher_actors: int = setting(1, min=1, max=4096,
                                  help="Actors serving the run file's [learner] teacher (on-policy distillation), "
                                       "each with --actor-gpus GPUs; slurm: beside the actors, on their nodes. "
                                       "None without a teacher.")
    gateways: int = setting(1, min=1, max=64, help="Gateways; with a [tasks] and [agent] run file, one rollout "
                                                   "driver each.")
    relay_fanout: int = setting(0, min=0, max=1024,
                                help="Weights relay tree: actor i fetches weights from the learner when i < FANOUT, "
                                     "else from actor (i - FANOUT) // FANOUT, which re-serves the versions it "
                                     "applied; so the learner and each actor serve at most FANOUT actors (0: every "
                                     "actor fetches from the learner).")
    cache: bool = setting(True, help="Run forge-cache (the L3 KV cache) and connect the actors to it (torch backend "
                                     "only: with another [actor] backend it is left out).")
    image: str = setting("forge-rl:latest", validate=_image,
                         help="k8s: the container image holding Forge (see Dockerfile and Dockerfile.gpu).")
    namespace: str = setting("forge", validate=_dns_label(63), help="k8s: the namespace of every object.")
    create_namespace: bool = setting(True, help="k8s: write the Namespace too.")
    volume: str = setting("forge-shared", validate=_dns_subdomain,
                          help=f"k8s: the PersistentVolumeClaim (ReadWriteMany) mounted at {SHARED_MOUNT} in every "
                               "pod: run directory, checkpoints, pool, cache, the team's files.")
    volume_size: str | None = setting(None, validate=_quantity,
                                      help="k8s: write the --volume claim too, of this size (e.g. 500Gi) [default: "
                                           "the claim exists already].")
    storage_class: str | None = setting(None, validate=_dns_subdomain,
                                        help="k8s: the storage class of the claims written [default: the cluster's].")
    pool_volume_size: str | None = setting(None, validate=_quantity,
                                           help="k8s: give the pool a ReadWriteOnce volume of its own of this size "
                                                "(LMDB is safest on a local disk) [default: on the shared volume].")
    gateway_service_type: str = setting("ClusterIP", choices=SERVICE_TYPES,
                                        help="k8s: the type of the gateway's Service (agents' HTTP and gRPC door).")
    team_dir: str | None = setting(None, validate=_absolute, metavar="DIR",
                                   help=f"k8s: the directory in the rollout pods holding the team's tasks, verifier "
                                        f"and agent, where the run file's relative paths resolve [default: "
                                        f"{SHARED_MOUNT}/NAME/team on the shared volume].")
    shared_dir: Path | None = setting(None, validate=_absolute,
                                      help="slurm: a directory every node sees; the run's directory (pool, "
                                           "checkpoints, cache, keys, logs) is SHARED_DIR/NAME. Required for slurm.")
    partition: str | None = setting(None, validate=_slurm_name, help="slurm: the partition (#SBATCH --partition).")
    account: str | None = setting(None, validate=_slurm_name, help="slurm: the account (#SBATCH --account).")
    time: str | None = setting(None, validate=_slurm_time,
                               help="slurm: the job's time limit (#SBATCH --time), e.g. 24:00:00 [default: the "
                                    "partition's].")
    actors_per_node: int = setting(1, min=1, max=64, help="slurm: actors sharing one node (each on its own "
                                                          "--actor-gpus GPUs).")
    nodes: int | None = setting(None, min=1, max=4096,
                                help="slurm: the job's nodes. With fewer than one per role (pool and gateways, each "
                                     "learner node, each --actors-per-node actors) the roles share nodes, in that "
                                     "order around the job's nodes; the placement is printed [default: one per "
                                     "role].")
    interface: str | None = setting(None, metavar="NAME",
                                    help="slurm: the network interface the services reach each other over (e.g. "
                                         "ib0), read on each node; also GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME "
                                         "[default: the address Slurm knows each node by, its NodeAddr].")
    ready_timeout: int = setting(1800, min=1, metavar="SECONDS",
                                 help="slurm: how long the job waits for each service to be ready (loading a model "
                                      "included) before it stops with the service's last log lines.")
    stop_timeout: int = setting(240, min=1, metavar="SECONDS",
                                help="slurm: how long each service has to stop after SIGTERM (the learner's last "
                                     "step and checkpoint) before it is killed; the job signals itself this long "
                                     "plus a minute before its time limit.")
    requeues: int = setting(3, min=0, max=100,
                            help="slurm: how many times the job requeues itself when a service fails while it "
                                 "runs (a lost node, a crashed rank): it starts again and the learner resumes from "
                                 "its last checkpoint (0: the job ends). Slurm's own requeue of a job whose node "
                                 "failed counts too.")
    setup: str | None = setting(None, metavar="SHELL",
                                help="slurm: a shell line run first in the job, e.g. 'source /shared/venv/bin/activate' "
                                     "(the services inherit its environment).")

    def check(self) -> None:
        if self.target is None:
            raise SettingsError("give --target k8s or --target slurm")
        if self.target == "slurm" and self.shared_dir is None:
            raise SettingsError("--target slurm needs --shared-dir (a directory every node of the job sees)")
        if self.setup is not None and "\n" in self.setup:
            raise SettingsError("one line, without newlines", "--setup")
        if self.target == "slurm":
            self._check_nodes()

    def _check_nodes(self) -> None:
        """SettingsError for a job too small to place the services (see ``slurm_layout``)."""
        one_per_role = self.role_nodes
        if self.nodes is None:
            return
        if self.nodes > one_per_role:
            raise SettingsError(f"the run places its services on {one_per_role} nodes (pool and gateways, "
                                f"{self.learner_nodes} learner, {self.actor_nodes} actor): give at most that many",
                                "--nodes")
        if self.learner_nodes > self.nodes:
            raise SettingsError(f"{self.learner_nodes} learner nodes need a job of as many nodes (one torchrun node "
                                "rank each)", "--nodes")
        if self.actor_nodes > self.nodes:
            raise SettingsError(f"{self.actors} actors, {self.actors_per_node} a node, need {self.actor_nodes} nodes: "
                                "raise --actors-per-node or --nodes", "--nodes")

    @property
    def learner_processes(self) -> int:
        """Learner processes per node: one per GPU, one on CPU."""
        return max(1, self.learner_gpus)

    @property
    def actor_nodes(self) -> int:
        """Slurm: the nodes the actors take."""
        return -(-self.actors // self.actors_per_node)

    @property
    def role_nodes(self) -> int:
        """Slurm: the nodes of one per role: the pool and gateways', each learner node, the actors'."""
        return 1 + self.learner_nodes + self.actor_nodes

    @property
    def job_nodes(self) -> int:
        """Slurm: the job's nodes, --nodes or one per role."""
        return self.nodes or self.role_nodes


def relay_parent(actor: int, fanout: int) -> int | None:
    """The actor that ``actor`` fetches weights from in the relay tree, None for the learner: with a fan-out F,
    actors 0..F-1 fetch from the learner and actor i >= F from actor (i - F) // F, so every server of weights (the
    learner or an actor) has at most F children; 0 turns the tree off."""
    if fanout <= 0 or actor < fanout:
        return None
    return (actor - fanout) // fanout


def relays(actor: int, actors: int, fanout: int) -> bool:
    """Whether ``actor`` has children in the relay tree (and so re-serves weights): its first child, F + actor * F,
    exists."""
    return fanout > 0 and fanout + actor * fanout < actors


@dataclass(frozen=True)
class OutFile:
    """A file ``forge deploy`` writes: its name in the out directory, its text, and whether it holds keys (then it
    is written readable by its owner alone)."""

    name: str
    text: str
    secret: bool = False
