"""One request's state inside the torch engine: its tokens, KV blocks, sampler state and timing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from forge.actors.backend import RequestStream
from forge.kvhash import block_hash
from forge.model.sampling import SamplingParams


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Draft:
    """A speculative token proposed by the MTP head, with the distribution it was drawn from."""

    token: int
    logprobs: torch.Tensor          # [V] log q(.), after the request's temperature and truncation


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]            # prompt followed by every sampled token
    num_prompt: int
    params: SamplingParams
    stream: RequestStream
    max_tokens: int                 # resolved against the context length
    stop_ids: frozenset[int]
    seed: int = 0
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    chain: list[bytes] = field(default_factory=list)          # its leading full blocks, hashed once (see hashes)
    chain_salt: bytes = b""
    num_computed: int = 0           # tokens whose main-model KV is in the cache
    num_cached_blocks: int = 0      # leading blocks registered in (or taken from) the prefix cache: chain[:n]
    prefix_hit_tokens: int = 0      # tokens served from the prefix cache at the latest admission
    kv_version: int = 0             # weight version of the KV written since the latest admission
    draft: Draft | None = None
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    arrived: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    preemptions: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    def hashes(self, salt: bytes, block_size: int, blocks: int) -> list[bytes]:
        """The sequence's own list (not to be modified) of its full blocks' chained hashes (``forge.kvhash``) under
        ``salt``, extended to at least the first ``blocks``. Token ids only grow, so each block is hashed once per
        request and salt, whoever asks: the prefix lookup, the L3 lookup, the registration of computed blocks."""
        if self.chain_salt != salt:
            self.chain, self.chain_salt = [], salt
        chain = self.chain
        end = max(0, min(blocks, len(self.token_ids) // block_size)) * block_size
        parent = chain[-1] if chain else salt
        for start in range(len(chain) * block_size, end, block_size):
            parent = block_hash(parent, self.token_ids[start:start + block_size])
            chain.append(parent)
        return chain

    def uniform(self, position: int, purpose: int) -> float:
        """The uniform in [0, 1) that decides token ``position`` for ``purpose`` (a sample, a draft, an acceptance
        test, a residual draw). A pure function of (seed, position, purpose): a seeded request draws the same tokens
        whatever the batch, the preemptions, the prefix hits or the drafts discarded along the way."""
        return _splitmix64(self.seed ^ _splitmix64(position * 4 + purpose)) / 2**64

    @property
    def num_pending(self) -> int:
        """Known tokens whose KV is not computed yet (the rest of a prompt, or the last sampled token)."""
        return len(self.token_ids) - self.num_computed


SAMPLE, DRAFT, ACCEPT, RESIDUAL = range(4)
_MASK = 2**64 - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)
