"""The learner: log-probs equal the actor's, windowed-FIFO consumption, checkpoints with the pool cursor, a step
that moves the policy the right way, tree and sample-by-sample steps alike, and the learning rate's warm-up.
(Learner processes: integration/test_learner.py.)"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import pytest
import torch

from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.checkpoints import TINY_DIR, tiny_config, tiny_tokenizer
from forge.learner.checkpoint import Checkpointer
from forge.learner.losses import LossConfig
from forge.learner.parallel import Distributed
from forge.learner.policy import recompute_logprobs
from forge.learner.rewards import RewardConfig, batch_rewards
from forge.learner.samples import build_samples, make_micro_batch
from forge.learner.trainer import Trainer, TrainerConfig
from forge.model import CausalLM
from forge.pool import Pool
from forge.pool.window import WindowConfig
from forge.sampling.grammar import Grammar, Grammars
from forge.sampling.logit_edits import CompletionEdits
from forge.sampling.params import SamplingParams

from helpers.gradients import capture_gradients
from helpers.learner_runs import CONFIG, engine_of, fill_from, make_model
from helpers.random_model import copy_of
from helpers.rollouts import fill_pool


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=1),
                                    SamplingParams(temperature=0.7, top_k=12, max_tokens=10, ignore_eos=True,
                                                   seed=2),
                                    SamplingParams(temperature=1.3, top_p=0.8, max_tokens=10, ignore_eos=True,
                                                   seed=3),
                                    SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                                    SamplingParams(temperature=1.0, top_k=12, max_tokens=10, min_tokens=10, seed=5,
                                                   stop_token_ids=tuple(range(0, 64, 3))),
                                    SamplingParams(temperature=0, max_tokens=10, min_tokens=10, ignore_eos=True,
                                                   stop_token_ids=tuple(range(1, 64, 2))),
                                    SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=6,
                                                   logit_bias=((3, 5.0), (7, -100.0), (11, 2.5))),
                                    SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, ignore_eos=True, seed=7,
                                                   frequency_penalty=1.5, presence_penalty=0.5),
                                    SamplingParams(temperature=1.0, top_k=20, max_tokens=10, ignore_eos=True, seed=8,
                                                   repetition_penalty=1.8),
                                    SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                   repetition_penalty=0.7, frequency_penalty=-0.5,
                                                   presence_penalty=2.0, logit_bias=((5, 3.0),))])
def test_learner_logprobs_equal_the_actors_records(tmp_path, speculative, params):
    model = make_model()
    engine = engine_of(model, speculative=speculative)
    pool = Pool(tmp_path / "pool")
    try:
        fill_pool(pool, engine, groups=3, group_size=2, calls=2, params=params, vocab=64)
        entries = list(pool.fetch(10, include_calls=True).entries)
    finally:
        engine.close()
        pool.close()
    samples = build_samples(entries, batch_rewards(entries, RewardConfig()), CONFIG.eos_token_ids)
    assert len(samples) == 12 and all(s.num_completion == 10 for s in samples)
    batch = make_micro_batch(samples)
    learner = recompute_logprobs(model.eval(), batch)
    torch.testing.assert_close(learner, batch.old_logprobs, atol=2e-5, rtol=0)
    if CompletionEdits.needed(params):      # the actor edited the logits: without the edits the learner disagrees
        assert all(s.edits is not None for s in samples) and batch.edits is not None
        unbanned = recompute_logprobs(model.eval(), dataclasses.replace(batch, edits=None))
        assert not torch.allclose(unbanned, batch.old_logprobs, atol=1e-3)


def test_window_sizes():
    assert WindowConfig(mode="fifo").size(50) == 1
    assert WindowConfig(mode="greedy").size(50) == 50
    assert WindowConfig(window=0.3).size(50) == 15 and WindowConfig(window=0.3).size(0) == 1
    assert WindowConfig(window=4).size(50) == 4
    with pytest.raises(ValueError):
        WindowConfig(mode="random")


def trainer_for(model, pool, checkpoints=None, **window):
    return Trainer(model, Distributed(), TrainerConfig(lr=1e-3, checkpoint_every=1), LossConfig(),
                   RewardConfig(), WindowConfig(**{"window": 3, "batch_groups": 2, "max_wait_s": 0.5, **window}),
                   pool, checkpointer=checkpoints)


def test_steps_take_completed_entries_inside_the_window_only(tmp_path):
    model = make_model()
    pool = Pool(tmp_path / "pool")
    held = pool.open_session(task_id="slow", group_id="slow", group_size=1)   # the head entry stays pending
    fill_from(pool, model, groups=5, group_size=2)
    trainer = trainer_for(model, pool, window=3, min_groups=1, max_wait_s=0.2)
    record = trainer.step()
    assert record["positions"] == [1, 2] and record["head"] == 0      # W = 3: entries 1 and 2 only
    assert record["taken_at"] == [(0, 3), (0, 3)]
    deadline = time.monotonic() + 1.0
    assert trainer.step(should_stop=lambda: time.monotonic() > deadline) is None   # 3 is complete but outside
    pool.close_session(session_id=held.session_id, outcome_rewards={"r": 1.0})
    assert trainer.step()["positions"] == [0, 3]                      # taking 0 moves the window to [3, 5]
    assert trainer.step()["positions"] == [4, 5]
    pool.close()


def test_training_consumes_in_order_checkpoints_and_resumes(tmp_path):
    model = make_model()
    pool = Pool(tmp_path / "pool")
    fill_from(pool, model, groups=6, group_size=2)
    checkpoints = Checkpointer(tmp_path / "run" / "checkpoints")
    trainer = trainer_for(model, pool, checkpoints)
    records = [trainer.step() for _ in range(2)]
    assert [r["positions"] for r in records] == [[0, 1], [2, 3]]
    assert records[0]["version"] == 1 and records[1]["version"] == 2
    assert all(r["tokens"] == 2 * 2 * 8 and r["groups"] == 2 for r in records)
    assert pool.cursor().committed_seq == 2 and pool.cursor().head == 4
    restored = checkpoints.latest()
    assert restored.state["step"] == 2 and restored.state["pool_seq"] == 2
    reloaded = CausalLM.from_pretrained(restored.model_dir)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor)
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3ForCausalLM.from_pretrained(restored.model_dir, dtype=torch.float32)
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model.logits(model(ids)), atol=1e-5, rtol=0)
    pool.consume([4])                               # a step the checkpoint never saw
    checkpoints.record_published(3)                 # ... whose weights actors may already hold as version 3
    resumed = trainer_for(reloaded, pool, checkpoints)
    assert resumed.restore() and resumed.state.step == 2 and resumed.state.version == 4
    assert pool.cursor().head == 4                  # rewound: entry 4 is back
    assert resumed.step()["positions"] == [4, 5]
    pool.close()


def test_max_staleness_zero_trains_only_on_the_current_version(tmp_path):
    """With ``max_staleness=0`` a step trains only samples wholly of the learner's version: a batch of older ones is
    consumed without a step (no new version), and the learner waits for samples of its version."""
    model = make_model()
    pool = Pool(tmp_path / "pool")
    engine = engine_of(model)
    try:
        fill_pool(pool, engine, groups=4, group_size=2, vocab=64)                    # sampled at version 0
        trainer = Trainer(model, Distributed(), TrainerConfig(lr=1e-3, max_staleness=0), LossConfig(),
                          RewardConfig(), WindowConfig(window=1, batch_groups=2, max_wait_s=0.2), pool)
        first = trainer.step()
        assert first["version"] == 1 and first["positions"] == [0, 1] and first["staleness_max"] == 0
        taken = []
        assert trainer.step(should_stop=lambda: taken.append(1) or len(taken) > 20) is None
        assert trainer.state.version == 1 and trainer.state.trained_positions[-2:] == [2, 3]   # dropped, consumed
        engine.load_weights(1, model.state_dict())
        fill_pool(pool, engine, groups=2, group_size=2, vocab=64, seed=1)             # sampled at version 1
        second = trainer.step()
        assert second["version"] == 2 and second["positions"] == [4, 5] and second["dropped_stale"] == 0
    finally:
        engine.close()
        pool.close()


def test_a_step_moves_probability_toward_rewarded_tokens(tmp_path):
    model = make_model(3)
    pool = Pool(tmp_path / "pool")
    fill_from(pool, model, groups=16, group_size=4, max_tokens=12)
    contexts = torch.randint(1, 64, (32, 6), generator=torch.Generator().manual_seed(9))

    def even_mass() -> float:
        with torch.no_grad():
            probs = model.logits(model(contexts))[:, -1].softmax(-1)
        return float(probs[:, ::2].sum(-1).mean())

    before = even_mass()
    trainer = Trainer(model, Distributed(), TrainerConfig(lr=3e-3), LossConfig(), RewardConfig(normalize="group"),
                      WindowConfig(window=16, batch_groups=4), pool)
    for _ in range(4):
        trainer.step()
    assert even_mass() > before + 0.02
    pool.close()


def test_tree_and_sample_by_sample_steps_give_the_same_parameters(tmp_path):
    model = make_model(4)
    with Pool(tmp_path / "pool") as pool:
        fill_from(pool, model, groups=4, group_size=4, calls=3, max_tokens=8)
    results = {}
    for tree in (True, False):
        copy = tmp_path / f"pool-{tree}"
        shutil.copytree(tmp_path / "pool", copy)
        trained = make_model()
        trained.load_state_dict(model.state_dict())
        pool = Pool(copy)
        trainer = Trainer(trained, Distributed(), TrainerConfig(lr=1e-3, tree=tree, micro_batch_tokens=96),
                          LossConfig(mtp_weight=0.5, mtp_top_k=8), RewardConfig(), WindowConfig(window=4,
                                                                                               batch_groups=4),
                          pool)
        grads = capture_gradients(trainer, trained)
        results[tree] = (trainer.step(), grads)
        pool.close()
    (tree_record, tree_grads), (linear_record, linear_grads) = results[True], results[False]
    assert tree_record["loss"] == pytest.approx(linear_record["loss"], abs=1e-5)
    assert tree_record["sample_tokens"] == linear_record["sample_tokens"] == linear_record["packed_tokens"]
    assert tree_record["tree_compression"] > 1.5        # group rollouts share prompts, calls extend each other
    assert tree_record["stem_tokens"] > 0               # several trees, their shared context computed once
    assert tree_grads.keys() == linear_grads.keys() and len(linear_grads) > 10
    for name, grad in linear_grads.items():             # gradients, not Adam's scale-free first update
        torch.testing.assert_close(tree_grads[name], grad, atol=1e-6, rtol=1e-4)


def test_learning_rate_warms_up_from_the_step_count(tmp_path):
    trainer = Trainer(make_model(), Distributed(), TrainerConfig(lr=1e-3, warmup_steps=4), LossConfig(),
                      RewardConfig(), WindowConfig(), None)
    rates = []
    for step in range(6):
        trainer.state.step = step
        rates.append(trainer.learning_rate())
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    with pytest.raises(ValueError):
        TrainerConfig(warmup_steps=-1)


def test_structured_output_is_replayed_by_the_learner(tmp_path):
    """A grammar-constrained call (the built-in tokenizer's vocabulary, a small random model): every finished
    completion is a document of the schema, and the learner, replaying the grammar, recomputes the recorded
    log-probs; without the grammar's masks it would not."""
    config = dataclasses.replace(CONFIG, vocab_size=tiny_config().vocab_size, eos_token_id=tiny_config().eos_token_id)
    model = make_model(3, config)
    grammars = Grammars(TINY_DIR, config.vocab_size, tuple(config.eos_token_ids))
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22, 333]}},
                         "required": ["ok", "n"], "additionalProperties": False})
    engine = TorchEngine(copy_of(model), EngineConfig(kv_cache_bytes=4 * 2**20, block_size=8), grammars=grammars)
    pool = Pool(tmp_path / "pool")
    try:
        fill_pool(pool, engine, groups=2, group_size=2, calls=2, vocab=1000,
                  params=SamplingParams(temperature=1.0, max_tokens=40, seed=4, grammar=Grammar("json_schema", schema)))
        entries = list(pool.fetch(10, include_calls=True).entries)
    finally:
        engine.close()
        pool.close()
    finished = [call for e in entries for s in e.sessions for call in s.calls if call.finish_reason == 1]
    assert finished, "some completions reached the end of their document"
    for call in finished:
        document = json.loads(tiny_tokenizer().decode(list(call.completion_ids[:-1])))
        assert set(document) == {"ok", "n"} and document["n"] in (1, 22, 333)
    samples = build_samples(entries, batch_rewards(entries, RewardConfig()), config.eos_token_ids, grammars)
    assert len(samples) == 8 and all(s.edits is not None for s in samples)
    batch = make_micro_batch(samples)
    torch.testing.assert_close(recompute_logprobs(model.eval(), batch), batch.old_logprobs, atol=2e-5, rtol=0)
    unmasked = recompute_logprobs(model.eval(), dataclasses.replace(batch, edits=None))
    assert not torch.allclose(unmasked, batch.old_logprobs, atol=1e-3)
    assert build_samples(entries, batch_rewards(entries, RewardConfig()), config.eos_token_ids) == [], \
        "without the tokenizer's grammars the calls are left out, not trained on unmasked"
