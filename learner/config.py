"""Settings of a forge-learner process: the initial model, the pool it reads, the run directory, weight
publishing (and its CURVE keys), the Stats listener, the groups owned by the training parts (trainer, loss, rewards,
window), and the experiment trackers it logs to when run alone (``[tracking]``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forge import variables
from forge.checkpoints import IMPLS, cached_model, check_impl, trainable_model
from forge.learner.lora_config import LoraConfig
from forge.learner.loss_config import LossConfig
from forge.learner.rewards import RewardConfig
from forge.learner.trainer_config import TrainerConfig
from forge.pool import WindowConfig
from forge.rpc.client import check_address, check_addresses
from forge.settings import Settings, SettingsError, log_level_setting, metrics_port_setting, ready_file_setting, setting
from forge.tracking import TrackingConfig
from forge.weights.curve import check_client_keys, check_key_pair
from forge.weights.endpoints import DEFAULT_ANNOUNCE_ENDPOINT, DEFAULT_FETCH_ENDPOINT


@dataclass(frozen=True, kw_only=True)
class LearnerConfig(Settings):
    model: str = setting("tiny", validate=trainable_model,
                         help="Initial policy: a checkpoint directory (HF layout: any family Forge or transformers "
                              "implements), a Hugging Face id (org/name[@revision], read from the Hugging Face cache: "
                              "forge model fetch), 'tiny' or 'tiny-moe'. Ignored when resuming.")
    model_impl: str = setting("auto", choices=IMPLS,
                              help="What trains the model: Forge's own implementation (native: qwen3, qwen3_moe, "
                                   "with MTP and experts), transformers' (any family), or auto: native where it "
                                   "exists.")
    pool_path: Path | None = setting(None, flag="pool", path="dir",
                                     help="Local pool directory (LMDB), opened in this process; it must hold a pool "
                                          "unless --create-pool.")
    create_pool: bool = setting(False, help="Create the --pool directory's pool when there is none yet (forge up "
                                            "does: its learner opens the pool first).")
    pool_address: str | None = setting(None, metavar="HOST:PORT", help="A remote Pool service instead of --pool.")
    pool_api_key: str | None = setting(None, env="FORGE_POOL_API_KEY", secret=True, help="API key of the remote pool.")
    run_dir: Path = setting(Path("runs/learner"), path="dir", help="Checkpoints and metrics.jsonl go here.")
    resume: bool = setting(True, help="Continue from the run directory's latest checkpoint when there is one.")
    keep_checkpoints: int = setting(3, min=1, help="Checkpoints kept (the oldest are deleted).")
    weights_fetch: str = setting(DEFAULT_FETCH_ENDPOINT,
                                 help="ZeroMQ endpoint actors fetch weight chunks from ('tcp://127.0.0.1:*' picks a "
                                      "free port).")
    weights_announce: str = setting(DEFAULT_ANNOUNCE_ENDPOINT, help="ZeroMQ endpoint new weight versions are announced "
                                                                 "on.")
    weights_key: Path | None = setting(None, path="file", validate=check_key_pair,
                                       help="The learner's CURVE key pair (a ZeroMQ *.key_secret certificate, see "
                                            "forge keys weights): weights then travel encrypted, only to the actors "
                                            "in --weights-clients.")
    weights_clients: Path | None = setting(None, path="dir", validate=check_client_keys,
                                           help="Directory of the public certificates (*.key) of the actors allowed "
                                                "to fetch weights; goes with --weights-key.")
    publish: bool = setting(True, help="Stream weights to actors.")
    device: str = setting("auto", help="cpu, cuda, cuda:N, or auto.")
    nproc: int = setting(1, min=1, help="Data-parallel processes on this node (FSDP2, relaunched under torchrun).")
    nnodes: int = setting(1, min=1, help="Nodes (hosts) of the learner job, --nproc processes each; every node runs "
                                         "this command with its own --node-rank (see docs/learner.md).")
    node_rank: int = setting(0, min=0, help="This node's rank in [0, --nnodes): node 0 holds rank 0, which reads the "
                                            "pool, checkpoints, publishes weights and serves Stats.")
    rdzv_endpoint: str | None = setting(None, metavar="HOST:PORT", validate=check_address,
                                        help="With --nnodes > 1: node 0's address for the torchrun rendezvous "
                                             "(reachable from every node; node 0 listens on its port).")
    collective_timeout_s: float = setting(600.0, min=1, help="With several processes: how long a collective waits "
                                                             "for a silent peer before the step fails (a peer that "
                                                             "dies fails it at once).")
    host: str = setting("127.0.0.1", help="Interface of the Stats service.")
    port: int = setting(0, min=0, max=65535, help="Port of the Stats service (0 = any free port).")
    metrics_port: int | None = metrics_port_setting()
    ready_file: Path | None = ready_file_setting("address, pid, weights_fetch, weights_announce, metrics_url")
    log_level: str = log_level_setting()
    teacher: str | None = setting(None, validate=cached_model,
                                  help="On-policy distillation: the teacher model (a reference as --model takes, "
                                       "sharing the student's tokenizer), served by the actors --teacher-actor names, "
                                       "which score the student's sampled tokens (docs/learner.md).")
    teacher_actors: tuple[str, ...] = setting((), flag="teacher-actor", metavar="HOST:PORT", validate=check_addresses,
                                              help="An actor serving --teacher (repeatable; forge up starts them).")
    teacher_api_key: str | None = setting(None, env="FORGE_TEACHER_API_KEY", secret=True,
                                          help="API key the teacher's actors require.")
    distill_weight: float = setting(1.0, min=0, max=1,
                                    help="With --teacher, each token's advantage is (1 − w) × the reward's + w × "
                                         "(log π_teacher − log π_student) at that token (1: distillation alone).")
    teacher_requests: int = setting(64, min=1, help="With --teacher: scoring requests in flight to its actors at once "
                                                    "(they batch them).")
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    window: WindowConfig = field(default_factory=WindowConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def check(self) -> None:
        if (self.pool_path is None) == (self.pool_address is None):
            raise SettingsError("give exactly one of --pool and --pool-address")
        try:
            check_impl(self.model, self.model_impl)
        except ValueError as exc:
            raise SettingsError(f"--model-impl {self.model_impl}: {exc}") from None
        if self.nnodes > 1 and self.rdzv_endpoint is None:
            raise SettingsError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's rendezvous address)")
        if self.node_rank >= self.nnodes:
            raise SettingsError(f"--node-rank {self.node_rank} is not below --nnodes {self.nnodes}")
        self._check_world()
        if self.trainer.context_parallel > 1 and not self.trainer.tree:
            raise SettingsError("--context-parallel splits packed trees: it needs --tree")
        if (self.teacher is None) != (not self.teacher_actors):
            raise SettingsError("--teacher and --teacher-actor go together: the teacher model and the actors serving "
                                "it (forge up starts them)")
        if (self.weights_key is None) != (self.weights_clients is None):
            raise SettingsError("--weights-key and --weights-clients go together")
        if self.loss.kind == "dr_grpo" and self.loss.function is None and self.reward.normalize != "none":
            raise SettingsError(f"--loss dr_grpo divides no advantage by a standard deviation: give --normalize none "
                                f"(not {self.reward.normalize})")

    @property
    def planned_processes(self) -> int:
        """The processes this command launches: --nproc on each of --nnodes nodes."""
        return self.nproc * self.nnodes

    def _check_world(self) -> None:
        """--context-parallel against the job's processes: under torchrun the world it launched (WORLD_SIZE), which
        --nproc and --nnodes must then describe where they ask for more than one process (torchrun started by hand
        may leave them out); else the processes this command will launch."""
        context, planned = self.trainer.context_parallel, self.planned_processes
        flags = f"--nproc {self.nproc} x --nnodes {self.nnodes}"
        if variables.is_set("WORLD_SIZE"):
            world, counted = int(variables.read("WORLD_SIZE")), "launched by torchrun (WORLD_SIZE)"
            if planned > 1 and planned != world:
                raise SettingsError(f"{flags} asks for {planned} processes, but torchrun launched {world} "
                                    f"(WORLD_SIZE): give the same, or leave --nproc and --nnodes to torchrun")
        else:
            world, counted = planned, f"({flags})"
        if world % context:
            raise SettingsError(f"--context-parallel {context} must divide the job's {world} processes {counted}")
