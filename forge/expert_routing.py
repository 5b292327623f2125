"""A call's mixture-of-experts routing as it travels and is stored (``forge.v1.ExpertRouting``): the experts every
sparse layer chose for each position the actor fed through the model, so that the learner can replay them.

In memory a routing is an int32 array [positions, sparse layers, top_k] with -1 where the actor did not compute a
position (its KV blocks came from the L3 cache or another actor). On the wire an id takes one byte when the model
has fewer than 255 experts, two otherwise; the width's largest value stands for -1.
"""

from __future__ import annotations

import numpy as np

from forge.v1 import common_pb2

UNKNOWN = -1


def _wire_dtype(num_experts: int) -> np.dtype:
    return np.dtype(np.uint8) if num_experts < 255 else np.dtype("<u2")


def encode(ids: np.ndarray, num_experts: int) -> common_pb2.ExpertRouting:
    """The message of ``ids`` [positions, layers, top_k] (-1 = not computed)."""
    if ids.ndim != 3:
        raise ValueError(f"a routing is [positions, layers, top_k], got shape {ids.shape}")
    dtype = _wire_dtype(num_experts)
    wire = np.where(ids < 0, np.iinfo(dtype).max, ids).astype(dtype)
    return common_pb2.ExpertRouting(layers=ids.shape[1], top_k=ids.shape[2], num_experts=num_experts,
                                    ids=wire.tobytes())


def positions(message: common_pb2.ExpertRouting) -> int:
    """How many positions a message covers (-1 for a malformed one)."""
    row = message.layers * message.top_k * _wire_dtype(message.num_experts).itemsize
    return len(message.ids) // row if row > 0 and len(message.ids) % row == 0 else -1


def check(message: common_pb2.ExpertRouting) -> int:
    """How many positions a non-empty message covers; raises ValueError for a malformed one. Reads the ids where
    they lie, without converting them (the pool checks every record it appends)."""
    layers, top_k, experts = message.layers, message.top_k, message.num_experts
    if layers <= 0 or top_k <= 0 or not 0 < top_k <= experts:
        raise ValueError(f"a routing record needs layers, top_k and num_experts >= top_k; got {layers}, {top_k}, "
                         f"{experts}")
    dtype = _wire_dtype(experts)
    row = layers * top_k * dtype.itemsize
    if len(message.ids) % row:
        raise ValueError(f"a routing record of {len(message.ids)} bytes is not a whole number of positions of "
                         f"{row} bytes")
    wire = np.frombuffer(message.ids, dtype=dtype)
    named = wire[wire != np.iinfo(dtype).max]
    if named.size and int(named.max()) >= experts:
        raise ValueError(f"a routing record names experts beyond its {experts}")
    return len(message.ids) // row


def decode(message: common_pb2.ExpertRouting) -> np.ndarray | None:
    """The int32 array [positions, layers, top_k] of a message (-1 = not computed), None for an empty one; raises
    ValueError for a malformed one."""
    if not message.ids:
        return None
    check(message)
    dtype = _wire_dtype(message.num_experts)
    wire = np.frombuffer(message.ids, dtype=dtype).reshape(-1, message.layers, message.top_k)
    ids = wire.astype(np.int32)
    ids[wire == np.iinfo(dtype).max] = UNKNOWN
    return ids


def filled(ids: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``ids`` with the positions it did not compute taken from ``other`` where ``other`` has them (the prefill
    actor's routing of a prompt whose KV the decode actor fetched)."""
    out = ids.copy()
    overlap = min(len(out), len(other))
    missing = (out[:overlap] < 0).all(axis=(1, 2))
    out[:overlap][missing] = other[:overlap][missing]
    return out
