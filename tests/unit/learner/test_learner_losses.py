"""Losses and rewards of the learner against straightforward reference computations: CISPO, PPO-clip and GRPO
gradients on random tensors, the MTP top-k KL, and composite rewards / reward-to-go / baselines by hand."""

from __future__ import annotations

import math

import pytest
import torch

from forge.learner.losses import LossConfig, cispo_loss, grpo_loss, mtp_topk_kl, policy_loss, ppo_loss
from forge.learner.rewards import RewardConfig, discounted, group_rewards, normalize_by_domain, speed_reward
from forge.v1 import pool_pb2


def random_case(seed: int, tokens: int = 40, vocab: int = 11):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    old = (torch.log_softmax(logits.detach(), -1).gather(-1, targets[:, None])[:, 0]
           + 0.6 * torch.randn(tokens, generator=generator, dtype=torch.float64))
    advantages = torch.randn(tokens, generator=generator, dtype=torch.float64)
    mask = (torch.rand(tokens, generator=generator) > 0.2).double()
    index = torch.sort(torch.randint(0, 5, (tokens,), generator=generator)).values
    return logits, targets, old, advantages, mask, index


def logp_of(logits, targets):
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def reference_grad(logits, targets, term):
    """Sum of per-token terms computed one token at a time with Python arithmetic on scalars."""
    logits = logits.detach().clone().requires_grad_(True)
    total = 0.0
    for i in range(len(targets)):
        lp = torch.log_softmax(logits[i], -1)[targets[i]]
        total = total + term(i, lp)
    total.backward()
    return total.detach(), logits.grad


@pytest.mark.parametrize("seed", range(3))
def test_cispo_matches_the_reference(seed):
    logits, targets, old, adv, mask, _ = random_case(seed)
    eps_low, eps_high, count = 0.3, 0.5, float(mask.sum())
    loss = cispo_loss(logp_of(logits, targets), old, adv, mask, count, eps_low, eps_high)
    loss.backward()

    def term(i, lp):
        weight = min(max(math.exp(float(lp.detach()) - float(old[i])), 1 - eps_low), 1 + eps_high)   # sg(.)
        return -weight * float(adv[i]) * lp * float(mask[i]) / count

    expected_loss, expected_grad = reference_grad(logits, targets, term)
    torch.testing.assert_close(loss.detach(), expected_loss)
    torch.testing.assert_close(logits.grad, expected_grad)


def test_cispo_keeps_gradients_of_clipped_tokens():
    logits, targets, old, adv, _, _ = random_case(7)
    old = logp_of(logits.detach(), targets) - 5.0            # every ratio is e^5: far above 1 + eps_high
    cispo_loss(logp_of(logits, targets), old, adv, torch.ones_like(adv), 40.0, 0.2, 0.2).backward()
    assert logits.grad.abs().sum(-1).min() > 0               # PPO would zero these out
    logits.grad = None
    ppo_loss(logp_of(logits, targets), old, adv.abs(), torch.ones_like(adv), 40.0, 0.2).backward()
    assert logits.grad.abs().sum() == 0


@pytest.mark.parametrize("seed", range(3))
def test_ppo_clip_matches_the_reference(seed):
    logits, targets, old, adv, mask, _ = random_case(seed)
    eps, count = 0.2, float(mask.sum())
    loss = ppo_loss(logp_of(logits, targets), old, adv, mask, count, eps)
    loss.backward()

    def term(i, lp):
        ratio = torch.exp(lp - float(old[i]))
        clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
        return -torch.minimum(ratio * float(adv[i]), clipped * float(adv[i])) * float(mask[i]) / count

    expected_loss, expected_grad = reference_grad(logits, targets, term)
    torch.testing.assert_close(loss.detach(), expected_loss)
    torch.testing.assert_close(logits.grad, expected_grad)


@pytest.mark.parametrize("seed", range(3))
def test_grpo_matches_the_reference(seed):
    logits, targets, old, adv, mask, index = random_case(seed)
    eps = 0.2
    sequences = len(set(index.tolist()))
    loss = grpo_loss(logp_of(logits, targets), old, adv, mask, index, float(sequences), eps)
    loss.backward()
    counts = {s: float(mask[index == s].sum()) for s in set(index.tolist())}

    def term(i, lp):
        ratio = torch.exp(lp - float(old[i]))
        clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
        per_token = torch.minimum(ratio * float(adv[i]), clipped * float(adv[i])) * float(mask[i])
        return -per_token / max(counts[int(index[i])], 1.0) / sequences

    expected_loss, expected_grad = reference_grad(logits, targets, term)
    torch.testing.assert_close(loss.detach(), expected_loss)
    torch.testing.assert_close(logits.grad, expected_grad)


@pytest.mark.parametrize("seed", range(3))
def test_cispo_per_sequence_normalisation_matches_the_reference(seed):
    logits, targets, old, adv, mask, index = random_case(seed)
    eps_low, eps_high = 0.3, 0.5
    sequences = len(set(index.tolist()))
    config = LossConfig(eps_low=eps_low, eps_high=eps_high, token_norm="sequence")
    loss = policy_loss(config, logp_of(logits, targets), old, adv, mask, index, 1e9, float(sequences))
    loss.backward()
    counts = {s: float(mask[index == s].sum()) for s in set(index.tolist())}

    def term(i, lp):
        weight = min(max(math.exp(float(lp.detach()) - float(old[i])), 1 - eps_low), 1 + eps_high)
        return -weight * float(adv[i]) * lp * float(mask[i]) / max(counts[int(index[i])], 1.0) / sequences

    expected_loss, expected_grad = reference_grad(logits, targets, term)
    torch.testing.assert_close(loss.detach(), expected_loss)
    torch.testing.assert_close(logits.grad, expected_grad)


def test_policy_loss_dispatches_and_validates():
    logits, targets, old, adv, mask, index = random_case(1)
    lp = logp_of(logits, targets)
    for kind in ("cispo", "ppo", "grpo"):
        assert torch.isfinite(policy_loss(LossConfig(kind=kind), lp, old, adv, mask, index, 30.0, 5.0))
    with pytest.raises(ValueError):
        LossConfig(kind="dpo")
    with pytest.raises(ValueError):
        LossConfig(token_norm="batch")


def test_mtp_topk_kl_is_the_reference_kl_and_trains_only_the_draft():
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(6, 20, generator=generator, requires_grad=True)
    draft = torch.randn(6, 20, generator=generator, requires_grad=True)
    kl = mtp_topk_kl(target, draft, 5)
    for row in range(6):
        top = torch.topk(target[row].detach(), 5)
        p = torch.softmax(top.values, -1)
        log_q = torch.log_softmax(draft[row].detach(), -1)[top.indices]
        torch.testing.assert_close(kl[row].detach(), (p * (p.log() - log_q)).sum())
    kl.sum().backward()
    assert target.grad is None and draft.grad.abs().sum() > 0
    assert float(mtp_topk_kl(target, target.detach(), 20).abs().max()) < 1e-6    # zero at q = p


def session(sid, rewards, process=(), status=pool_pb2.SESSION_STATUS_COMPLETED, seconds=10.0, domain="qa",
            calls=1):
    record = pool_pb2.SessionRecord(session_id=sid, status=status, domain=domain, started_at=100.0,
                                    ended_at=100.0 + seconds, outcome_rewards=rewards)
    call_records = []
    for index in range(calls):
        call = pool_pb2.CallRecord(session_id=sid, index=index, prompt_ids=[1], completion_ids=[2],
                                   logprobs=[-0.1], weight_versions=[0])
        call.process_rewards.extend(process[index] if index < len(process) else [])
        call_records.append(call)
    return pool_pb2.SessionWithCalls(session=record, calls=call_records)


def test_composite_reward_reward_to_go_and_group_baseline_by_hand():
    config = RewardConfig(alpha=0.5, beta=0.2, gamma=0.9)
    sessions = [
        session("a", {"correct": 1.0}, process=[[-1.0], [], [0.5]], seconds=5.0, calls=3),
        session("b", {"correct": 0.0, "bonus": 0.25}, seconds=10.0, calls=1),
        session("c", {}, status=pool_pb2.SESSION_STATUS_FAILED, seconds=99.0, calls=2),
    ]
    out = {r.session_id: r for r in group_rewards(sessions, config)}
    # median completion time of the finished sessions (5 s and 10 s) is 7.5 s
    speed_a, speed_b = 1 - 5 / 7.5, 1 - 10 / 7.5
    assert out["a"].speed == pytest.approx(speed_a) and out["b"].speed == pytest.approx(speed_b)
    r_a = [0.5 * -1.0, 0.0, 0.5 * 0.5 + 0.2 * speed_a + 1.0]
    assert out["a"].rewards == pytest.approx(r_a)
    returns_a = [r_a[0] + 0.9 * r_a[1] + 0.81 * r_a[2], r_a[1] + 0.9 * r_a[2], r_a[2]]
    return_b = 0.2 * speed_b + 0.25
    baseline = (returns_a[0] + return_b + 0.0) / 3             # failed session: outcome 0, no speed
    assert out["a"].advantages == pytest.approx([g - baseline for g in returns_a])
    assert out["b"].advantages == pytest.approx([return_b - baseline])
    assert out["c"].rewards == [0.0, 0.0] and out["c"].advantages == pytest.approx([-baseline, -baseline])


def test_speed_reward_pays_only_right_answers_unless_told():
    sessions = [session("fast-wrong", {"correct": 0.0}, seconds=2.0), session("right", {"correct": 1.0}, seconds=4.0),
                session("slow-right", {"correct": 1.0}, seconds=12.0)]
    out = {r.session_id: r for r in group_rewards(sessions, RewardConfig(beta=0.5))}
    assert out["fast-wrong"].speed == 0.0                   # baseline: median of 4 s and 12 s = 8 s
    assert out["right"].speed == pytest.approx(0.5) and out["slow-right"].speed == pytest.approx(-0.5)
    every = {r.session_id: r for r in group_rewards(sessions, RewardConfig(beta=0.5, speed_on="all"))}
    assert every["fast-wrong"].speed == pytest.approx(0.5)   # baseline 4 s
    agent_only = group_rewards(sessions, RewardConfig(beta=0.5, speed_domains=("agent",)))
    assert [r.speed for r in agent_only] == [0.0, 0.0, 0.0]             # these sessions are "qa"
    wrong = [session(str(i), {"correct": 0.0}, seconds=1.0 + i) for i in range(4)]
    assert all(r.advantages == [0.0] for r in group_rewards(wrong, RewardConfig(beta=0.5, normalize="group")))
    with pytest.raises(ValueError):
        RewardConfig(speed_on="never")


def test_group_normalisation_and_options():
    sessions = [session(str(i), {"r": float(i)}) for i in range(4)]
    out = group_rewards(sessions, RewardConfig(normalize="group"))
    values = [r.advantages[0] for r in out]
    assert sum(values) == pytest.approx(0.0) and (sum(v * v for v in values) / 4) == pytest.approx(1.0, rel=1e-4)
    plain = group_rewards(sessions, RewardConfig(baseline="none"))
    assert [r.advantages[0] for r in plain] == [0.0, 1.0, 2.0, 3.0]
    assert discounted([1.0, 2.0, 3.0], 0.5) == [1.0 + 1.0 + 0.75, 2.0 + 1.5, 3.0]
    assert speed_reward(20.0, 10.0) == -1.0 and speed_reward(0.0, 10.0) == 1.0 and speed_reward(5.0, 0.0) == 0.0
    with pytest.raises(ValueError):
        RewardConfig(normalize="batch")


def test_domain_normalisation_standardises_each_domain_separately():
    sessions = [session(f"q{i}", {"r": float(i)}, domain="qa") for i in range(3)]
    sessions += [session(f"m{i}", {"r": 100.0 * i}, domain="math") for i in range(3)]
    rewards = group_rewards(sessions, RewardConfig(baseline="none"))
    normalize_by_domain(rewards)
    for domain in ("qa", "math"):
        values = [r.advantages[0] for r in rewards if r.domain == domain]
        assert values == pytest.approx([-1.2247, 0.0, 1.2247], abs=1e-3)
