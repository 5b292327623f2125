"""Fault injection for tests and drills: a publisher told to corrupt chunks on the wire or to serve slowly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Faults:
    """``corrupt_chunks``: (version, chunk index) pairs whose bytes are served with one byte flipped (the manifest's
    hashes stay those of the true bytes); ``chunk_delay_s``: a pause before serving each chunk."""

    corrupt_chunks: frozenset[tuple[int, int]] = frozenset()
    chunk_delay_s: float = 0.0

    def on_wire(self, version: int, index: int, parts: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        if (version, index) not in self.corrupt_chunks:
            return parts
        data = np.concatenate(parts)
        data[data.size // 2] ^= 0xFF
        return (data,)
