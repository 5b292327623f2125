"""Settings of a forge-gateway process: model, actors, pool, listeners, keys, routing, sessions, limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge.adapter_names import check_adapter_name
from forge.checkpoints import cached_model
from forge.gateway.routing import DEFAULT_ROUTER, router_class
from forge.parsing.reasoning import REASONING_PARSERS
from forge.parsing.tools import TOOL_PARSERS
from forge.rpc.client import check_address, check_addresses
from forge.settings import (
    Settings,
    SettingsError,
    grammar_memory_setting,
    grammar_timeout_setting,
    log_level_setting,
    ready_file_setting,
    setting,
)

LOOPBACK = "127.0.0.1"


def check_model_name(name: str) -> None:
    if not name or name != name.strip():
        raise ValueError(f"a model name must be non-empty text without surrounding spaces, got {name!r}")


def check_model_names(names: tuple[str, ...]) -> None:
    for name in names:
        check_model_name(name)


@dataclass(frozen=True, kw_only=True)
class GatewayConfig(Settings):
    model: str = setting("tiny", validate=cached_model,
                         help="Checkpoint directory (tokenizer, chat template, context length), a Hugging Face id "
                              "(org/name[@revision], read from the Hugging Face cache: forge model fetch), or 'tiny' / "
                              "'tiny-moe'.")
    model_name: str = setting("forge-tiny", validate=check_model_name,
                              help="The model name served at /v1/models and echoed in responses.")
    served_model_names: tuple[str, ...] = setting((), flag="served-model-name", metavar="NAME",
                                                  validate=check_model_names,
                                                  help="Another name requests on the global URL may give for the "
                                                       "model (repeatable), as vLLM's --served-model-name. A "
                                                       "session's URL serves any name.")
    actors: tuple[str, ...] = setting((), flag="actor", metavar="HOST:PORT", validate=check_addresses,
                                      help="An actor to route calls to (repeatable; at least one, unless "
                                           "--actors-dir announces them).")
    prefill_actors: tuple[str, ...] = setting((), flag="prefill-actor", metavar="HOST:PORT", validate=check_addresses,
                                              help="A prefill actor (forge-actor --role prefill, repeatable): calls "
                                                   "are then prefilled there and continued on the --actor ones "
                                                   "(decode actors), their KV handed over through the L3 cache.")
    prefill_min_tokens: int = setting(64, min=1, help="With --prefill-actor: a call whose prompt has fewer tokens "
                                                      "not already cached on its decode actor skips the prefill "
                                                      "pool.")
    actors_dir: Path | None = setting(None, path="dir", metavar="DIR",
                                      help="A directory of actors' ready files (forge-actor --ready-file "
                                           "DIR/NAME.json), on storage shared with the actors: an actor joins when "
                                           "its file appears and is drained when it is removed (created if "
                                           "missing). Combines with --actor.")
    discovery_interval_s: float = setting(2.0, flag="discovery-interval", min=0.05,
                                          help="With --actors-dir: seconds between looks at the directory (it is "
                                               "polled: inotify does not work on NFS).")
    drop_after_s: float = setting(30.0, flag="drop-after", min=0.0,
                                  help="With --actors-dir: an announced actor whose health checks fail for this "
                                       "many seconds (two checks at least) is dropped, until its ready file is "
                                       "rewritten or it answers again.")
    actor_api_key: str | None = setting(None, env="FORGE_GATEWAY_ACTOR_API_KEY", secret=True,
                                        help="API key the actors require.")
    pool_path: str | None = setting(None, flag="pool", help="Data Pool directory (LMDB), opened in this process.")
    pool_address: str | None = setting(None, metavar="HOST:PORT", validate=check_address,
                                       help="Or a remote Pool service.")
    pool_api_key: str | None = setting(None, env="FORGE_GATEWAY_POOL_API_KEY", secret=True,
                                       help="API key of the remote Pool service.")
    host: str = setting(LOOPBACK, help="Interface to bind (loopback by default).")
    grpc_port: int = setting(50053, min=0, max=65535, help="gRPC port; 0 picks a free one (see --ready-file).")
    http_port: int = setting(8000, min=0, max=65535, help="OpenAI-compatible HTTP port; 0 picks a free one.")
    api_keys: tuple[str, ...] = setting((), flag="api-key", env="FORGE_GATEWAY_API_KEYS", secret=True,
                                        help="Require this API key (repeatable); only health is served without one. "
                                             "Per-session keys are accepted for their own session.")
    session_key_secret: str | None = setting(None, env="FORGE_GATEWAY_SESSION_KEY_SECRET", secret=True,
                                             help="Secret that signs per-session keys; keep it to keep keys valid "
                                                  "across restarts [default: random per process].")
    router: str = setting(DEFAULT_ROUTER, metavar="NAME|MODULE:CLASS", validate=router_class,
                          help="How calls are spread over actors: least estimated time to first token (cost-aware), "
                               "best prefix match unless imbalanced (cache-aware), prefix overlap plus load "
                               "(kv-overlap), fewest in-flight calls (least-loaded), or in turn (round-robin); or "
                               "your own Router subclass by dotted path (my_pkg.routers:MyRouter). See "
                               "docs/gateway.md and docs/cache.md.")
    session_affinity: bool = setting(True, help="Keep a session on the actor that served it (prefix cache): while it "
                                                "is healthy, or with the KV-aware routers while it is not overloaded.")
    session_timeout_s: float = setting(600.0, flag="session-timeout", min=0.01,
                                       help="Seconds without a call after which an open session is closed as "
                                            "failed.")
    expiry_interval_s: float | None = setting(None, flag="expiry-interval", min=0.01,
                                              help="Seconds between looks for idle sessions [default: a quarter of "
                                                   "--session-timeout, at most 30].")
    max_body_bytes: int = setting(16 * 1024 * 1024, min=1024, help="Largest HTTP request body accepted (larger: 413).")
    grammar_memory_mb: int = grammar_memory_setting()
    grammar_timeout_s: float = grammar_timeout_setting()
    tool_parser: str = setting("auto", choices=("auto", *TOOL_PARSERS, "none"),
                               help="Tool-call syntax parsed out of completions: a model family's, or auto (read from "
                                    "the chat template, else config.json's model_type; hermes if neither says).")
    reasoning_parser: str = setting("auto", choices=("auto", *REASONING_PARSERS, "none"),
                                    help="Reasoning syntax parsed out of completions: think (<think>...</think>), "
                                         "mistral ([THINK]...[/THINK]), or auto (the tags the chat template "
                                         "writes; none if it writes neither).")
    fail_sessions_on_call_error: bool = setting(True, help="EndSession records a session as failed if one of its "
                                                           "calls failed mid-stream.")
    health_interval_s: float = setting(2.0, flag="health-interval", min=0.05,
                                       help="Seconds between health checks of each actor.")
    shutdown_grace_s: float = setting(30.0, flag="shutdown-grace", min=0,
                                      help="Seconds in-flight calls may take to finish on SIGTERM.")
    tito_max_calls: int = setting(64, min=1, help="Earlier calls of a session kept for token-in-token-out splicing.")
    adapter: str | None = setting(None, metavar="NAME",
                                  help="Several runs on one actor fleet: sample every call with the actors' LoRA "
                                       "adapter NAME (forge-actor --adapter NAME=...; this gateway's run), recorded "
                                       "with each call in the pool.")
    ready_file: Path | None = ready_file_setting("grpc_address, http_address, base_url, pid")
    log_level: str = log_level_setting()

    def check(self) -> None:
        if not self.actors and self.actors_dir is None:
            raise SettingsError("give at least one --actor HOST:PORT, or --actors-dir DIR")
        both = set(self.actors) & set(self.prefill_actors)
        if both:
            raise SettingsError(f"{sorted(both)[0]} is given as --actor and as --prefill-actor; an actor has one role")
        if self.adapter is not None:
            try:
                check_adapter_name(self.adapter)
            except ValueError as exc:
                raise SettingsError(f"--adapter: {exc}") from None
            if self.prefill_actors:
                raise SettingsError("--adapter does not go with --prefill-actor (calls with an adapter are served "
                                    "whole by one actor)")
        if (self.pool_path is None) == (self.pool_address is None):
            raise SettingsError("give exactly one of --pool PATH and --pool-address HOST:PORT")

    def expiry_every_s(self) -> float:
        if self.expiry_interval_s is not None:
            return self.expiry_interval_s
        return max(0.05, min(30.0, self.session_timeout_s / 4))
