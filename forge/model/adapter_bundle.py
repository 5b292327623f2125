"""Adapter bundles: the set of named LoRA adapters a publisher wants served at once, sent as one weight version.

A service that saves adapters at run time (Forge's Tinker server: every client's sampler weights) cannot give each
one a weight stream of its own fixed when an actor starts (``forge-actor --adapter``). It publishes one stream, an
*adapter source*, whose every version is a bundle: the whole set of adapters to serve now. An actor following the
source (``forge-actor --adapter-source``) loads the adapters that are new or changed, drops those that are gone,
and leaves the others alone.

A bundle is a plain state dict on the weight channel:

- ``{name}/{key}`` for every tensor of the adapter version ``name`` serves (``forge.model.lora_weights``: its
  ``…lora_A.weight`` / ``…lora_B.weight`` pairs and ``lora.scaling``);
- ``{name}/adapter.version``, a 0-d int64: that adapter's own version. It changes when, and only when, the
  adapter's tensors change, so an actor reloads nothing that is unchanged; a publisher that drops an adapter and
  later publishes it again gives it a newer version (the backends' ledgers take only newer versions of a name they
  still hold, and an actor's KV blocks are keyed by name and version);
- ``adapter_bundle.count``, a 0-d int64: the number of adapters. It marks the version as a bundle (a stream of
  another kind is refused, not misread) and keeps an empty bundle a non-empty state dict, which the channel needs.

Adapter names follow ``forge.adapter_names`` and hold no ``/``, so the first ``/`` of a key ends the name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from forge.adapter_names import check_adapter_name

if TYPE_CHECKING:
    from torch import Tensor

COUNT = "adapter_bundle.count"
VERSION = "adapter.version"
SEPARATOR = "/"

Bundle = dict[str, tuple[int, dict[str, "Tensor"]]]     # adapter name -> (its version, its adapter version's tensors)


def is_bundle(state: Mapping[str, Tensor]) -> bool:
    return COUNT in state


def encode_bundle(adapters: Mapping[str, tuple[int, Mapping[str, Tensor]]]) -> dict[str, Tensor]:
    """The state dict that carries ``adapters`` (name -> (version, tensors)); ValueError for a bad name, a
    negative version, or a tensor named like the version's."""
    import torch

    state: dict[str, Tensor] = {COUNT: torch.tensor(len(adapters), dtype=torch.int64)}
    for name, (version, tensors) in adapters.items():
        check_adapter_name(name)
        if version < 0:
            raise ValueError(f"adapter {name!r}: version {version} is negative")
        if VERSION in tensors:
            raise ValueError(f"adapter {name!r}: a tensor may not be named {VERSION!r}")
        state[f"{name}{SEPARATOR}{VERSION}"] = torch.tensor(version, dtype=torch.int64)
        state.update((f"{name}{SEPARATOR}{key}", tensor) for key, tensor in tensors.items())
    return state


def decode_bundle(state: Mapping[str, Tensor]) -> Bundle:
    """The adapters ``state`` carries (name -> (version, tensors)); ValueError when it is not a well-formed
    bundle."""
    if not is_bundle(state):
        raise ValueError(f"the version is not an adapter bundle (no {COUNT!r} tensor): is the source a learner's "
                         "weight stream?")
    grouped: dict[str, dict[str, Tensor]] = {}
    for key, tensor in state.items():
        if key == COUNT:
            continue
        name, separator, rest = key.partition(SEPARATOR)
        if not separator or not rest:
            raise ValueError(f"bundle tensor {key!r} is not named ADAPTER/KEY")
        grouped.setdefault(check_adapter_name(name), {})[rest] = tensor
    bundle: Bundle = {}
    for name, tensors in grouped.items():
        version = tensors.pop(VERSION, None)
        if version is None or version.numel() != 1 or version.dtype.is_floating_point:
            raise ValueError(f"adapter {name!r} of the bundle has no integer {VERSION!r}")
        if not tensors:
            raise ValueError(f"adapter {name!r} of the bundle has no tensors")
        bundle[name] = (int(version.item()), tensors)
    count = int(state[COUNT].item())
    if count != len(bundle):
        raise ValueError(f"the bundle says it holds {count} adapters, but it holds {len(bundle)}")
    return bundle


__all__ = ["COUNT", "VERSION", "Bundle", "decode_bundle", "encode_bundle", "is_bundle"]
