"""The one block-hash scheme shared by actors, the L3 cache and the router.

Token ids are cut into blocks of ``block_size``; block i's hash covers the hash of block i-1 and block i's ids, so
it names the whole prefix up to the end of block i. Hashes are salted by the model and the weight version (and
anything else that changes KV, such as whether MTP layers are cached), so KV computed by other weights is never
served. BLAKE2b with a 16-byte digest: fast, stable across processes and machines (unlike Python's ``hash``).
"""

from __future__ import annotations

import functools
import hashlib
import sys
from array import array
from collections.abc import Callable, Sequence
from itertools import islice, takewhile

DIGEST_BYTES = 16


@functools.lru_cache(maxsize=64)
def kv_salt(model_id: str, weight_version: int, variant: str = "") -> bytes:
    """The root of every chain: KV of another model, version or variant never matches. Cached: an engine asks for
    it for every sequence at every step."""
    return hashlib.blake2b(f"{model_id}\0{weight_version}\0{variant}".encode(), digest_size=DIGEST_BYTES).digest()


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    ids = array("i", token_ids)
    if sys.byteorder == "big":
        ids.byteswap()   # hash little-endian int32 everywhere
    return hashlib.blake2b(parent + ids.tobytes(), digest_size=DIGEST_BYTES).digest()


def routing_block_hash(kv_block_hash: bytes) -> bytes:
    """The name under which the L3 cache keeps the expert routing of the KV block named ``kv_block_hash``: one
    digest further, so it is salted as the block is and no chain ever reaches it."""
    return hashlib.blake2b(kv_block_hash + b"\0routing", digest_size=DIGEST_BYTES).digest()


def chain_hashes(token_ids: Sequence[int], block_size: int, salt: bytes) -> list[bytes]:
    """Hashes of every full block of ``token_ids``; the trailing partial block has none."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    hashes: list[bytes] = []
    parent = salt
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


def leading(hashes: Sequence[bytes], contains: Callable[[bytes], bool]) -> int:
    """How many leading ``hashes`` of a chain are held (``contains``). Cached chains are nearly always
    prefix-closed, so the first miss is found by bisection and the run before it checked at C speed; a hole falls
    back to a linear scan."""
    low, high = -1, len(hashes)          # hashes[low] is held (or low = -1); hashes[high] is not (or high = len)
    while low + 1 < high:
        middle = (low + high) // 2
        if contains(hashes[middle]):
            low = middle
        else:
            high = middle
    if all(map(contains, islice(hashes, high))):
        return high
    return sum(1 for _ in takewhile(contains, hashes))
