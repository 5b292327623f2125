"""Settings of a forge-tinker process: the listeners and the clients' API keys, the run directory where models and
checkpoints live, the base models offered, the protocol's limits (poll hold, body size, sessions), and the settings
of its two parts: training (device, dtype, tokens per micro-batch, ranks) and sampling (the actors, their key, and the
weights channel sampler adapters are published on)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge import variables
from forge.rpc.client import check_addresses
from forge.settings import (
    Settings,
    SettingsError,
    log_level_setting,
    ready_file_setting,
    setting,
)
from forge.weights.endpoints import ADAPTER_SOURCE_ANNOUNCE_PORT, ADAPTER_SOURCE_FETCH_PORT

LOOPBACK = "127.0.0.1"
KEY_PREFIX = "tml-"          # the official SDK refuses any other key
SDK_POLL_TIMEOUT_S = 45.0    # the SDK gives up on a retrieve_future poll after this long
MIB = 2**20


def check_tinker_keys(keys: tuple[str, ...]) -> None:
    for key in keys:
        if not key.startswith(KEY_PREFIX) or len(key) <= len(KEY_PREFIX):
            raise ValueError(f"a Tinker API key starts with {KEY_PREFIX!r} followed by the key itself (the SDK "
                             "refuses any other)")


def check_model_names(names: tuple[str, ...]) -> None:
    for name in names:
        if not name or name != name.strip():
            raise ValueError(f"a base model's name must be non-empty text without surrounding spaces, got {name!r}")


@dataclass(frozen=True, kw_only=True)
class TinkerConfig(Settings):
    host: str = setting(LOOPBACK, help="Interface to bind (loopback by default).")
    port: int = setting(8100, min=0, max=65535, help="Tinker API HTTP port (TINKER_BASE_URL=http://HOST:PORT; GET "
                                                     "/metrics too); 0 picks a free one (see --ready-file).")
    grpc_port: int = setting(50058, min=0, max=65535, help="gRPC port of the Stats service; 0 picks a free one.")
    api_keys: tuple[str, ...] = setting((), flag="api-key", env="FORGE_TINKER_API_KEYS", secret=True,
                                        validate=check_tinker_keys,
                                        help="A client's API key (repeatable; each starts with 'tml-'): every request "
                                             "carries one as X-API-Key, and what a key creates only that key sees. "
                                             "At least one.")
    run_dir: Path = setting(Path("runs/tinker"), path="dir",
                            help="Where the clients' models and checkpoints live (kept across restarts).")
    base_models: tuple[str, ...] = setting(("tiny",), flag="base-model", metavar="MODEL", validate=check_model_names,
                                           help="A base model offered to clients (repeatable): a built-in model "
                                                "('tiny'), a local checkpoint directory or a Hugging Face id.")
    poll_hold_s: float = setting(30.0, flag="poll-hold", min=0.0, max=SDK_POLL_TIMEOUT_S - 5,
                                 help="Seconds a retrieve_future poll is held open while the result is not ready "
                                      "(then 'try again'); under the SDK's 45 s timeout.")
    max_body_bytes: int = setting(64 * MIB, flag="max-body-mb", scale=MIB, min=MIB, unit="MiB",
                                  help="Largest request body accepted (larger: 413); the SDK is told to split "
                                       "forward_backward batches below it.")
    session_timeout_s: float = setting(600.0, flag="session-timeout", min=1.0,
                                       help="Seconds without a heartbeat after which a session ends and its models "
                                            "are unloaded (their checkpoints stay).")
    max_pending: int = setting(4096, min=1, help="Requests accepted but not finished, over all clients (beyond: 429, "
                                                 "which the SDK retries later).")
    device: str = setting("auto", help="Training device: cpu, cuda, cuda:N, or auto.")
    dtype: str = setting("auto", choices=("auto", "float32", "bfloat16", "float16"),
                         help="Dtype of the base model's weights for training (auto: bfloat16 on a GPU, float32 on "
                              "CPU).")
    token_budget: int = setting(8192, min=1, help="Tokens per training micro-batch: a forward_backward batch is run "
                                                  "in micro-batches of at most this many tokens.")
    nproc: int = setting(1, min=1, help="Training processes on this machine (one per GPU): with more than one, "
                                       "forge-tinker relaunches itself under torchrun; rank 0 serves the API and "
                                       "every rank trains its share of each batch on the base model sharded with "
                                       "FSDP2 (gloo on CPU, NCCL on GPUs).")
    collective_timeout_s: float = setting(600.0, min=1, help="With --nproc > 1: how long a collective waits for a "
                                                             "silent rank before the server stops (a rank that dies "
                                                             "stops it at once).")
    actors: tuple[str, ...] = setting((), flag="actor", metavar="HOST:PORT", validate=check_addresses,
                                      help="An actor that samples for the clients (repeatable). Without one, "
                                           "sampling is refused.")
    actor_api_key: str | None = setting(None, env="FORGE_TINKER_ACTOR_API_KEY", secret=True,
                                        help="API key the actors require.")
    weights_fetch: str = setting(f"tcp://{LOOPBACK}:{ADAPTER_SOURCE_FETCH_PORT}",
                                 help="ZeroMQ endpoint actors fetch sampler adapters from ('tcp://127.0.0.1:*' picks "
                                      "a free port).")
    weights_announce: str = setting(f"tcp://{LOOPBACK}:{ADAPTER_SOURCE_ANNOUNCE_PORT}",
                                    help="ZeroMQ endpoint new sampler adapters are announced on.")
    ready_file: Path | None = ready_file_setting("address, base_url, pid, weights_fetch, weights_announce, "
                                                 "metrics_url")
    log_level: str = log_level_setting()

    def check(self) -> None:
        if self.nproc > 1 and variables.is_set("WORLD_SIZE") and int(variables.read("WORLD_SIZE")) != self.nproc:
            raise SettingsError(f"--nproc {self.nproc} asks for {self.nproc} ranks, but torchrun launched "
                                f"{variables.read('WORLD_SIZE')} (WORLD_SIZE): give the same, or leave --nproc to "
                                "torchrun")
        if not self.api_keys:
            raise SettingsError("give at least one --api-key (or --api-key-file): every Tinker client needs a key "
                                "starting with 'tml-'")
