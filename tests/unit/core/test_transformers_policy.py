"""Families Forge does not implement train through transformers: a random-weight checkpoint of each, written by
transformers, loads as the learner's policy; its log-probs are transformers' own (fp32, within 1e-5), a CISPO step's
gradients are those of the same loss computed with plain transformers and autograd, its checkpoints load back in
transformers, a prefix-tree step equals the same step sample by sample, and the torch engine refuses it naming --backend vllm."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from forge.actors.config import ActorConfig
from forge.actors.engine.factory import TorchFactory
from forge.checkpoints import ModelNotFound, is_native, load_model, trainable_model
from forge.learner.checkpoint import Checkpointer
from forge.learner.losses import LossConfig, policy_loss
from forge.learner.parallel import Distributed
from forge.learner.policy import policy_forward, recompute_logprobs
from forge.learner.rewards import RewardConfig
from forge.learner.samples import Sample, make_micro_batch
from forge.learner.trainer import Trainer, TrainerConfig
from forge.model.transformers_policy import TransformersCausalLM
from forge.pool import Pool
from forge.pool.window import WindowConfig

from helpers.families import FAMILIES, SMALL, fill_on_policy, write_family
from helpers.tree_steps import assert_same_step, make_sample, random_masks, run

VOCAB = SMALL["vocab_size"]


def samples_of(seed: int, count: int = 4) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 9))]
        completion = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 7))]
        out.append(Sample(tokens=prompt + completion, prompt_len=len(prompt), old_logprobs=[-4.5] * len(completion),
                          versions=[0] * len(completion), advantage=rng.uniform(-1, 1), temperature=0.8, top_k=0,
                          top_p=1.0, domain="d", position=0, session_id=f"s{i}", call_index=0))
    return out


def reference_logprobs(model, samples: list[Sample]) -> torch.Tensor:
    """Each completion token's log-prob at temperature 0.8, from transformers' own forward, sample by sample."""
    out = []
    for sample in samples:
        logits = model(torch.tensor([sample.tokens])).logits[0].float() / 0.8
        positions = torch.arange(sample.prompt_len - 1, len(sample.tokens) - 1)
        targets = torch.tensor(sample.tokens[sample.prompt_len:])
        out.append(logits.log_softmax(-1)[positions, targets])
    return torch.cat(out)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_learner_computes_transformers_log_probs_and_gradients(tmp_path, family):
    directory, reference = write_family(tmp_path / family, family)
    assert not is_native(directory)
    policy, _ref = load_model(directory)
    assert isinstance(policy, TransformersCausalLM)
    samples = samples_of(hash(family) % 1000)
    batch = make_micro_batch(samples)
    torch.testing.assert_close(recompute_logprobs(policy.eval(), batch), reference_logprobs(reference, samples),
                               atol=1e-5, rtol=0)

    config = LossConfig(kind="cispo", eps_high=0.2)
    total = float(batch.num_tokens)
    ours = policy_forward(policy.train(), batch).logprobs
    policy_loss(config, ours, batch.old_logprobs, batch.advantages, torch.ones_like(ours), batch.sample_index,
                total, len(samples)).backward()
    theirs = reference_logprobs(reference.train(), samples)
    policy_loss(config, theirs, batch.old_logprobs, batch.advantages, torch.ones_like(theirs), batch.sample_index,
                total, len(samples)).backward()
    by_name = dict(reference.named_parameters())
    for name, parameter in policy.named_parameters():
        assert parameter.grad is not None, name
        torch.testing.assert_close(parameter.grad, by_name[name].grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))        # untied heads, and heads tied to the embeddings
def test_checkpoints_load_back_in_transformers(tmp_path, family):
    directory, _reference = write_family(tmp_path / family, family)
    policy, _ref = load_model(directory)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))      # a trained policy differs from the start
    saved = policy.save_pretrained(tmp_path / "saved")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
    ids = torch.tensor([[5, 9, 17, 33, 40, 2]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, policy.eval().logits(policy(ids)), atol=1e-5, rtol=0)
    assert sorted(reloaded.state_dict()) == sorted({**policy.state_dict(), **(
        {"lm_head.weight": None} if policy.tied else {})})


def agent_samples(rng: random.Random, system_len: int = 10) -> list[Sample]:
    """Sessions sharing a system prompt: groups of rollouts, several calls each, some rewriting their context, some
    trained twice; long enough that the families' sliding windows (4 positions) cut into every path."""
    def tokens(count: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(count)]

    system, samples = tokens(system_len), []
    for group in range(2):
        task = system + tokens(rng.randrange(1, 4))
        for rollout in range(3):
            context = list(task)
            for call in range(rng.randrange(1, 4)):
                if call and rng.random() < 0.3:
                    context = context[:system_len] + tokens(2) + context[-2:]
                completion = tokens(rng.randrange(1, 6))
                setting = rng.choice(((1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 0, 1.0)))
                samples.append(make_sample(rng, context + completion, len(context), f"g{group}r{rollout}", call,
                                           setting))
                if rng.random() < 0.2:
                    samples.append(make_sample(rng, context + completion, len(context), setting=setting))
                context += completion + tokens(rng.randrange(0, 3))
    return samples


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tree_step_equals_the_same_step_sample_by_sample(tmp_path, family):
    """Prefix trees and the step's stem reach every family through transformers' attention interface, windows
    and soft caps included: loss and gradients of a tree step are those of the step trained sample by sample."""
    directory, _reference = write_family(tmp_path / family, family)
    policy, _ref = load_model(directory)
    rng = random.Random(sum(map(ord, family)))
    samples = agent_samples(rng)
    masks = random_masks(rng, samples)
    impls = ("dense", "segments") if family in ("gemma2", "llama") else ("dense",)
    for impl in impls:
        assert_same_step(policy.train(), samples, LossConfig(kind="cispo", eps_high=0.2), masks, budget=40,
                         impl=impl)


def test_the_torch_engine_refuses_other_families_naming_vllm(tmp_path):
    directory, _reference = write_family(tmp_path / "mistral", "mistral")
    with pytest.raises(ValueError, match="'mistral': serve it with --backend vllm"):
        TorchFactory().check(ActorConfig(model=str(directory)))
    TorchFactory().check(ActorConfig(model="tiny"))


def test_a_family_nothing_implements_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "not_a_family"}')
    with pytest.raises(ModelNotFound, match="implemented neither by Forge"):
        trainable_model(str(tmp_path))


def test_the_trainer_steps_checkpoints_and_resumes_such_a_policy(tmp_path):
    directory, _reference = write_family(tmp_path / "qwen2", "qwen2")
    policy, _ref = load_model(directory)
    pool = Pool(tmp_path / "pool")
    fill_on_policy(pool, policy, groups=4, vocab=VOCAB)
    checkpoints = Checkpointer(tmp_path / "run" / "checkpoints", tokenizer_dir=directory)
    trainer = Trainer(policy, Distributed(), TrainerConfig(lr=1e-2, checkpoint_every=1), LossConfig(),
                      RewardConfig(), WindowConfig(window=2, batch_groups=2, max_wait_s=0.5), pool,
                      checkpointer=checkpoints)
    before = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    records = [trainer.step() for _ in range(2)]
    assert [r["positions"] for r in records] == [[0, 1], [2, 3]] and records[0]["version"] == 1
    assert any(not torch.equal(before[name], tensor) for name, tensor in policy.state_dict().items())
    restored = checkpoints.latest()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(restored.model_dir, attn_implementation="eager")
    ids = torch.tensor([[5, 9, 17, 33, 40, 2]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(ids).logits, policy.eval().logits(policy(ids)), atol=1e-5,
                                   rtol=0)
    resumed = Trainer(load_model(restored.model_dir)[0], Distributed(), TrainerConfig(lr=1e-2), LossConfig(),
                      RewardConfig(), WindowConfig(window=2, batch_groups=2), pool, checkpointer=checkpoints)
    assert resumed.restore() and resumed.state.step == 2
    pool.close()


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "mistral", "llama"])
def test_a_tree_step_on_cuda_equals_sample_by_sample(tmp_path, family):
    """The GPU path: compiled flex attention with the window in its mask and the soft cap as a score modifier
    (head size 32, which the compiled kernels take)."""
    directory, _reference = write_family(tmp_path / family, family, head_dim=32)
    policy, _ref = load_model(directory, device="cuda")
    rng = random.Random(sum(map(ord, family)))
    samples = agent_samples(rng)
    assert_same_step(policy.train(), samples, LossConfig(kind="cispo", eps_high=0.2), random_masks(rng, samples),
                     budget=40, impl="flex")


def test_impl_transformers_trains_a_native_family_through_transformers_with_the_same_log_probs(tmp_path):
    from forge.checkpoints import write_builtin_checkpoint
    from forge.model import CausalLM

    directory = write_builtin_checkpoint(tmp_path / "tiny", "tiny")
    native, _ = load_model(directory, impl="native")
    through_transformers, _ = load_model(directory, impl="transformers")
    assert isinstance(native, CausalLM) and isinstance(through_transformers, TransformersCausalLM)
    assert isinstance(load_model(directory)[0], CausalLM)           # auto: native where it exists
    samples = samples_of(3)
    for sample in samples:
        sample.tokens[:] = [t * 7 for t in sample.tokens]          # any ids of the larger vocabulary
    batch = make_micro_batch(samples)
    torch.testing.assert_close(recompute_logprobs(through_transformers.eval(), batch),
                               recompute_logprobs(native.eval(), batch), atol=1e-5, rtol=0)


def test_impl_native_is_refused_for_a_family_forge_does_not_implement_before_loading(tmp_path):
    from forge.app.up.config import UpConfig
    from forge.app.up.plan import Plan
    from forge.learner.config import LearnerConfig
    from forge.rollout.config import ModelChoice
    from forge.settings import SettingsError

    directory, _reference = write_family(tmp_path / "llama", "llama")
    with pytest.raises(SettingsError, match="--model-impl native: Forge has no native implementation of 'llama'"):
        LearnerConfig(model=str(directory), pool_path=tmp_path, model_impl="native")
    plan = Plan(UpConfig(run_dir=tmp_path / "run", model=ModelChoice(path=str(directory), impl="transformers")))
    assert plan.overrides["learner"].values["model_impl"] == "transformers"


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_activation_checkpointing_changes_no_loss_or_gradient(tmp_path, family):
    """transformers' own gradient checkpointing under Forge's attention: a tree step with the stem recomputes each
    layer in its backward pass and gives the loss and gradients of keeping every activation."""
    directory, _reference = write_family(tmp_path / family, family)
    policy = load_model(directory)[0].train()
    rng = random.Random(7)
    samples = agent_samples(rng)
    masks = random_masks(rng, samples)
    config = LossConfig(kind="cispo", eps_high=0.2)
    calls = []
    hook = policy.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))   # inside
    try:
        kept = run(policy, samples, config, masks, tree=True, budget=40, impl="dense")
        plain_calls = len(calls)
        policy.activation_checkpointing(True)
        recomputed = run(policy, samples, config, masks, tree=True, budget=40, impl="dense")
    finally:
        policy.activation_checkpointing(False)
        hook.remove()
    assert len(calls) - plain_calls > plain_calls       # the checkpointed step ran layers again in its backward
    assert recomputed[0] == pytest.approx(kept[0], rel=1e-6)
    for name, grad in kept[1].items():
        torch.testing.assert_close(recomputed[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_both_implementations_offer_what_the_policy_protocol_names(tmp_path):
    """Forge's CausalLM and the transformers policy both offer every member of forge.model.policy's protocols, and
    read the end-of-sequence ids the same way."""
    from forge.checkpoints import tiny_model
    from forge.model.policy import Policy, PolicyConfig

    directory, _reference = write_family(tmp_path / "llama", "llama")
    members = [name for name in (*Policy.__annotations__, *vars(Policy)) if not name.startswith("_")]
    config_members = [name for name in (*PolicyConfig.__annotations__, *vars(PolicyConfig)) if not name.startswith("_")]
    for policy in (tiny_model(), load_model(directory, impl="transformers")[0]):
        assert [name for name in members if not hasattr(policy, name)] == []
        assert [name for name in config_members if not hasattr(policy.config, name)] == []
        assert isinstance(policy.config.eos_token_ids, tuple)
