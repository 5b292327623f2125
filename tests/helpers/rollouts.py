"""Fill a pool with real rollouts: sessions sampled by the embedded torch engine, recorded as the gateway would
(prompt ids, sampled ids, behaviour log-probs and versions, and a model with experts' routing), closed with a
verifiable reward."""

from __future__ import annotations

import random

from forge.actors.backend import GenerationRequest
from forge.actors.engine.engine import TorchEngine
from forge.expert_routing import encode as encode_routing
from forge.sampling.params import SamplingParams
from forge.sampling.wire import sampling_to_proto
from forge.v1 import pool_pb2

EVEN_REWARD = "even_fraction"


def even_fraction(tokens: list[int]) -> float:
    """A learnable toy reward: the share of even token ids in the completion."""
    return sum(1 for t in tokens if t % 2 == 0) / max(1, len(tokens))


def fill_pool(pool, engine: TorchEngine, groups: int, group_size: int = 2, calls: int = 1, max_tokens: int = 8,
              params: SamplingParams | None = None, seed: int = 0, domains: tuple[str, ...] = ("qa",),
              vocab: int = 1000) -> list[str]:
    """Sessions of ``groups`` groups (in queue order); each session makes ``calls`` calls whose prompts extend the
    previous call's prompt and completion. Returns the session ids."""
    rng = random.Random(seed)
    session_ids = []
    for group in range(groups):
        domain = domains[group % len(domains)]
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randrange(4, 12))]
        for _ in range(group_size):
            record = pool.open_session(task_id=f"task-{group}", domain=domain, group_id=f"g{seed}-{group}",
                                       group_size=group_size)
            sid = record.session_id
            context = list(prompt)
            completion: list[int] = []
            for index in range(calls):
                sampling = params or SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True,
                                                    seed=rng.randrange(2**31))
                chunks = list(engine.submit(GenerationRequest("", context, sampling)))
                completion = [t for c in chunks for t in c.token_ids]
                routed = chunks[-1].routed_experts
                pool.append_call(pool_pb2.CallRecord(
                    session_id=sid, index=index, prompt_ids=context, completion_ids=completion,
                    logprobs=[lp for c in chunks for lp in c.logprobs],
                    weight_versions=[v for c in chunks for v in c.weight_versions], actor="test",
                    finish_reason=1, sampling=sampling_to_proto(sampling),
                    routed_experts=None if routed is None else encode_routing(routed.ids, routed.num_experts)))
                context = [*context, *completion, rng.randrange(1, vocab)]
            pool.close_session(session_id=sid, outcome_rewards={EVEN_REWARD: even_fraction(completion)})
            session_ids.append(sid)
    return session_ids
