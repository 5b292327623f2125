"""GSPO, DAPO and Dr. GRPO, the group-mean, std-normalised and RLOO advantages, DAPO's soft overlong penalty and
dynamic sampling, and a team's own loss: each loss's value and gradient against a reference written out token by
token (or sequence by sequence) on random tensors, with token and sequence normalisation; tree packing against
sample-by-sample training; dynamic sampling's exactly-once consumption of the pool; a plug-in CISPO training as
``--loss cispo`` does; bad plug-ins refused before the run."""

from __future__ import annotations

import math
import random
import shutil
import statistics

import pytest
import torch
from click.testing import CliRunner

from forge.learner.cli import learner
from forge.learner.config import LearnerConfig
from forge.learner.dynamic_sampling import filled_batch
from forge.learner.losses import LossConfig, check_loss_function, dapo_loss, dr_grpo_loss, gspo_loss, policy_loss
from forge.learner.parallel import Distributed
from forge.learner.rewards import RewardConfig, constant_group, group_rewards, overlong_penalty
from forge.learner.trainer import Trainer
from forge.learner.trainer_config import TrainerConfig
from forge.loading import PluginError
from forge.pool import Pool, WindowConfig, WindowedFifo
from forge.settings import SettingsError
from forge.v1 import pool_pb2

from helpers.gradients import capture_gradients
from helpers.learner_runs import make_model
from helpers.random_model import random_model, small_config
from helpers.threads import one_thread  # noqa: F401  (autouse)
from helpers.tree_steps import VOCAB, agent_batch, assert_same_step, random_masks

# ------------------------------------------------------------------------------------------------ random tensors


def case(seed: int, tokens: int = 48, sequences: int = 6, noise: float = 0.3, per_sequence: bool = True):
    """Logits (float64, with gradient), targets, behaviour log-probs near the current ones, advantages (one per
    sequence, or one per token), a mask with holes and the sorted sequence index."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, 13, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (tokens,), generator=generator)
    index = torch.sort(torch.randint(0, sequences, (tokens,), generator=generator)).values
    index = torch.unique(index, return_inverse=True)[1]         # 0 … S − 1, none empty
    old = logp_of(logits.detach(), targets) + noise * torch.randn(tokens, generator=generator, dtype=torch.float64)
    if per_sequence:
        advantages = torch.randn(int(index.max()) + 1, generator=generator, dtype=torch.float64)[index]
    else:
        advantages = torch.randn(tokens, generator=generator, dtype=torch.float64)
    mask = (torch.rand(tokens, generator=generator) > 0.2).double()
    return logits, targets, old, advantages, mask, index


def logp_of(logits, targets):
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def by_hand(logits, total):
    """The loss ``total(lp)`` computes from a list of each token's log-prob (Python scalars' arithmetic), and its
    gradient with respect to the logits."""
    logits = logits.detach().clone().requires_grad_(True)
    lps = [torch.log_softmax(logits[i], -1) for i in range(logits.shape[0])]
    loss = total(lps)
    loss.backward()
    return loss.detach(), logits.grad


def assert_matches(logits, loss, expected):
    loss.backward()
    expected_loss, expected_grad = expected
    torch.testing.assert_close(loss.detach(), expected_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits.grad, expected_grad, atol=1e-6, rtol=0)


def sequences_of(index, mask):
    """Per sequence, its tokens' positions and its trained ones'."""
    out = {}
    for s in sorted(set(index.tolist())):
        positions = [i for i in range(len(index)) if int(index[i]) == s]
        out[s] = (positions, [i for i in positions if float(mask[i]) > 0])
    return out


# ------------------------------------------------------------------------------------------------------- GSPO


def gspo_sequence_reference(targets, old, adv, mask, index, eps_low, eps_high, norm):
    """GSPO as the paper writes it, one sequence at a time: s_i = exp(mean over its trained tokens of log r),
    J_i = min(s_i Â_i, clip(s_i) Â_i); −Σ J_i / S (sequence) or −Σ |y_i| J_i / N (token)."""
    def total(lps):
        loss, tokens = 0.0, float(mask.sum())
        groups = sequences_of(index, mask)
        for _, trained in groups.values():
            if not trained:
                continue
            mean = sum(lps[i][targets[i]] - float(old[i]) for i in trained) / len(trained)
            ratio, advantage = torch.exp(mean), float(adv[trained[0]])
            term = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantage)
            loss = loss - (term / len(groups) if norm == "sequence" else term * len(trained) / tokens)
        return loss
    return total


def gspo_token_reference(targets, old, adv, mask, index, eps_low, eps_high, norm):
    """GSPO-token, token by token: s_t = sg(s_i) · π_t / sg(π_t), J_t = min(s_t Â_t, clip(s_t) Â_t)."""
    def total(lps):
        loss, tokens = 0.0, float(mask.sum())
        groups = sequences_of(index, mask)
        for _, trained in groups.values():
            if not trained:
                continue
            s = math.exp(sum(float(lps[i][targets[i]].detach()) - float(old[i]) for i in trained) / len(trained))
            for i in trained:
                lp = lps[i][targets[i]]
                ratio = s * torch.exp(lp - float(lp.detach()))
                term = torch.minimum(ratio * float(adv[i]), torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * float(adv[i]))
                loss = loss - (term / len(trained) / len(groups) if norm == "sequence" else term / tokens)
        return loss
    return total


def assert_some_clipped(logits, targets, old, mask, index, eps_low, eps_high):
    """The case exercises both sides of the clip: some sequence ratios inside [1 − ε_low, 1 + ε_high], some out."""
    inside = []
    for _, trained in sequences_of(index, mask).values():
        if trained:
            log_ratio = sum(float(logp_of(logits.detach(), targets)[i] - old[i]) for i in trained) / len(trained)
            inside.append(1 - eps_low <= math.exp(log_ratio) <= 1 + eps_high)
    assert any(inside) and not all(inside)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm", ["sequence", "token"])
@pytest.mark.parametrize("eps,noise", [((3e-4, 4e-4), 1.5e-3), ((0.2, 0.3), 0.8)], ids=["paper", "wide"])
def test_gspo_is_the_sequence_objective(seed, norm, eps, noise):
    logits, targets, old, adv, mask, index = case(seed, noise=noise)
    assert_some_clipped(logits, targets, old, mask, index, *eps)
    sequences = float(int(index.max()) + 1)
    loss = gspo_loss(logp_of(logits, targets), old, adv, mask, index, float(mask.sum()), sequences, *eps, norm)
    assert_matches(logits, loss, by_hand(logits, gspo_sequence_reference(targets, old, adv, mask, index, *eps, norm)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm", ["sequence", "token"])
def test_gspo_with_an_advantage_per_token_is_gspo_token(seed, norm):
    logits, targets, old, adv, mask, index = case(seed, noise=0.6, per_sequence=False)
    assert_some_clipped(logits, targets, old, mask, index, 0.1, 0.15)
    config = LossConfig(kind="gspo", gspo_eps_low=0.1, gspo_eps_high=0.15, token_norm=norm)
    sequences = float(int(index.max()) + 1)
    loss = policy_loss(config, logp_of(logits, targets), old, adv, mask, index, float(mask.sum()), sequences)
    assert_matches(logits, loss, by_hand(logits, gspo_token_reference(targets, old, adv, mask, index, 0.1, 0.15,
                                                                      norm)))


def test_gspo_defaults_are_the_paper_s():
    assert (LossConfig().gspo_eps_low, LossConfig().gspo_eps_high) == (3e-4, 4e-4)
    assert (LossConfig().dapo_eps_low, LossConfig().dapo_eps_high) == (0.2, 0.28)


# --------------------------------------------------------------------------------------------- DAPO, Dr. GRPO


def ppo_reference(targets, old, adv, mask, low, high, denominator):
    def total(lps):
        loss = 0.0
        for i in range(len(targets)):
            ratio = torch.exp(lps[i][targets[i]] - float(old[i]))
            term = torch.minimum(ratio * float(adv[i]), torch.clamp(ratio, 1 - low, 1 + high) * float(adv[i]))
            loss = loss - term * float(mask[i]) / denominator
        return loss
    return total


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm", ["sequence", "token"])     # DAPO is token-level whatever token_norm says
def test_dapo_is_clip_higher_over_the_batch_s_tokens(seed, norm):
    logits, targets, old, adv, mask, index = case(seed, per_sequence=seed % 2 == 0)
    tokens = float(mask.sum())
    config = LossConfig(kind="dapo", token_norm=norm)
    loss = policy_loss(config, logp_of(logits, targets), old, adv, mask, index, tokens, 6.0)
    assert_matches(logits, loss, by_hand(logits, ppo_reference(targets, old, adv, mask, 0.2, 0.28, tokens)))
    logits.grad = None
    direct = dapo_loss(logp_of(logits, targets), old, adv, mask, tokens, 0.1, 0.5)
    assert_matches(logits, direct, by_hand(logits, ppo_reference(targets, old, adv, mask, 0.1, 0.5, tokens)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("max_tokens", [0, 16])
def test_dr_grpo_divides_by_a_constant_not_by_each_length(seed, max_tokens):
    logits, targets, old, adv, mask, index = case(seed)
    tokens, sequences = float(mask.sum()), float(int(index.max()) + 1)
    config = LossConfig(kind="dr_grpo", clip_eps=0.2, dr_grpo_max_tokens=max_tokens, token_norm="sequence")
    loss = policy_loss(config, logp_of(logits, targets), old, adv, mask, index, tokens, sequences)
    denominator = sequences * max_tokens if max_tokens else tokens
    assert_matches(logits, loss, by_hand(logits, ppo_reference(targets, old, adv, mask, 0.2, 0.2, denominator)))
    logits.grad = None
    direct = dr_grpo_loss(logp_of(logits, targets), old, adv, mask, tokens, sequences, 0.2, max_tokens)
    assert float(direct) == pytest.approx(float(loss), abs=1e-12)


def test_dr_grpo_refuses_std_normalised_advantages():
    with pytest.raises(SettingsError, match="--normalize none"):
        LearnerConfig(pool_address="localhost:1", loss=LossConfig(kind="dr_grpo"),
                      reward=RewardConfig(normalize="group"))
    LearnerConfig(pool_address="localhost:1", loss=LossConfig(kind="dr_grpo"), reward=RewardConfig())


# ----------------------------------------------------------------------------------------------- advantages


def session(sid: str, outcome: float, completion: int = 1, calls: int = 1, process=()) -> pool_pb2.SessionWithCalls:
    record = pool_pb2.SessionRecord(session_id=sid, status=pool_pb2.SESSION_STATUS_COMPLETED, domain="qa",
                                    started_at=1.0, ended_at=2.0, outcome_rewards={"r": outcome})
    call_records = []
    for index in range(calls):
        call = pool_pb2.CallRecord(session_id=sid, index=index, prompt_ids=[1], completion_ids=[2] * completion,
                                   logprobs=[-0.1] * completion, weight_versions=[0] * completion)
        call.process_rewards.extend(process[index] if index < len(process) else [])
        call_records.append(call)
    return pool_pb2.SessionWithCalls(session=record, calls=call_records)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("baseline,normalize", [("group", "none"), ("group", "group"), ("rloo", "none"),
                                                ("rloo", "group"), ("none", "none")])
def test_advantages_equal_their_estimators_by_hand(seed, baseline, normalize):
    rng = random.Random(seed)
    size = rng.randrange(2, 7)
    outcomes = [rng.choice([0.0, 1.0, rng.uniform(-1, 2)]) for _ in range(size)]
    process = [[[rng.uniform(-0.5, 0.5)], [], [rng.uniform(-0.5, 0.5)]] for _ in range(size)]
    config = RewardConfig(baseline=baseline, normalize=normalize, gamma=0.9)
    out = group_rewards([session(f"s{i}", outcomes[i], calls=3, process=process[i]) for i in range(size)], config)
    rewards = [[p[0][0], 0.0, p[2][0] + o] for p, o in zip(process, outcomes, strict=True)]
    to_go = [[r[0] + 0.9 * r[1] + 0.81 * r[2], r[1] + 0.9 * r[2], r[2]] for r in rewards]
    returns = [g[0] for g in to_go]
    std = statistics.pstdev(returns) + 1e-6 if normalize == "group" else 1.0
    for i, s in enumerate(out):
        if baseline == "group":
            base = sum(returns) / size
        elif baseline == "rloo":                                # the others' mean
            base = sum(returns[j] for j in range(size) if j != i) / (size - 1)
        else:
            base = 0.0
        assert s.advantages == pytest.approx([(g - base) / std for g in to_go[i]], abs=1e-9)
        assert s.session_return == pytest.approx(returns[i])


def test_rloo_is_the_group_mean_advantage_scaled_by_g_over_g_minus_one():
    outcomes = [0.0, 1.0, 1.0, 0.5]
    mean = group_rewards([session(str(i), o) for i, o in enumerate(outcomes)], RewardConfig())
    rloo = group_rewards([session(str(i), o) for i, o in enumerate(outcomes)], RewardConfig(baseline="rloo"))
    for m, r in zip(mean, rloo, strict=True):
        assert r.advantages[0] == pytest.approx(m.advantages[0] * 4 / 3)
    alone = group_rewards([session("a", 1.0)], RewardConfig(baseline="rloo"))
    assert alone[0].advantages == [0.0]


def test_the_soft_overlong_penalty_is_dapo_s():
    assert [overlong_penalty(n, 20, 4) for n in (1, 16, 17, 18, 20, 21, 99)] == [0, 0, -0.25, -0.5, -1, -1, -1]
    assert overlong_penalty(10**6, 0, 4) == 0.0
    out = group_rewards([session("a", 1.0, completion=18), session("b", 1.0, completion=3)],
                        RewardConfig(overlong_max=20, overlong_cache=4, baseline="none"))
    assert [s.rewards for s in out] == [[0.5], [1.0]]
    with pytest.raises(SettingsError, match="--overlong-cache"):
        RewardConfig(overlong_max=10, overlong_cache=20)


def test_constant_groups():
    config = RewardConfig()
    assert constant_group(group_rewards([session("a", 1.0), session("b", 1.0)], config))
    assert not constant_group(group_rewards([session("a", 1.0), session("b", 0.0)], config))
    assert constant_group(group_rewards([session("a", 0.3)], config))


# ---------------------------------------------------------------------------------------- tree = sample by sample

TREE_CONFIG = small_config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, head_dim=8)


@pytest.fixture(scope="module")
def tree_model():
    return random_model(TREE_CONFIG, std=0.3)


@pytest.mark.parametrize("kind", ["gspo", "gspo-per-token", "dapo", "dr_grpo", "plugin"])
@pytest.mark.parametrize("budget", [4096, 40])
def test_tree_step_equals_sample_by_sample(tree_model, kind, budget, tmp_path):
    rng = random.Random(7)
    samples = agent_batch(tree_model, random.Random(3))
    kind, _, per = kind.partition("-per-")
    function = None
    if kind == "plugin":
        function = write_plugin(tmp_path, CISPO_SEQUENCE)
    config = LossConfig(kind="cispo" if function else kind, function=function, gspo_eps_low=0.05,
                        gspo_eps_high=0.08, dr_grpo_max_tokens=12, mtp_weight=0.5, mtp_top_k=5,
                        token_norm="token" if per else "sequence")
    assert_same_step(tree_model, samples, config, random_masks(rng, samples), budget, linear_budget=budget * 2)


# ------------------------------------------------------------------------------------------- dynamic sampling


def add_group(pool: Pool, group: int, outcomes: list[float], rng: random.Random) -> None:
    prompt = [rng.randrange(1, 64) for _ in range(5)]
    for outcome in outcomes:
        record = pool.open_session(task_id=f"t{group}", domain="qa", group_id=f"g{group}", group_size=len(outcomes))
        completion = [rng.randrange(1, 64) for _ in range(4)]
        pool.append_call(pool_pb2.CallRecord(session_id=record.session_id, index=0, prompt_ids=prompt,
                                             completion_ids=completion, logprobs=[-3.0 - rng.random() for _ in
                                                                                 completion],
                                             weight_versions=[0] * 4, actor="test", finish_reason=1))
        pool.close_session(session_id=record.session_id, outcome_rewards={"r": outcome})


CONSTANT = [True, False, True, True, False, False, True, False, True, True, False, False, True]


def pool_of_groups(path) -> tuple[Pool, set[int], set[int]]:
    """A pool of len(CONSTANT) groups of 3 sessions, the constant ones rewarded alike; (pool, their positions, the
    others')."""
    pool, rng = Pool(path), random.Random(0)
    for group, constant in enumerate(CONSTANT):
        add_group(pool, group, [1.0, 1.0, 1.0] if constant else [1.0, 0.0, rng.random()], rng)
    return (pool, {i for i, c in enumerate(CONSTANT) if c}, {i for i, c in enumerate(CONSTANT) if not c})


def test_dynamic_sampling_replaces_constant_groups_and_consumes_each_entry_once(tmp_path):
    pool, constant, varied = pool_of_groups(tmp_path / "pool")
    fifo = WindowedFifo(pool, WindowConfig(mode="fifo", batch_groups=2, max_wait_s=0.05))
    trained, dropped, seqs = [], [], []
    while (batch := filled_batch(fifo, RewardConfig(), lambda: pool.cursor().head >= len(CONSTANT))) is not None:
        trained += [e.position for e in batch.entries]
        dropped += batch.dropped
        seqs.append(batch.seq)
        assert len(batch.entries) == 2 or pool.cursor().head == len(CONSTANT)
        assert len(batch.taken_at) == len(batch.entries)
    assert sorted(trained) == sorted(varied) and sorted(dropped) == sorted(constant)
    assert len(trained) + len(dropped) == len(CONSTANT)         # each entry taken once: trained or dropped
    assert trained == sorted(trained)                           # FIFO order kept
    assert seqs == sorted(seqs) and pool.cursor().head == len(CONSTANT) == pool.cursor().tail
    pool.close()


def test_the_trainer_drops_constant_groups_counts_them_and_resumes_exactly_once(tmp_path):
    from forge.learner.checkpoint import Checkpointer

    pool, constant, varied = pool_of_groups(tmp_path / "pool")
    checkpoints = Checkpointer(tmp_path / "run" / "checkpoints")

    def trainer(model):
        return Trainer(model, Distributed(), TrainerConfig(lr=1e-3, checkpoint_every=2), LossConfig(kind="dapo"),
                       RewardConfig(dynamic_sampling=True),
                       WindowConfig(mode="fifo", batch_groups=2, max_wait_s=0.05), pool, checkpointer=checkpoints)

    first = trainer(make_model())
    records = [first.step() for _ in range(3)]      # the third is lost: no checkpoint after it
    assert [r["positions"] for r in records] == [[1, 4], [5, 7], [10, 11]]
    assert [r["dropped_positions"] for r in records] == [[0, 2, 3], [6], [8, 9]]
    assert [r["dropped_groups"] for r in records] == [3, 1, 2] and all(r["groups"] == 2 for r in records)
    assert checkpoints.latest().state["pool_seq"] == records[1]["pool_seq"]
    resumed = trainer(make_model())
    assert resumed.restore()
    rest = []
    while (record := resumed.step(lambda: pool.cursor().head >= len(CONSTANT))) is not None:
        rest.append(record)
    lineage = records[:2] + rest
    trained = [p for r in lineage for p in r["positions"]]
    dropped = [p for r in lineage for p in r["dropped_positions"]]
    assert [r["positions"] for r in rest] == [[10, 11]] and rest[0]["dropped_positions"] == [8, 9]
    assert sorted(trained) == sorted(varied)
    # the last group, constant with nothing left to replace it, is consumed without a step (and counted later)
    assert sorted(dropped) == sorted(constant - {12}) and resumed.dropped_groups == [12]
    assert 12 in resumed.state.trained_positions and pool.cursor().head == len(CONSTANT)
    pool.close()


# ------------------------------------------------------------------------------------------- a team's own loss

CISPO_TOKEN = '''
import torch


def loss(logp, old_logp, advantages, mask, sample_index, total_tokens, total_sequences):
    """CISPO, written out: the detached, clipped IS weight times the advantage times log pi, over the tokens."""
    weight = torch.clamp(torch.exp(logp.detach() - old_logp), min=0.0, max=2.0)
    return -(weight * advantages * logp * mask).sum() / total_tokens
'''

CISPO_SEQUENCE = '''
import torch


def loss(logp, old_logp, advantages, mask, sample_index, total_tokens, total_sequences):
    """CISPO averaged within each sequence, then over the global number of sequences."""
    weight = torch.clamp(torch.exp(logp.detach() - old_logp), min=0.0, max=2.0)
    terms = weight * advantages * logp * mask
    size = int(sample_index.max()) + 1
    sums = torch.zeros(size, dtype=terms.dtype).index_add(0, sample_index, terms)
    counts = torch.zeros(size, dtype=terms.dtype).index_add(0, sample_index, mask.to(terms.dtype))
    return -(sums / counts.clamp(min=1)).sum() / total_sequences
'''


def write_plugin(directory, source: str, name: str = "my_loss.py") -> str:
    (directory / name).write_text(source)
    return f"{directory / name}:loss"


def test_a_plugin_cispo_trains_as_loss_cispo(tmp_path):
    base = make_model(5)
    with Pool(tmp_path / "pool") as pool:
        rng = random.Random(1)
        for group in range(6):
            add_group(pool, group, [rng.random() for _ in range(3)], rng)
    function = write_plugin(tmp_path, CISPO_TOKEN)
    runs = {}
    for name, loss in (("cispo", LossConfig(kind="cispo")), ("plugin", LossConfig(kind="ppo", function=function))):
        shutil.copytree(tmp_path / "pool", tmp_path / f"pool-{name}")
        model = make_model()
        model.load_state_dict(base.state_dict())
        pool = Pool(tmp_path / f"pool-{name}")
        trainer = Trainer(model, Distributed(), TrainerConfig(lr=1e-3), loss, RewardConfig(),
                          WindowConfig(mode="fifo", batch_groups=2), pool)
        grads = capture_gradients(trainer, model)
        steps = []
        for _ in range(3):
            record = trainer.step()
            steps.append((record["policy_loss"], {k: v.clone() for k, v in grads.items()}))
        runs[name] = steps, model.state_dict()
        pool.close()
    (cispo, cispo_state), (plugin, plugin_state) = runs["cispo"], runs["plugin"]
    for (loss_a, grads_a), (loss_b, grads_b) in zip(cispo, plugin, strict=True):
        assert loss_b == pytest.approx(loss_a, abs=1e-6)
        assert grads_a.keys() == grads_b.keys() and grads_a
        for key, grad in grads_a.items():
            torch.testing.assert_close(grads_b[key], grad, atol=1e-6, rtol=1e-5)
    for key, value in cispo_state.items():
        torch.testing.assert_close(plugin_state[key], value, atol=1e-6, rtol=1e-5)


BAD = {
    "vector": ("def loss(logp, old, adv, mask, index, tokens, sequences):\n    return logp * adv\n",
               "not a scalar tensor"),
    "raises": ("def loss(logp, old, adv, mask, index, tokens, sequences):\n    raise KeyError('advantage')\n",
               "failed on a dry batch: KeyError"),
    "detached": ("def loss(logp, old, adv, mask, index, tokens, sequences):\n    return (logp * adv).sum().detach()\n",
                 "without a gradient"),
    "nan": ("def loss(logp, old, adv, mask, index, tokens, sequences):\n    return (logp * adv).sum() / 0 * 0\n",
            "not a finite value"),
    "arguments": ("def loss(logp, old):\n    return logp.sum()\n", "failed on a dry batch: TypeError"),
    "number": ("def loss(logp, old, adv, mask, index, tokens, sequences):\n    return 1.0\n", "not a scalar tensor"),
    "not a function": ("loss = 3\n", "is not a function"),
    "no such name": ("def other():\n    pass\n", "has no attribute 'loss'"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_plugin_is_refused_in_one_line(tmp_path, bad):
    source, reason = BAD[bad]
    spec = write_plugin(tmp_path, source, name=f"bad_{bad.replace(' ', '_')}.py")
    with pytest.raises(PluginError, match=reason) as raised:
        check_loss_function(spec)
    assert "\n" not in str(raised.value)
    with pytest.raises(PluginError):
        Trainer(make_model(), Distributed(), TrainerConfig(), LossConfig(function=spec), RewardConfig(),
                WindowConfig(), None)


def test_the_learner_refuses_a_bad_plugin_before_starting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad_loss.py").write_text("def loss(logp, *rest):\n    return logp\n")
    (tmp_path / "run.toml").write_text('[learner.loss]\nfunction = "bad_loss.py:loss"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)              # the file is found next to the run file
    result = CliRunner().invoke(learner, ["--config", str(tmp_path / "run.toml"), "--pool", str(tmp_path / "pool"),
                                          "--create-pool", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "--loss-function" in result.output and "not a scalar tensor" in result.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "pool").exists()
    good = write_plugin(tmp_path, CISPO_TOKEN, name="good_loss.py")
    assert check_loss_function(good) is check_loss_function(good)
