"""The learner on a model with experts: tree-merged training equals sample-by-sample training (loss and every
gradient) with routing replay, also where samples share tokens but were routed differently (the trie splits them)
and with the routers choosing again; with replay, the learner's log-probs of sampled tokens equal the actor's on a
recorded pool whose every token is near a routing tie, where recomputing the routing drifts; and a training step
reports the routing mismatch, the expert load and the load-balancing loss, whose gradient reaches the routers."""

from __future__ import annotations

import random

import pytest
import torch

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.learner.losses import LossConfig
from forge.learner.parallel import Distributed
from forge.learner.policy import policy_forward
from forge.learner.rewards import RewardConfig, batch_rewards
from forge.learner.samples import build_samples, make_micro_batch
from forge.learner.trainer import Trainer, TrainerConfig
from forge.learner.tree import build_trie, pack_step
from forge.model import CausalLM
from forge.model.moe import routing_of
from forge.pool import Pool, WindowConfig

from helpers.gradients import capture_gradients
from helpers.learner_runs import fill_from
from helpers.random_model import copy_of, random_model, small_config
from helpers.rollouts import fill_pool
from helpers.threads import one_thread  # noqa: F401  (autouse)
from helpers.tree_steps import VOCAB, agent_batch, assert_same_step, random_masks, run

CONFIG = small_config(experts=True, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, head_dim=8,
                      moe_intermediate_size=16)


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return random_model(CONFIG, std=0.3)


def with_recorded_routing(model: CausalLM, samples, other: CausalLM, rng: random.Random, share: float = 0.3):
    """Each sample gets the routing of its tokens but the last, from ``model`` or (``share`` of them, as if sampled
    under another weight version) from ``other``: only samples drawn without truncation, whose tokens stay in the
    support however they are routed."""
    for sample in samples:
        untruncated = sample.top_k == 0 and sample.top_p >= 1.0
        source = other if untruncated and rng.random() < share else model
        sample.routing = routing_of(source, sample.tokens[:-1])
    return samples


@pytest.mark.parametrize("budget", [4096, 40])
@pytest.mark.parametrize("share", [True, False], ids=["stem", "recompute-stem"])
def test_tree_step_equals_sample_by_sample_with_replayed_routing(model, budget, share):
    rng = random.Random(budget + share)
    other = random_model(CONFIG, seed=9, std=0.3)
    samples = with_recorded_routing(model, agent_batch(model, rng), other, rng)
    by_tokens = build_trie([s.tokens for s in samples])
    by_routing = build_trie([s.tokens for s in samples], [s.routing for s in samples])
    assert by_routing.num_nodes > by_tokens.num_nodes, "no sample was routed differently on a shared prefix"
    for sample, path in zip(samples, by_routing.paths, strict=True):
        assert (by_routing.routing[path[:-1]] == sample.routing).all()
    config = LossConfig(kind="cispo", eps_high=0.3, mtp_weight=0.5, mtp_top_k=5)
    assert_same_step(model, samples, config, random_masks(rng, samples), budget, linear_budget=budget * 2,
                     share=share)


def test_a_stem_in_pieces_replays_each_piece_s_routing(model):
    """A shared context several times the budget, run in pieces: each piece replays its own rows' recorded routing,
    and the step equals sample-by-sample training."""
    rng = random.Random(17)
    other = random_model(CONFIG, seed=9, std=0.3)
    samples = with_recorded_routing(model, agent_batch(model, rng, groups=2, group_size=2, calls=2, system_len=60),
                                    other, rng)
    step = pack_step(samples, 20, trie=build_trie([s.tokens for s in samples], [s.routing for s in samples]))
    assert step.stem is not None and len(step.stem.pieces(20)) >= 3
    config = LossConfig(kind="cispo", eps_high=0.3, mtp_weight=0.5, mtp_top_k=5)
    assert_same_step(model, samples, config, random_masks(rng, samples), 20, linear_budget=4096)


def test_tree_step_equals_sample_by_sample_when_the_routers_choose_again(model):
    rng = random.Random(5)
    samples = agent_batch(model, rng)
    config = LossConfig(kind="grpo", mtp_weight=0.5, mtp_top_k=5)
    assert_same_step(model, samples, config, random_masks(rng, samples), 40, linear_budget=80,
                     routing_mode="recompute")


TIED = small_config(experts=True, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, head_dim=8,
                    moe_intermediate_size=16, num_experts_per_tok=1, num_nextn_predict_layers=0)


def near_ties(seed: int, noise: float) -> CausalLM:
    """Routers whose experts come in pairs of nearly equal rows (0 ~ 1, 2 ~ -1): every token is a near tie
    between the two experts of a pair, whose MLPs differ. One expert per token, its weight renormalised to 1: what
    the routers decide is which expert, nothing else."""
    net = random_model(TIED, std=0.3)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in net.model.layers:
            base = layer.mlp.gate.weight[0].clone()
            rows = torch.stack([base, base, -base, -base])
            layer.mlp.gate.weight.copy_(rows + noise * torch.randn(rows.shape, generator=generator))
    return net.eval()


def test_replayed_routing_keeps_the_learner_on_the_actor_log_probs_near_routing_ties(tmp_path):
    actor_model = near_ties(seed=1, noise=1e-4)
    learner_model = near_ties(seed=1, noise=1e-4)
    with torch.no_grad():           # another version's routers: within 1e-4 of the actor's, enough to flip ties
        for layer in learner_model.model.layers:
            layer.mlp.gate.weight.add_(1e-4 * torch.randn(layer.mlp.gate.weight.shape,
                                                          generator=torch.Generator().manual_seed(2)))
    engine = TorchEngine(actor_model, EngineConfig(kv_cache_bytes=4 * 2**20, block_size=8))
    pool = Pool(tmp_path / "pool")
    try:
        fill_pool(pool, engine, groups=3, group_size=2, calls=2, max_tokens=8, vocab=VOCAB)
        entries = list(pool.fetch(10, include_calls=True).entries)
    finally:
        engine.close()
        pool.close()
    samples = build_samples(entries, batch_rewards(entries, RewardConfig()), TIED.eos_token_ids)
    assert len(samples) == 12 and all(s.routing is not None for s in samples)
    batch = make_micro_batch(samples)
    drift = {}
    with torch.no_grad():
        for mode in ("replay", "recompute"):
            out = policy_forward(learner_model, batch, routing_mode=mode)
            drift[mode] = float((out.logprobs - batch.old_logprobs).abs().max())
            differs, given = out.routing.mismatches(batch.valid)
            assert given == sum(len(s.tokens) - 1 for s in samples)
            drift[f"{mode} mismatch"] = differs / given
    assert drift["replay"] <= 1e-4, drift
    assert drift["replay mismatch"] > 0.05 and drift["recompute mismatch"] > 0.05, drift   # measured either way
    assert drift["recompute"] > 100 * drift["replay"], drift


def test_a_training_step_reports_routing_and_trains_the_routers_toward_balance(tmp_path, model):
    pool = Pool(tmp_path / "pool")
    fill_from(pool, model, groups=2, group_size=2, calls=2, max_tokens=6)
    records, router_grads = {}, {}
    try:
        for weight in (0.0, 1.0):
            pool.rewind(0)                  # both steps train the same batch
            learner = copy_of(model)
            trainer = Trainer(learner, Distributed(), TrainerConfig(lr=1e-3, micro_batch_tokens=40),
                              LossConfig(mtp_weight=0.1, router_balance_weight=weight), RewardConfig(),
                              WindowConfig(batch_groups=2, min_groups=2), pool)
            grads = capture_gradients(trainer, learner)
            records[weight] = trainer.step()
            router_grads[weight] = grads["model.layers.0.mlp.gate.weight"]
    finally:
        pool.close()
    for record in records.values():
        assert record["routing_mismatch"] == 0.0            # the learner's weights are the actor's
        assert record["routing_recorded_share"] > 0.5 and record["expert_load_max"] >= 1.0
    assert "router_balance_loss" not in records[0.0] and records[1.0]["router_balance_loss"] >= 1.0
    assert not torch.allclose(router_grads[0.0], router_grads[1.0]), "the balance loss did not reach the router"


@pytest.mark.parametrize("routing_mode", ["replay", "recompute"])
def test_activation_checkpointing_routes_its_recomputation_as_the_first_pass(model, routing_mode):
    """A layer with experts recomputed in the backward pass chooses (or replays) the experts of its first pass and
    records nothing twice: the step's loss and gradients, the routers' included, equal those of keeping every
    activation."""
    rng = random.Random(31)
    other = random_model(CONFIG, seed=9, std=0.3)
    samples = with_recorded_routing(model, agent_batch(model, rng), other, rng)
    config = LossConfig(kind="cispo", eps_high=0.3, mtp_weight=0.5, mtp_top_k=5)
    masks = random_masks(rng, samples)
    kept = run(model, samples, config, masks, tree=True, budget=40, routing_mode=routing_mode)
    model.activation_checkpointing(True)
    try:
        recomputed = run(model, samples, config, masks, tree=True, budget=40, routing_mode=routing_mode)
    finally:
        model.activation_checkpointing(False)
    assert recomputed[0] == pytest.approx(kept[0], rel=1e-6)
    assert recomputed[1].keys() == kept[1].keys()
    for name, grad in kept[1].items():
        torch.testing.assert_close(recomputed[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
