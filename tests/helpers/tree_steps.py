"""Tree-packed training against sample-by-sample training, for the learner's tests: random agent batches (G rollouts
of a prompt, multi-call sessions, context-management branches, duplicates, sampling settings), random loss masks,
and one step's loss and gradients either way, asserted equal."""

from __future__ import annotations

import random

import pytest
import torch

from forge.learner.losses import LossConfig, policy_loss
from forge.learner.policy import policy_forward
from forge.learner.samples import Sample, make_micro_batch, micro_batches
from forge.learner.tree import pack_step, stem_forward, tree_policy_forward
from forge.model import CausalLM
from forge.model.generate import generate
from forge.sampling.params import SamplingParams

VOCAB = 37
SETTINGS = ((1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (0.9, 0, 0.8), (0.0, 0, 1.0), (1.1, 7, 0.9))


def make_sample(rng: random.Random, tokens: list[int], prompt_len: int, session: str = "s", call: int = 0,
                setting: tuple[float, int, float] | None = None) -> Sample:
    count = len(tokens) - prompt_len
    temperature, top_k, top_p = setting or rng.choice(SETTINGS)
    return Sample(tokens=list(tokens), prompt_len=prompt_len,
                  old_logprobs=[rng.uniform(-4.0, -0.1) for _ in range(count)], versions=[0] * count,
                  advantage=rng.uniform(-1.5, 1.5), temperature=temperature, top_k=top_k, top_p=top_p, domain="",
                  position=0, session_id=session, call_index=call)


def draw(model: CausalLM, rng: random.Random, context: list[int], count: int,
         setting: tuple[float, int, float]) -> list[int]:
    """``count`` tokens drawn by ``forge.model.generate`` under ``setting`` (so truncated settings keep them in
    support)."""
    temperature, top_k, top_p = setting
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=rng.randrange(2**31),
                            max_tokens=count, ignore_eos=True)
    return generate(model, context, params).token_ids


def agent_batch(model: CausalLM, rng: random.Random, groups: int = 2, group_size: int = 3, calls: int = 3,
                system_len: int = 12, rewrite: float = 0.3, duplicates: float = 0.2) -> list[Sample]:
    """Sessions sharing a system prompt: ``groups`` tasks × ``group_size`` rollouts × up to ``calls`` calls. Greedy
    groups produce identical completions (shared completion nodes with different advantages)."""
    def tokens(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    system = tokens(system_len)
    samples: list[Sample] = []
    for group in range(groups):
        task = system + tokens(rng.randrange(1, 5))
        setting = rng.choice(SETTINGS)
        for rollout in range(group_size):
            context = list(task)
            for call in range(rng.randrange(1, calls + 1)):
                if call and rng.random() < rewrite:
                    # Context management: keep the system prompt and a summary, drop the older turns.
                    context = context[:system_len] + tokens(rng.randrange(1, 4)) + context[-rng.randrange(1, 4):]
                chosen = setting if rng.random() < 0.7 else rng.choice(SETTINGS)
                completion = draw(model, rng, context, rng.randrange(1, 7), chosen)
                sample = make_sample(rng, context + completion, len(context), f"g{group}r{rollout}", call, chosen)
                samples.append(sample)
                if rng.random() < duplicates:     # the same tokens trained twice, with another advantage
                    samples.append(make_sample(rng, sample.tokens, sample.prompt_len, setting=chosen))
                context = context + completion + tokens(rng.randrange(0, 3))
    plain = (1.0, 0, 1.0)
    samples.append(make_sample(rng, [system[0], *tokens(3)], 1, setting=plain))        # a one-token prompt
    samples.append(make_sample(rng, tokens(6), 2, setting=plain))                       # unrelated to the rest
    rng.shuffle(samples)
    return samples


def random_masks(rng: random.Random, samples: list[Sample]) -> dict[int, torch.Tensor]:
    return {id(s): torch.tensor([float(rng.random() < 0.8) for _ in range(s.num_completion)]) for s in samples}


def run(model: CausalLM, samples: list[Sample], config: LossConfig, masks: dict[int, torch.Tensor], tree: bool,
        budget: int, impl: str = "segments", head_chunk: int = 2**26,
        share: bool = True, routing_mode: str = "replay") -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients (on the CPU) of one step, the trainer's way: global normalisers, one backward per
    micro-batch (then the stem's, when the trees share one), on the model's device; a model with experts routes
    as ``routing_mode`` says."""
    device = model.output_weight.device
    total_tokens = float(sum(s.num_completion for s in samples))
    total_samples = float(len(samples))
    total_mtp = float(sum(s.num_completion - (s.prompt_len == 1) for s in samples))
    model.zero_grad(set_to_none=True)
    stem = None
    if tree:
        step = pack_step(samples, budget, device, share=share)
        batches = step.batches
        if step.stem is not None:
            stem = stem_forward(model, step.stem, config.mtp_top_k, impl=impl, block_size=16,
                                routing_mode=routing_mode, piece_tokens=budget)
    else:
        batches = [make_micro_batch(g, device) for g in micro_batches(samples, budget)]
    total = 0.0
    for batch in batches:
        if tree:
            out = tree_policy_forward(model, batch, config.mtp_top_k, impl=impl, block_size=16,
                                      head_chunk=head_chunk, stem=stem, routing_mode=routing_mode)
        else:
            out = policy_forward(model, batch, config.mtp_top_k, routing_mode)
        mask = torch.cat([masks[id(s)] for s in batch.samples]).to(device)
        loss = policy_loss(config, out.logprobs, batch.old_logprobs, batch.advantages, mask, batch.sample_index,
                           total_tokens, total_samples)
        if out.mtp_kl is not None:          # a model with an MTP draft
            loss = loss + config.mtp_weight * out.mtp_kl.sum() / total_mtp
        loss.backward()
        total += float(loss.detach())
    if stem is not None:
        stem.backward()
    return total, {name: p.grad.to("cpu", copy=True) for name, p in model.named_parameters() if p.grad is not None}


def assert_same_step(model, samples, config, masks, budget, impl="segments", linear_budget=4096, head_chunk=2**26,
                     share=True, routing_mode="replay"):
    linear_loss, linear_grads = run(model, samples, config, masks, tree=False, budget=linear_budget,
                                    routing_mode=routing_mode)
    tree_loss, tree_grads = run(model, samples, config, masks, tree=True, budget=budget, impl=impl,
                                head_chunk=head_chunk, share=share, routing_mode=routing_mode)
    assert tree_loss == pytest.approx(linear_loss, rel=1e-5, abs=1e-6)
    assert tree_grads.keys() == linear_grads.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    for name, grad in linear_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(tree_grads[name], grad, atol=1e-5 * scale, rtol=1e-4, msg=name)
