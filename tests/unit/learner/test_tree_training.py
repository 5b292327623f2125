"""Prefix-tree merging, exactness: on random agent batches (G rollouts of a prompt, multi-call sessions,
context-management branches, duplicates, per-sample advantages, sampling parameters and loss masks), tree-packed
training gives the loss and every parameter gradient of sample-by-sample training (``policy_forward`` over
``make_micro_batch``, then ``policy_loss``), for CISPO, PPO and GRPO with the MTP draft loss, in one or several
packed sequences."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from forge.learner.losses import LossConfig
from forge.learner.policy import policy_forward
from forge.learner.rewards import RewardConfig, batch_rewards
from forge.learner.samples import Sample, build_samples, make_micro_batch
from forge.learner.tree import build_trie, pack_step, pack_trees, rank_spans, stem_forward, tree_policy_forward
from forge.model import CausalLM
from forge.pool import Pool
from forge.sampling.params import SamplingParams

from helpers.learner_runs import engine_of
from helpers.random_model import random_model, small_config
from helpers.rollouts import fill_pool
from helpers.threads import one_thread  # noqa: F401  (autouse)
from helpers.tree_steps import VOCAB, agent_batch, assert_same_step, draw, make_sample, random_masks, run

CONFIG = small_config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, head_dim=8)


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return random_model(CONFIG, std=0.3)


_BATCHES: dict[int, list[Sample]] = {}


def seeded_batch(model: CausalLM, seed: int) -> list[Sample]:
    if seed not in _BATCHES:
        _BATCHES[seed] = agent_batch(model, random.Random(seed))
    return _BATCHES[seed]


@pytest.mark.parametrize("kind", ["cispo", "ppo", "grpo", "cispo-per-sequence"])
@pytest.mark.parametrize("budget", [4096, 40])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("share", [True, False], ids=["stem", "recompute"])
def test_tree_step_equals_sample_by_sample(model, kind, budget, seed, share):
    rng = random.Random(seed + 100)
    samples = seeded_batch(model, seed)
    kind, _, per = kind.partition("-per-")
    config = LossConfig(kind=kind, eps_high=0.3, clip_eps=0.2, mtp_weight=0.5, mtp_top_k=5,
                        token_norm="sequence" if per else "token")
    step = pack_step(samples, budget, share=share)
    assert (len(step.batches) == 1) == (budget == 4096)
    assert (step.stem is not None) == (share and budget == 40)
    assert step.num_nodes < sum(len(s.tokens) for s in samples)
    if step.stem is not None:       # every node computed once: the stem's and the trees' own nodes are the trie's
        assert step.num_nodes == build_trie([s.tokens for s in samples]).num_nodes
        assert step.num_nodes < sum(b.num_nodes for b in pack_trees(samples, budget))
    assert_same_step(model, samples, config, random_masks(rng, samples), budget, linear_budget=budget * 2,
                     share=share)


@pytest.mark.parametrize("impl", ["auto", "dense", "gather", "segments"])
def test_every_cpu_attention_path_is_exact(model, impl):
    rng = random.Random(11)
    samples = agent_batch(model, rng, groups=3, group_size=4, calls=4, system_len=40)
    config = LossConfig(mtp_weight=1.0, mtp_top_k=8)
    assert_same_step(model, samples, config, random_masks(rng, samples), budget=150, impl=impl)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["flex", "gather"])
def test_tree_step_on_cuda_equals_sample_by_sample(impl):
    """The GPU paths (flex over a block mask, compiled; gather, the fallback) against sample-by-sample training on
    the GPU, with a head size the compiled flex kernels take (32). (segments is built on a CPU-only kernel.)"""
    net = random_model(small_config(vocab_size=VOCAB, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
                                    head_dim=32), std=0.3)
    rng = random.Random(31)
    samples = agent_batch(net, rng, groups=3, group_size=4, calls=4, system_len=40)
    config = LossConfig(mtp_weight=1.0, mtp_top_k=8)
    cuda = net.cuda()
    for budget in (150, 4096):                      # several packed sequences, then one
        assert_same_step(cuda, samples, config, random_masks(rng, samples), budget=budget, impl=impl)


def test_output_head_in_checkpointed_chunks_is_exact(model):
    rng = random.Random(21)
    samples = seeded_batch(model, 1)
    config = LossConfig(kind="grpo", mtp_weight=0.7, mtp_top_k=6)
    assert_same_step(model, samples, config, random_masks(rng, samples), budget=4096, head_chunk=VOCAB * 7)


def test_per_token_outputs_follow_the_micro_batch_order(model):
    rng = random.Random(5)
    samples = agent_batch(model, rng, groups=2, group_size=4)
    for batch in pack_trees(samples, 60):
        linear = make_micro_batch(batch.samples)
        for name in ("targets", "old_logprobs", "advantages", "temperature", "top_k", "top_p", "sample_index"):
            torch.testing.assert_close(getattr(batch, name), getattr(linear, name), rtol=0, atol=0, msg=name)
        assert batch.num_tokens == linear.num_tokens
        with torch.no_grad():
            expected = policy_forward(model, linear, mtp_top_k=6)
            got = tree_policy_forward(model, batch, mtp_top_k=6, impl="segments", block_size=16)
        torch.testing.assert_close(got.logprobs, expected.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.mtp_kl, expected.mtp_kl, atol=1e-5, rtol=0)
        assert torch.equal(batch.mtp_terms, (linear.positions >= 1).nonzero().squeeze(-1))


def test_shared_nodes_transform_logits_per_sample(model):
    """One prompt, two samples whose completion tokens coincide but whose temperatures, truncation and advantages
    differ; a third sample takes the first sample's completion as its prompt (trained for the first only)."""
    rng = random.Random(3)
    prompt = [rng.randrange(VOCAB) for _ in range(9)]
    completion = draw(model, rng, prompt, 5, (0.0, 0, 1.0))         # the argmax is in every support
    first = make_sample(rng, prompt + completion, len(prompt), setting=(0.6, 0, 1.0))
    second = make_sample(rng, prompt + completion, len(prompt), setting=(1.4, 4, 0.9))
    third = make_sample(rng, prompt + completion + [3, 4], len(prompt) + len(completion), setting=(1.0, 0, 1.0))
    samples = [first, second, third]
    (batch,) = pack_trees(samples, 1000)
    assert batch.num_nodes == len(prompt) + len(completion) + 2
    assert batch.logit_nodes.numel() == len(completion) + 2 and batch.sampling_rows.numel() == 2 * 5 + 2
    config = LossConfig(kind="cispo", mtp_weight=0.3, mtp_top_k=4)
    assert_same_step(model, samples, config, random_masks(rng, samples), budget=1000)


def test_degenerate_batches(model):
    rng = random.Random(8)
    plain = (1.0, 0, 1.0)
    long = make_sample(rng, [rng.randrange(VOCAB) for _ in range(30)], 10, setting=plain)
    empty = make_sample(rng, [1, 2, 3], 3, setting=plain)                # no completion: no terms, still packed
    config = LossConfig(kind="grpo", mtp_weight=0.2, mtp_top_k=3)
    samples = [long, empty, make_sample(rng, [1, 2, 3, 4], 3, setting=plain)]
    batches = pack_trees(samples, 8)                     # the long sample alone exceeds the budget
    assert [b.num_nodes for b in batches] == [4, 30] or sorted(b.num_nodes for b in batches) == [4, 30]
    assert_same_step(model, samples, config, random_masks(rng, samples), budget=8)
    # A batch without any completion token still back-propagates (zero gradients), as a linear micro-batch does.
    (batch,) = pack_trees([empty], 8)
    out = tree_policy_forward(model, batch, mtp_top_k=3)
    assert out.logprobs.numel() == 0 and out.mtp_kl.numel() == 0
    model.zero_grad(set_to_none=True)
    (out.logprobs.sum() + out.mtp_kl.sum()).backward()
    with pytest.raises(ValueError, match="prompt"):
        pack_trees([make_sample(rng, [1, 2], 0)], 8)


def test_real_rollouts_from_the_pool(tmp_path, model):
    """Sessions sampled by the embedded engine and recorded in a real pool, as the trainer reads them."""
    engine = engine_of(model)
    pool = Pool(tmp_path / "pool")
    try:
        fill_pool(pool, engine, groups=3, group_size=3, calls=3, max_tokens=6, vocab=VOCAB,
                  params=SamplingParams(temperature=0.8, top_k=12, max_tokens=6, ignore_eos=True))
        fill_pool(pool, engine, groups=1, group_size=2, calls=2, max_tokens=5, vocab=VOCAB, seed=1)
        fill_pool(pool, engine, groups=1, group_size=2, calls=2, max_tokens=6, vocab=VOCAB, seed=2,     # min_tokens
                  params=SamplingParams(temperature=0.9, top_k=12, max_tokens=6, min_tokens=4,
                                        stop_token_ids=tuple(range(0, VOCAB, 4))))
        fill_pool(pool, engine, groups=1, group_size=2, calls=2, max_tokens=6, vocab=VOCAB, seed=3,     # penalties
                  params=SamplingParams(temperature=0.9, max_tokens=6, ignore_eos=True, frequency_penalty=1.0,
                                        presence_penalty=0.5, repetition_penalty=1.5, logit_bias=((2, 4.0),)))
        entries = list(pool.fetch(10, include_calls=True).entries)
    finally:
        engine.close()
        pool.close()
    samples = build_samples(entries, batch_rewards(entries, RewardConfig(normalize="group")), CONFIG.eos_token_ids)
    assert len(samples) == 3 * 3 * 3 + 2 * 2 + 2 * 2 + 2 * 2 and sum(s.edits is not None for s in samples) == 8
    assert build_trie([s.tokens for s in samples]).compression > 2.0
    rng = random.Random(4)
    for kind in ("cispo", "grpo"):
        config = LossConfig(kind=kind, eps_high=0.2, mtp_weight=0.3, mtp_top_k=8)
        assert_same_step(model, samples, config, random_masks(rng, samples), budget=60, linear_budget=120)


def assert_same_batches(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert [id(x) for x in a.samples] == [id(x) for x in b.samples]
        for name, value in vars(b).items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(getattr(a, name), value), name
            elif name != "samples":
                np.testing.assert_array_equal(getattr(a, name), value, err_msg=name)


def test_ranks_keep_shared_prefixes_together(model):
    samples = seeded_batch(model, 2)
    trie = build_trie([s.tokens for s in samples])
    for world in (1, 2, 3, 5):
        parts = [trie.order[a:b].tolist() for a, b in rank_spans(trie, world)]
        assert len(parts) == world and sorted(i for p in parts for i in p) == list(range(len(samples)))
        nodes = [build_trie([samples[i].tokens for i in p]).num_nodes if p else 0 for p in parts]
        assert sum(nodes) <= trie.num_nodes + world * 20
        # The trainer builds the step's trie once: a rank's span packs as a trie of the rank's samples alone.
        for part, span in zip(parts, rank_spans(trie, world), strict=True):
            local = [samples[i] for i in part]
            for budget in (40, 4096):
                expected = pack_trees(local, budget) if local else []
                assert_same_batches(pack_trees(samples, budget, trie=trie, span=span), expected)


def test_chunk_bounds_equal_a_device_search(model):
    """The output head's chunk bounds come from host offsets: those of ``torch.searchsorted`` on the device."""
    for batch in pack_trees(seeded_batch(model, 0), 40):
        nodes = torch.arange(batch.logit_nodes.numel() + 1)
        assert batch.row_first.tolist() == torch.searchsorted(batch.sampling_rows, nodes).tolist()
        rows = torch.arange(batch.sampling_rows.numel() + 1)
        assert batch.term_first.tolist() == torch.searchsorted(batch.term_sampling_row.sort().values, rows).tolist()


def test_a_tree_whose_slots_are_all_borrowed(model):
    """A short sample packed alone whose every node is context of later trees: its tree computes nothing, and its
    terms are read from the stem."""
    rng = random.Random(9)
    prefix = [rng.randrange(VOCAB) for _ in range(10)]
    plain = (1.0, 0, 1.0)
    short = make_sample(rng, prefix, 4, setting=plain)
    longer = [make_sample(rng, prefix + [rng.randrange(VOCAB) for _ in range(20)], 12, setting=plain)
              for _ in range(2)]
    samples = [longer[0], short, longer[1]]
    step = pack_step(samples, 20)
    assert step.stem is not None and step.stem.num_nodes == 10
    assert [b.num_nodes for b in step.batches] == [0, 20, 20]
    config = LossConfig(kind="cispo", mtp_weight=0.4, mtp_top_k=5)
    assert_same_step(model, samples, config, random_masks(rng, samples), budget=20)


@pytest.mark.parametrize("impl", ["segments", "gather", "dense"])
def test_a_shared_prefix_longer_than_the_budget_is_computed_once_in_pieces(model, impl):
    """A shared context several times the budget (every sample longer than the budget, so each packs alone): the
    step still computes every trie node once, its stem in pieces that borrow their ancestors from the pieces before
    (across the tasks' branches too), with the loss and gradients of sample-by-sample training."""
    rng = random.Random(41)
    samples = agent_batch(model, rng, groups=3, group_size=2, calls=3, system_len=70)[:-2]
    samples = [s for s in samples if len(s.tokens) > 24]
    budget = 24
    step = pack_step(samples, budget)
    assert step.stem is not None and step.stem.num_nodes > 3 * budget
    assert step.num_nodes == build_trie([s.tokens for s in samples]).num_nodes
    assert step.num_nodes < sum(b.num_nodes for b in pack_trees(samples, budget)) / 2
    pieces = step.stem.pieces(budget)
    assert len(pieces) >= 4 and all(p.stop - p.start <= budget for p in pieces)
    assert pieces[0].borrowed is None and all(p.borrowed is not None for p in pieces[1:])
    assert [p.start for p in pieces] == list(range(0, step.stem.num_nodes, budget))
    config = LossConfig(kind="cispo", mtp_weight=0.5, mtp_top_k=5)
    assert_same_step(model, samples, config, random_masks(rng, samples), budget, impl=impl)


def test_the_pieces_of_a_stem_give_the_whole_stem_s_keys_and_hidden_states(model):
    """Run in pieces, the stem's hidden states, drafts and every layer's keys and values equal one pass over it."""
    rng = random.Random(43)
    samples = agent_batch(model, rng, groups=3, group_size=2, calls=3, system_len=50)
    step = pack_step(samples, 20)
    assert step.stem is not None and step.stem.num_nodes > 40
    with torch.no_grad():
        whole = stem_forward(model, step.stem, mtp_top_k=5, impl="dense", piece_tokens=10_000)
        pieces = stem_forward(model, step.stem, mtp_top_k=5, impl="dense", piece_tokens=7)
    assert len(whole.pieces) == 1 and len(pieces.pieces) > 5
    assert len(whole.leaves) == len(pieces.leaves) > 2
    for one, split in zip(whole.leaves, pieces.leaves, strict=True):
        torch.testing.assert_close(split, one, atol=1e-5, rtol=1e-5)


def test_stem_state_is_required_and_matches_the_mtp_setting(model):
    samples = seeded_batch(model, 0)
    step = pack_step(samples, 40)
    borrowing = next(b for b in step.batches if b.borrowed is not None)
    with pytest.raises(ValueError, match="borrows"):
        tree_policy_forward(model, borrowing, mtp_top_k=4)
    with pytest.raises(ValueError, match="MTP"):
        tree_policy_forward(model, borrowing, mtp_top_k=4, stem=stem_forward(model, step.stem, mtp_top_k=0))


@pytest.mark.parametrize("budget", [4096, 40], ids=["one-tree", "stem"])
def test_activation_checkpointing_changes_no_loss_or_gradient(model, budget):
    """Each decoder layer kept as its input and recomputed in the backward pass: the same tree step (with the stem
    the trees share) gives the same loss and gradients as keeping every activation."""
    rng = random.Random(21)
    samples = seeded_batch(model, 1)
    config = LossConfig(mtp_weight=0.5, mtp_top_k=5)
    masks = random_masks(rng, samples)
    calls = []
    hook = model.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        kept = run(model, samples, config, masks, tree=True, budget=budget)
        plain_calls = len(calls)
        model.activation_checkpointing(True)
        recomputed = run(model, samples, config, masks, tree=True, budget=budget)
    finally:
        model.activation_checkpointing(False)
        hook.remove()
    assert len(calls) - plain_calls > plain_calls       # the checkpointed step ran layers again in its backward
    assert recomputed[0] == pytest.approx(kept[0], rel=1e-6)
    assert recomputed[1].keys() == kept[1].keys()
    for name, grad in kept[1].items():
        torch.testing.assert_close(recomputed[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
