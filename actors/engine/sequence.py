"""One request's state inside the torch engine: its tokens, KV blocks, sampler state and timing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import torch

from forge.actors.backend import GenerationRequest, InvalidRequest, RequestStream, TokenChunk
from forge.kvhash import block_hash
from forge.sampling.logit_edits import CompletionEdits
from forge.sampling.params import SamplingParams


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
    stream_interval: int = 0        # tokens per chunk after the first; 0 = the engine's (EngineConfig)
    unsent: TokenChunk | None = None  # tokens sampled but not streamed yet
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    arrived: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    preemptions: int = 0
    edits: CompletionEdits | None = None  # min_tokens, grammar, logit_bias, penalties (see forge.sampling.logit_edits)
    prefill_only: bool = False          # finish after the first token, once the prompt's blocks are in L3
    room: int = 0                       # prefill_only: the tokens the request may have in all, its first included
    handover_version: int | None = None  # a continuation: the weight version that sampled its first token
    forced: tuple[int, float] | None = None  # a continuation's first token and its log-prob, taken instead of a draw
    adapter: str = ""                   # the named adapter it is sampled with ("": the engine's own weights)
    failure: str | None = None          # why its grammar failed in a step: the step ends it with this error
    score_from: int = 0                 # a scoring request: the first position it scores (0: it generates)
    scores: list[float] = field(default_factory=list)   # scoring: log p of token score_from + i, as computed
    score_versions: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, request: GenerationRequest, request_id: str, stream: RequestStream, max_tokens: int,
           stops: frozenset[int], seed: int, edits: CompletionEdits | None) -> Sequence:
        """The state of a checked ``request`` (its resolved ``max_tokens`` and ``stops``); InvalidRequest for a
        continuation whose first token its grammar does not allow."""
        prompt = list(request.prompt_ids)
        seq = cls(request_id, prompt, len(prompt), request.params, stream, 1 if request.prefill_only else max_tokens,
                  stops, seed=seed, stream_interval=request.stream_interval, edits=edits,
                  prefill_only=request.prefill_only, room=max_tokens, adapter=request.adapter,
                  score_from=request.score_from)
        given = request.continuation
        if given is not None and edits is not None and edits.matcher is not None \
                and not edits.matcher.allows(given.token_ids[0]):
            raise InvalidRequest(f"the continuation's first token {given.token_ids[0]} does not follow the grammar")
        if given is not None:
            seq.forced = (given.token_ids[0], given.logprobs[0])
            seq.handover_version = given.weight_version
        return seq

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    def current_edits(self) -> CompletionEdits | None:
        """The sequence's edits, caught up with the tokens it has (a continuation's given first token too)."""
        edits = self.edits
        if edits is not None:
            for token in self.token_ids[self.num_prompt + edits.taken:]:
                edits.consume(token)
        return edits

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

    @property
    def logits_from(self) -> int:
        """The first position whose logits the request needs: the one before the first scored token, or its last
        (to sample the next). Prefix-cached blocks end before it, since a cached position is not computed."""
        return self.score_from - 1 if self.score_from else len(self.token_ids) - 1

    @property
    def num_pending(self) -> int:
        """Known tokens whose KV is not computed yet (the rest of a prompt, or the last sampled token)."""
        return len(self.token_ids) - self.num_computed


SAMPLE, DRAFT, ACCEPT, RESIDUAL = range(4)


def uniforms(seqs: list[Sequence], ahead: int | list[int], purpose: int) -> np.ndarray:
    """The uniforms in [0, 1) that decide token ``len(seq) + ahead`` of each sequence for ``purpose`` (a sample, a
    draft, an acceptance test, a residual draw): splitmix64(seed ^ splitmix64(position * 4 + purpose)) / 2**64, a
    pure function of (seed, position, purpose), so a seeded request draws the same tokens whatever the batch, the
    preemptions, the prefix hits or the drafts discarded along the way. float64 [len(seqs)]."""
    count = len(seqs)
    seeds = np.fromiter((seq.seed for seq in seqs), np.uint64, count)
    positions = np.fromiter((len(seq) for seq in seqs), np.uint64, count) + np.asarray(ahead, dtype=np.uint64)
    return _splitmix64(seeds ^ _splitmix64(positions * np.uint64(4) + np.uint64(purpose))) / 2.0**64


def _splitmix64(value: np.ndarray) -> np.ndarray:
    """Vigna's splitmix64 finaliser on uint64 arrays (arithmetic wraps modulo 2**64)."""
    value = value + np.uint64(0x9E3779B97F4A7C15)
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))
