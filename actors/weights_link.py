"""An actor's link to the learner's weights: a subscription that loads every verified version into its backend, and
the relay that re-serves those versions to other actors (a tree of relays spreads one learner's versions over many
actors). Used by forge-actor and by the torch engine's core process, which subscribes itself."""

from __future__ import annotations

import logging

log = logging.getLogger("forge.actor")


def weight_subscriber(backend, fetch: str, announce: str, curve=None, relay=None, adapter: str = ""):
    """Follow the learner's weight versions into ``backend`` (over CURVE with ``curve``, a
    ``forge.weights.curve.ClientKeys``); a version it refuses (wrong tensors, stale) is logged and the current one
    keeps serving. ``relay`` (a ``forge.weights.WeightRelay``) re-serves every verified version to other actors.
    ``adapter``: the versions are those of this named adapter (another run's learner), served beside the weights."""
    from forge.weights import WeightSubscriber

    def apply(version: int, tensors: dict) -> None:
        try:
            if adapter:
                backend.load_adapter(adapter, version, tensors)
            else:
                backend.load_weights(version, tensors)
        except ValueError as exc:
            log.error("%s version %d refused: %s", f"adapter {adapter}" if adapter else "weight", version, exc)

    return WeightSubscriber(fetch, announce, on_version=apply, curve=curve,
                            on_verified=relay.serve if relay is not None else None)


def weight_relay(fetch: str, announce: str, curve=None):
    """A ``forge.weights.WeightRelay`` bound to ``fetch`` and ``announce`` (over CURVE with ``curve``, a
    ``forge.weights.curve.ServerKeys``: this actor's key pair and the directory of the actors it serves); raises
    OSError when an endpoint cannot be bound."""
    from forge.weights import WeightRelay

    return WeightRelay(fetch, announce, curve=curve)
