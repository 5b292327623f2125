"""On-policy distillation: a teacher model, served by actors of its own, scores the tokens the student sampled, and
every token's advantage moves toward the teacher's log-probability there.

For completion token t of a sample, with A the reward's advantage of its call and w = ``distill_weight``:

    Â_t = (1 − w) · A + w · (log π_T(x_t | x_<t) − log π_S(x_t | x_<t))

where log π_S is the behaviour log-probability the actor recorded (the distribution the token was drawn from). The
policy loss raising Σ_t Â_t log π_θ(x_t) with w = 1 descends the reverse KL, KL(π_S ‖ π_T) = E_{x ~ π_S}[log π_S −
log π_T], whose per-token estimate over the batch the step reports (``distill_kl``, per domain too). It is a change
of advantages only, so every loss, tree packing, LoRA and experts work with it unchanged.

The teacher's log-probabilities come from the actors' scoring requests (``GenerateRequest.score_from``): one per
sample, its prompt and completion scored from the completion's first token, all of a step's sent together (at most
``teacher_requests`` in flight, which the actors batch), each to the actor its first tokens pick, so a group's
samples and a session's calls, which share their beginning, meet their cached prefix there.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from forge.learner.samples import Sample
from forge.rpc.client import connect
from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

AFFINITY_TOKENS = 64        # the leading tokens that pick a sample's actor
SCORE_TIMEOUT_S = 600.0     # one scoring request, queued behind the others on a busy actor included
UNREACHABLE_WAIT_S = 900.0  # how long every teacher actor may be unreachable (loading, restarting) before a step fails
UNREACHABLE_RETRY_S = 2.0


class TeacherError(RuntimeError):
    """The teacher's actors could not score a sample."""


def check_same_tokenizer(student: str, teacher: str) -> None:
    """ValueError, in one line, unless ``teacher`` has ``student``'s tokenizer (the same tokens with the same ids):
    the teacher scores the student's token ids as they are."""
    from forge.checkpoints import load_tokenizer

    ours, theirs = load_tokenizer(student), load_tokenizer(teacher)
    vocab, other = ours.backend.get_vocab(with_added_tokens=True), theirs.backend.get_vocab(with_added_tokens=True)
    if vocab == other:
        return
    differing = sorted(token for token in vocab.keys() | other.keys() if vocab.get(token) != other.get(token))
    raise ValueError(f"the teacher {teacher} does not share the student's tokenizer ({student}): {len(vocab)} and "
                     f"{len(other)} tokens, {len(differing)} differing (e.g. {differing[:3]}); distill from a teacher "
                     f"of the same tokenizer")


def distilled_advantages(samples: Sequence[Sample], teacher: Sequence[Sequence[float]], weight: float) -> None:
    """Give each sample its per-token advantages (``Sample.token_advantages``) from the teacher's log-probs of its
    completion tokens."""
    for sample, scores in zip(samples, teacher, strict=True):
        if len(scores) != sample.num_completion:
            raise TeacherError(f"the teacher scored {len(scores)} tokens of a completion of {sample.num_completion}")
        sample.token_advantages = [(1 - weight) * sample.advantage + weight * (t - s)
                                   for t, s in zip(scores, sample.old_logprobs, strict=True)]


def distill_figures(samples: Sequence[Sample], teacher: Sequence[Sequence[float]]) -> dict[str, float]:
    """The batch's reverse-KL estimate, mean over tokens of log π_S − log π_T: overall and per domain."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for sample, scores in zip(samples, teacher, strict=True):
        gap = sum(s - t for s, t in zip(sample.old_logprobs, scores, strict=True))
        for key in ("", sample.domain):
            sums[key][0] += gap
            sums[key][1] += len(scores)
    figures = {"distill_kl" if not key else f"distill_kl/{key}": total / count
               for key, (total, count) in sums.items() if count}
    return figures


class TeacherScorer:
    """The teacher's actors (``host:port`` each, keyed with ``api_key``), asked for the log-probs of samples'
    completions, ``requests`` at a time."""

    def __init__(self, actors: Sequence[str], api_key: str | None, requests: int) -> None:
        if not actors:
            raise ValueError("no teacher actor to score with")
        self.actors = tuple(actors)
        self._channels = [connect(address, api_key) for address in self.actors]
        self._stubs = [actor_pb2_grpc.ActorStub(channel) for channel in self._channels]
        self._threads = ThreadPoolExecutor(max_workers=requests, thread_name_prefix="teacher")

    def score(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Per sample, the teacher's log-probability of each completion token; TeacherError naming the actor and
        the reason when one cannot be had from any actor."""
        return list(self._threads.map(self._score_one, samples))

    def _score_one(self, sample: Sample) -> list[float]:
        """The sample's scores from its actor, else the next one; while every actor is unreachable (still loading
        the teacher, restarting), asked again for up to ``UNREACHABLE_WAIT_S``."""
        if not sample.num_completion:
            return []
        first = self._actor_of(sample)
        deadline = time.monotonic() + UNREACHABLE_WAIT_S
        while True:
            reasons, unreachable = [], True
            for turn in range(len(self.actors)):          # the next actor where one is down
                index = (first + turn) % len(self.actors)
                try:
                    return self._ask(index, sample)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:        # the same on every actor
                        raise TeacherError(f"teacher actor {self.actors[index]} refused a sample: "
                                           f"{exc.details()}") from None
                    unreachable &= exc.code() == grpc.StatusCode.UNAVAILABLE
                    reasons.append(f"{self.actors[index]}: {exc.code().name} {exc.details()}")
            if not unreachable or time.monotonic() > deadline:
                raise TeacherError(f"no teacher actor scored a sample: {'; '.join(reasons)}")
            log.warning("no teacher actor is reachable (%s): asking again", "; ".join(reasons))
            time.sleep(UNREACHABLE_RETRY_S)

    def _actor_of(self, sample: Sample) -> int:
        head = sample.tokens[:min(AFFINITY_TOKENS, sample.prompt_len)]
        digest = hashlib.blake2b(repr(head).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % len(self.actors)

    def _ask(self, index: int, sample: Sample) -> list[float]:
        request = actor_pb2.GenerateRequest(prompt_ids=sample.tokens, score_from=sample.prompt_len,
                                            session_id=sample.session_id)
        scores: list[float] = []
        for chunk in self._stubs[index].Generate(request, timeout=SCORE_TIMEOUT_S):
            scores.extend(chunk.logprobs)
            if chunk.finish_reason == common_pb2.FINISH_REASON_STOP:
                return scores
            if chunk.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                raise TeacherError(f"teacher actor {self.actors[index]} did not score a sample: "
                                   f"{chunk.error or common_pb2.FinishReason.Name(chunk.finish_reason)}")
        raise TeacherError(f"teacher actor {self.actors[index]}'s stream ended without a finish reason")

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        for channel in self._channels:
            channel.close()


class Distillation:
    """Distillation's part of a step, run on every rank: rank 0 asks the teacher's actors (``scorer``; None on the
    other ranks), every rank gets their log-probs and sets the same advantages."""

    def __init__(self, weight: float, scorer: TeacherScorer | None) -> None:
        self.weight = weight
        self.scorer = scorer

    def apply(self, samples: list[Sample], distributed) -> dict[str, float]:
        """Set the samples' per-token advantages; the step's distillation figures."""
        if not samples:
            return {}
        started = time.perf_counter()
        scores = self.scorer.score(samples) if self.scorer is not None else None
        if distributed.enabled:
            scores = distributed.broadcast(scores)
        distilled_advantages(samples, scores, self.weight)
        return {**distill_figures(samples, scores), "teacher_s": time.perf_counter() - started}

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
