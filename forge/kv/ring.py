"""Consistent hashing of block hashes over cache servers: each server owns many points on a 64-bit ring, a block
belongs to the server owning the first point at or after its hash. Adding or removing one of N servers moves about
1/N of the blocks; every client given the same addresses (in any order) maps every block to the same server."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence


def _point(data: bytes) -> int:
    return int.from_bytes(data[:8], "big")


class HashRing:
    def __init__(self, servers: Sequence[str], points_per_server: int = 128) -> None:
        servers = list(dict.fromkeys(servers))
        if not servers:
            raise ValueError("a hash ring needs at least one server")
        self.servers = servers
        ring = sorted((_point(hashlib.blake2b(f"{server}#{i}".encode(), digest_size=8).digest()), server)
                      for server in servers for i in range(points_per_server))
        self._points = [p for p, _ in ring]
        self._owners = [s for _, s in ring]

    def server_for(self, block_hash: bytes) -> str:
        index = bisect.bisect_left(self._points, _point(block_hash))
        return self._owners[index % len(self._owners)]

    def split(self, hashes: Sequence[bytes]) -> dict[str, list[int]]:
        """Indices of ``hashes`` per owning server, in order."""
        groups: dict[str, list[int]] = {}
        for index, block_hash in enumerate(hashes):
            groups.setdefault(self.server_for(block_hash), []).append(index)
        return groups
