"""The services Forge runs, each declared once: the program that starts it, its command (whose settings class and
run-file table come with it), the API keys it is given, the Stats service it answers, what its ready file holds,
and how long it may take to start and to stop. ``forge up``, ``forge deploy``, ``forge top``, ``forge keys`` and
``forge config show`` read them here; ``forge.app.command_line`` turns a service's settings into its command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from forge.actors.cli import actor
from forge.cache.cli import cache
from forge.cli.options import SettingsCommand
from forge.gateway.cli import gateway
from forge.learner.cli import learner
from forge.learner.tinker.cli import tinker
from forge.pool.cli import serve_command
from forge.rollout.cli import rollout


@dataclass(frozen=True)
class Service:
    """One kind of service. ``keys`` maps each secret option (its name with underscores) to the kind of key it is
    given: a service's own key has the kind of that service, a client's key the kind of what it calls."""

    kind: str                                   # learner, actor, gateway, cache, pool, rollout, tinker
    program: tuple[str, ...]                    # the command that starts it
    command: SettingsCommand                    # its click command: settings class and run-file table
    keys: Mapping[str, str] = field(default_factory=dict)
    stats: str | None = None                    # the forge.v1 service whose Stats RPC it answers
    ready: tuple[str, ...] = ()                 # what its ready file holds besides pid, the address to call first
    start_s: float = 300.0                      # how long it may take to be ready (model loading, engine start-up)
    stop_s: float = 60.0                        # how long it is given to stop on SIGTERM

    @property
    def settings_class(self) -> type:
        return self.command.settings_class

    @property
    def table(self) -> str:
        """Its table in a run file, and the middle of its FORGE_<TABLE>_<OPTION> variables."""
        return self.command.settings_table

    @property
    def address_field(self) -> str | None:
        """The ready file's field holding its gRPC address (None for a service that serves nothing)."""
        return self.ready[0] if self.ready else None


SERVICES: dict[str, Service] = {s.kind: s for s in (
    Service("learner", ("forge-learner",), learner, keys={"pool_api_key": "pool"}, stats="Learner",
            ready=("address", "weights_fetch", "weights_announce", "step", "version", "metrics_url"),
            start_s=1800.0, stop_s=600.0),                # it stops after its current step, with a checkpoint
    Service("actor", ("forge-actor",), actor, keys={"api_key": "actor", "l3_api_key": "cache"}, stats="Actor",
            ready=("address", "instance", "metrics_url", "relay_fetch", "relay_announce"), start_s=900.0),
    Service("gateway", ("forge-gateway",), gateway, stats="Gateway",
            keys={"api_key": "gateway", "actor_api_key": "actor", "pool_api_key": "pool",
                  "session_key_secret": "session"},
            ready=("grpc_address", "http_address", "base_url")),
    Service("cache", ("forge-cache",), cache, keys={"api_key": "cache"}, stats="Cache",
            ready=("address", "instance", "metrics_url"), stop_s=30.0),
    Service("pool", ("forge", "pool", "serve"), serve_command, keys={"api_key": "pool"}, stats="Pool",
            ready=("address", "kind", "metrics_url")),
    Service("rollout", ("forge", "rollout"), rollout, keys={"api_key": "gateway"}),
    # Its clients' keys (--api-key, 'tml-...') are the operator's to give: the SDK refuses Forge's generated keys.
    Service("tinker", ("forge-tinker",), tinker, keys={"actor_api_key": "actor"}, stats="Tinker",
            ready=("address", "base_url", "weights_fetch", "weights_announce", "metrics_url"), start_s=600.0),
)}

# The kinds of API key a deployment makes, one key each: every service's own, and the secret that signs the
# gateway's per-session keys.
KEY_KINDS: tuple[str, ...] = tuple(dict.fromkeys(kind for s in SERVICES.values() for kind in s.keys.values()))

# Every Stats service by kind, a router's too: Forge runs none of its own, but forge top watches one that serves
# forge.v1.Router.
STATS_SERVICES: dict[str, str] = {**{s.kind: s.stats for s in SERVICES.values() if s.stats}, "router": "Router"}


def stats_method(kind: str) -> str:
    """The full name of the Stats RPC that a service of ``kind`` answers."""
    return f"/forge.v1.{STATS_SERVICES[kind]}/Stats"


def service(kind: str) -> Service:
    try:
        return SERVICES[kind]
    except KeyError:
        raise ValueError(f"no service {kind!r} (one of {', '.join(SERVICES)})") from None
