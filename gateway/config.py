"""Settings of a gateway process: model, actors, pool, listeners, keys, routing, sessions, limits."""

from __future__ import annotations

from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"


@dataclass
class GatewayConfig:
    model: str = "tiny"                         # 'tiny' or a checkpoint directory (tokenizer, template, context)
    model_name: str = "forge-tiny"              # the name served at /v1/models and echoed in responses
    actors: list[str] = field(default_factory=list)     # host:port of each actor
    actor_api_key: str | None = None
    pool_path: str | None = None                # local LMDB pool, opened in this process
    pool_address: str | None = None             # or a remote Pool service
    pool_api_key: str | None = None
    host: str = LOOPBACK
    grpc_port: int = 50053                      # 0 = any free port
    http_port: int = 8000                       # 0 = any free port
    api_keys: tuple[str, ...] = ()              # when set, nothing but health is served without a key
    session_key_secret: str | None = None       # HMAC secret of per-session keys (random per process if unset)
    router: str = "cost-aware"                  # cost-aware | least-loaded | round-robin | cache-aware | kv-overlap
    session_affinity: bool = True
    session_timeout_s: float = 600.0            # open sessions idle this long are closed as failed
    expiry_interval_s: float | None = None      # how often to expire (default: timeout / 4, at most 30 s)
    max_body_bytes: int = 16 * 1024 * 1024
    tool_parser: str = "hermes"
    reasoning_parser: str = "think"
    fail_sessions_on_call_error: bool = True    # EndSession records a session with a failed call as failed
    health_interval_s: float = 2.0              # actor health checks
    shutdown_grace_s: float = 30.0              # in-flight calls may finish for this long on SIGTERM
    tito_max_calls: int = 64                    # earlier calls of a session kept for splicing

    def expiry_every_s(self) -> float:
        if self.expiry_interval_s is not None:
            return self.expiry_interval_s
        return max(0.05, min(30.0, self.session_timeout_s / 4))
