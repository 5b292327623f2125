"""The reference KL and the training–inference mismatch: each KL estimator and each correction (truncated IS, masked
IS, IcePop; token and sequence level) against a reference written out token by token on random tensors, value and
gradient; LoRA's reference (adapters off) is the base model; the mismatch metrics are 0 where the behaviour
log-probs are the learner's own, positive from a perturbed model, and 0 again for stale tokens with
``--recompute-behaviour``; tree-packed steps equal sample-by-sample ones with the KL and a correction on."""

from __future__ import annotations

import dataclasses
import math
import random
import shutil

import pytest
import torch

from forge.learner.corrections import corrected, correction_weights
from forge.learner.lora import LoraConfig, add_adapters
from forge.learner.losses import LossConfig, policy_loss
from forge.learner.parallel import Distributed
from forge.learner.recompute import learner_logprobs
from forge.learner.reference import adapters_off, kl_loss
from forge.learner.rewards import RewardConfig
from forge.learner.trainer import Trainer
from forge.learner.trainer_config import TrainerConfig
from forge.pool import Pool, WindowConfig
from forge.v1 import pool_pb2

from helpers.gradients import capture_gradients
from helpers.learner_runs import make_model
from helpers.lora import randomize_adapters
from helpers.random_model import copy_of
from helpers.threads import one_thread  # noqa: F401  (autouse)

# ------------------------------------------------------------------------------------------------ random tensors


def case(seed: int, tokens: int = 40, sequences: int = 5, noise: float = 0.6):
    """Logits (float64, with gradient), targets, two other log-prob vectors near the current ones (the reference's
    or the actor's, and the learner's side), advantages, a mask with holes and the sorted sequence index."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, 11, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (tokens,), generator=generator)
    index = torch.unique(torch.sort(torch.randint(0, sequences, (tokens,), generator=generator)).values,
                         return_inverse=True)[1]
    current = logp_of(logits.detach(), targets)
    other = current + noise * torch.randn(tokens, generator=generator, dtype=torch.float64)
    side = current + 0.2 * noise * torch.randn(tokens, generator=generator, dtype=torch.float64)
    advantages = torch.randn(tokens, generator=generator, dtype=torch.float64)
    mask = (torch.rand(tokens, generator=generator) > 0.2).double()
    return logits, targets, other, side, advantages, mask, index


def logp_of(logits, targets):
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def by_hand(logits, total):
    """``total(lps)`` over each token's own log-softmax (Python arithmetic, token by token) and its gradient."""
    logits = logits.detach().clone().requires_grad_(True)
    loss = total([torch.log_softmax(logits[i], -1) for i in range(logits.shape[0])])
    loss.backward()
    return loss.detach(), logits.grad


def assert_matches(logits, loss, expected):
    loss.backward()
    torch.testing.assert_close(loss.detach(), expected[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(logits.grad, expected[1], atol=1e-6, rtol=0)


def estimate(estimator: str, lp, ref: float):
    rho = ref - lp
    return {"k1": -rho, "k2": 0.5 * rho * rho, "k3": torch.exp(rho) - 1 - rho}[estimator]


NORMS = {   # LossConfig → how the policy loss (hence the KL) is normalised
    "cispo-token": LossConfig(kind="cispo"), "cispo-sequence": LossConfig(kind="cispo", token_norm="sequence"),
    "grpo": LossConfig(kind="grpo"), "dapo": LossConfig(kind="dapo"), "gspo": LossConfig(kind="gspo",
                                                                                        token_norm="sequence"),
    "dr_grpo": LossConfig(kind="dr_grpo"), "dr_grpo-12": LossConfig(kind="dr_grpo", dr_grpo_max_tokens=12),
}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("seed", [0, 1])
def test_each_kl_estimator_equals_its_reference(estimator, norm, seed):
    logits, targets, ref, _, _, mask, index = case(seed)
    config = dataclasses.replace(NORMS[norm], kl_estimator=estimator)
    tokens, sequences = float(mask.sum()) + 3, float(int(index.max()) + 1) + 1     # global counts, other ranks too
    per_sequence = norm in ("grpo", "cispo-sequence", "gspo")

    def total(lps):
        sums, counts, whole = {}, {}, 0.0
        for t in range(len(lps)):
            if mask[t] == 0:
                continue
            term = estimate(estimator, lps[t][targets[t]], float(ref[t]))
            i = int(index[t])
            sums[i], counts[i] = sums.get(i, 0.0) + term, counts.get(i, 0) + 1
            whole = whole + term
        if per_sequence:
            return sum(sums[i] / counts[i] for i in sums) / sequences
        if norm == "dr_grpo-12":
            return whole / (sequences * 12)
        return whole / tokens

    loss = kl_loss(config, logp_of(logits, targets), ref, mask, index, tokens, sequences)
    assert_matches(logits, loss, by_hand(logits, total))


def test_the_estimators_are_zero_at_the_reference_and_k3_is_positive():
    logits, targets, ref, *_ = case(3)
    lp = logp_of(logits.detach(), targets)
    for estimator in ("k1", "k2", "k3"):
        config = LossConfig(kl_estimator=estimator)
        ones, index = torch.ones_like(lp), torch.zeros_like(targets)
        assert float(kl_loss(config, lp, lp, ones, index, 1.0, 1.0)) == 0.0
    k3 = kl_loss(LossConfig(kl_estimator="k3"), lp, ref, torch.ones_like(lp), torch.zeros_like(targets), 1.0, 1.0)
    assert float(k3) > 0


CORRECTIONS = {
    "tis-token": dict(correction="tis", tis_cap=1.5), "tis-sequence": dict(correction="tis", correction_level="sequence",
                                                                          tis_cap=1.5),
    "mis-token": dict(correction="mis", mis_cap=1.5), "mis-sequence": dict(correction="mis",
                                                                           correction_level="sequence", mis_cap=1.5),
    "icepop": dict(correction="icepop", icepop_low=0.8, icepop_high=1.25),
}


def weights_by_hand(name: str, side, behaviour, mask, index) -> list[float]:
    """c_t token by token: w = π_L / μ, or the sequence's product of its trained tokens' w."""
    settings = CORRECTIONS[name]
    out = []
    for t in range(len(side)):
        w = math.exp(float(side[t]) - float(behaviour[t]))
        if settings.get("correction_level") == "sequence":
            w = math.exp(sum(float(side[u]) - float(behaviour[u]) for u in range(len(side))
                             if index[u] == index[t] and mask[u] > 0))
        if settings["correction"] == "tis":
            out.append(min(w, settings["tis_cap"]))
        elif settings["correction"] == "mis":
            out.append(w if w <= settings["mis_cap"] else 0.0)
        else:
            out.append(w if settings["icepop_low"] <= w <= settings["icepop_high"] else 0.0)
    return out


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_correction_s_weights_equal_their_reference(name, seed):
    _, _, behaviour, side, _, mask, index = case(seed, noise=0.5)
    config = LossConfig(**CORRECTIONS[name])
    weights = correction_weights(config, side, behaviour, mask, index)
    expected = torch.tensor(weights_by_hand(name, side, behaviour, mask, index), dtype=torch.float64)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-9)
    assert bool((weights == 0).any()) or name.startswith("tis")          # the bounds bite somewhere
    assert bool((weights != 0).any())


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
@pytest.mark.parametrize("kind", ["cispo", "ppo", "grpo", "dapo"])
def test_a_corrected_loss_is_the_decoupled_objective_by_hand(name, kind):
    """With a correction, the loss's ratio is π / π_L and each token's term is weighed by c_t."""
    logits, targets, behaviour, side, advantages, mask, index = case(5, noise=0.5)
    config = LossConfig(kind=kind, eps_low=0.2, eps_high=0.3, **CORRECTIONS[name])
    weights = weights_by_hand(name, side, behaviour, mask, index)
    tokens, sequences = float(mask.sum()), float(int(index.max()) + 1)

    def total(lps):
        sums, counts, whole = {}, {}, 0.0
        for t in range(len(lps)):
            if mask[t] == 0:
                continue
            lp, a = lps[t][targets[t]], float(advantages[t]) * weights[t]
            r = torch.exp(lp - float(side[t]))
            if kind == "cispo":
                term = min(max(float(r.detach()), 0.8), 1.3) * a * lp
            else:
                low, high = (0.2, 0.28) if kind == "dapo" else (0.2, 0.2)
                term = torch.minimum(r * a, r.clamp(1 - low, 1 + high) * a)
            i = int(index[t])
            sums[i], counts[i] = sums.get(i, 0.0) + term, counts.get(i, 0) + 1
            whole = whole + term
        if kind == "grpo":
            return -sum(sums[i] / counts[i] for i in sums) / sequences
        return -whole / tokens

    logp = logp_of(logits, targets)
    old, weighted = corrected(config, side, behaviour, advantages, mask, index)
    loss = policy_loss(config, logp, old, weighted, mask, index, tokens, sequences)
    assert_matches(logits, loss, by_hand(logits, total))


def test_no_correction_leaves_the_loss_as_it_was():
    _, _, behaviour, side, advantages, mask, index = case(0)
    old, weighted = corrected(LossConfig(), side, behaviour, advantages, mask, index)
    assert old is behaviour and weighted is advantages


# ------------------------------------------------------------------------------------------------ LoRA's reference


def test_lora_s_reference_is_the_base_model():
    base = make_model(2)
    config = LoraConfig(rank=4, alpha=8.0)
    adapted = randomize_adapters(add_adapters(copy_of(base), config), seed=1, scale=0.3)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = base.logits(base(ids))
        adapted_logits = adapted.logits(adapted(ids))
        with adapters_off(adapted):
            off = adapted.logits(adapted(ids))
        back = adapted.logits(adapted(ids))
    torch.testing.assert_close(off, expected, atol=1e-6, rtol=0)
    assert float((adapted_logits - expected).abs().max()) > 1e-3           # the adapters do change the policy
    torch.testing.assert_close(back, adapted_logits, atol=0, rtol=0)        # and are back on after the block
    assert all(p.requires_grad for n, p in adapted.named_parameters() if ".lora_" in n)


# ------------------------------------------------------------------------------------------------ the trainer

DOMAINS = ("qa", "math")


def write_pool(path, groups: int, actor, version: int = 0, seed: int = 0, first: int = 0) -> None:
    """``groups`` groups of 3 sessions sharing a prompt (domains alternate), each call's behaviour log-probs the ones
    ``actor`` gives its tokens (the learner's own computation), recorded at weight ``version``."""
    rng = random.Random(seed)
    with Pool(path) as pool:
        for group in range(first, first + groups):
            prompt = [rng.randrange(1, 64) for _ in range(6)]
            for rollout in range(3):
                record = pool.open_session(task_id=f"t{group}", domain=DOMAINS[group % 2], group_id=f"g{group}",
                                           group_size=3)
                completion = [rng.randrange(1, 64) for _ in range(rng.randrange(2, 6))]
                call = pool_pb2.CallRecord(session_id=record.session_id, index=0, prompt_ids=prompt,
                                           completion_ids=completion, weight_versions=[version] * len(completion),
                                           actor="test", finish_reason=1)
                call.logprobs.extend(learner_logprobs(actor, [call])[0].tolist())
                pool.append_call(call)
                pool.close_session(session_id=record.session_id, outcome_rewards={"r": float(rollout == group % 3)})


def trainer_on(path, model, loss: LossConfig, **trainer) -> Trainer:
    return Trainer(model, Distributed(), TrainerConfig(lr=1e-2, **trainer), loss, RewardConfig(),
                   WindowConfig(mode="fifo", batch_groups=2), Pool(path))


def perturbed(model, seed: int = 9, scale: float = 0.05):
    """A copy of ``model`` whose weights are nudged: an actor at another version."""
    other = copy_of(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return other


@pytest.mark.parametrize("tree", [True, False])
def test_mismatch_is_zero_with_the_learner_s_own_log_probs_and_positive_from_a_perturbed_actor(tmp_path, tree):
    model = make_model(3)
    write_pool(tmp_path / "same", 2, model)
    write_pool(tmp_path / "perturbed", 2, perturbed(model))
    same = trainer_on(tmp_path / "same", copy_of(model), LossConfig(), tree=tree).step()
    other = trainer_on(tmp_path / "perturbed", copy_of(model), LossConfig(), tree=tree).step()
    for domain in ("", "/qa", "/math"):
        for figure in ("kl", "abs_logp", "outside"):
            assert abs(same[f"mismatch_{figure}{domain}"]) <= 1e-6, (figure, domain, same)
        assert other[f"mismatch_kl{domain}"] > 1e-4 and other[f"mismatch_abs_logp{domain}"] > 1e-3
    assert same["mismatch_current_frac"] == other["mismatch_current_frac"] == 0.0
    assert "ref_kl" not in same


def test_recompute_behaviour_measures_stale_tokens_at_their_own_version(tmp_path):
    """Step 1 trains version 0's calls; step 2 takes more calls sampled at version 0 while the learner is at 1.
    Against the current policy they differ by the update; recomputed at version 0 they equal the actor's."""
    model = make_model(4)
    write_pool(tmp_path / "pool", 4, model, seed=1)
    shutil.copytree(tmp_path / "pool", tmp_path / "pool-recompute")
    plain = trainer_on(tmp_path / "pool", copy_of(model), LossConfig())
    recomputing = trainer_on(tmp_path / "pool-recompute", copy_of(model), LossConfig(correction="tis"),
                             recompute_behaviour=True)
    first, second = plain.step(), plain.step()
    assert first["mismatch_kl"] <= 1e-6 and second["mismatch_kl"] > 1e-5 and second["mismatch_current_frac"] == 1.0
    first, second = recomputing.step(), recomputing.step()
    assert second["version"] == 2 and recomputing.previous.version == 1
    assert first["mismatch_kl"] <= 1e-6 and second["mismatch_kl"] <= 1e-6
    assert second["mismatch_abs_logp"] <= 1e-6 and second["mismatch_current_frac"] == 0.0
    # the correction's weights were 1 and the loss's ratio π / π_L: the clipped fraction reads the update
    assert second["ratio_mean"] != pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("loss", [
    LossConfig(kl_coef=0.5, kl_estimator="k3", correction="tis", correction_level="sequence", tis_cap=1.02),
    LossConfig(kind="grpo", kl_coef=0.3, kl_estimator="k2", correction="icepop", icepop_low=0.97, icepop_high=1.03),
    LossConfig(kind="dapo", kl_coef=0.2, kl_estimator="k1", correction="mis", mis_cap=1.02),
], ids=["cispo-tis", "grpo-icepop", "dapo-mis"])
def test_a_packed_step_with_the_kl_and_a_correction_equals_a_linear_one(tmp_path, loss):
    model = make_model(6)
    reference = perturbed(model, seed=3, scale=0.1)
    write_pool(tmp_path / "pool", 4, perturbed(model, seed=4, scale=0.02), seed=2)
    runs = {}
    for tree in (True, False):
        shutil.copytree(tmp_path / "pool", tmp_path / f"pool-{tree}")
        trained = copy_of(model)
        trainer = Trainer(trained, Distributed(), TrainerConfig(lr=1e-2, tree=tree, micro_batch_tokens=24), loss,
                          RewardConfig(), WindowConfig(mode="fifo", batch_groups=4), Pool(tmp_path / f"pool-{tree}"),
                          reference=copy_of(reference))
        grads = capture_gradients(trainer, trained)
        record = trainer.step()
        runs[tree] = record, {k: v.clone() for k, v in grads.items()}
    (tree_record, tree_grads), (linear_record, linear_grads) = runs[True], runs[False]
    assert tree_record["packed_tokens"] < linear_record["packed_tokens"]            # prompts were shared
    assert linear_record["ref_kl"] > 1e-3
    for key in ("loss", "policy_loss", "ref_kl", "mismatch_kl", "mismatch_abs_logp", "mismatch_outside",
                "mismatch_kl/qa", "mismatch_kl/math", "ratio_mean"):
        assert tree_record[key] == pytest.approx(linear_record[key], rel=1e-5, abs=1e-6), key
    assert tree_grads.keys() == linear_grads.keys() and tree_grads
    for key, grad in linear_grads.items():
        torch.testing.assert_close(tree_grads[key], grad, atol=1e-5, rtol=1e-4, msg=key)


def test_the_kl_pulls_toward_the_reference_and_lora_s_reference_is_its_base(tmp_path):
    """With LoRA the reference pass is the base (adapters off): at the start, adapters at zero, the KL is 0."""
    model = make_model(7)
    write_pool(tmp_path / "pool", 2, model)
    adapted = add_adapters(copy_of(model), LoraConfig(rank=4, alpha=8.0))
    trainer = Trainer(adapted, Distributed(), TrainerConfig(lr=1e-2), LossConfig(kl_coef=1.0), RewardConfig(),
                      WindowConfig(mode="fifo", batch_groups=1), Pool(tmp_path / "pool"), lora=LoraConfig(rank=4))
    assert trainer.reference is None
    first, second = trainer.step(), trainer.step()
    assert abs(first["ref_kl"]) <= 1e-9 and second["ref_kl"] > 0
    assert first["loss"] == pytest.approx(first["policy_loss"] + 0.1 * first["mtp_loss"], abs=1e-9)
