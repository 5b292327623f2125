"""Context parallelism as processes (torchrun, gloo): one step with every packed tree's tokens split across 2 and 4
ranks (and 2 x 2 with data parallelism, and with activation checkpointing) equals the one-rank step, loss and
gradients, on rollouts whose trees share prefixes and a stem (split across the ranks too, whole or in pieces), with
the MTP draft, dense and with experts; a family trained through transformers; and data-parallel ranks whose stems
need different numbers of pieces."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from forge.checkpoints import load_model
from forge.pool import Pool
from forge.v1 import common_pb2, pool_pb2

from helpers.families import SMALL, fill_on_policy, write_family
from helpers.learner_runs import CONFIG, MOE_CONFIG, Step, assert_same_update, fill_from, make_model, stepped, steps

EQUAL_ONE_RANK, FAMILY, UNEVEN = ("test_context_parallel_steps_equal_one_rank",
                                  "test_context_parallel_steps_a_family_trained_through_transformers_as_one_rank",
                                  "test_ranks_whose_stems_need_different_piece_counts_step_as_one_rank")
# (processes, context group, activation checkpointing, budget): a budget of 16 runs the stem in pieces and leaves
# trees too small to split across 4 ranks; checkpointing is checked with two data-parallel groups
LAYOUTS = {"dense": [(2, 2, False, 64), (4, 4, False, 64), (4, 2, True, 64), (4, 4, False, 16)],
           "experts": [(2, 2, False, 64), (4, 4, False, 64)]}


@pytest.fixture(scope="module")
def context_steps(request, tmp_path_factory) -> dict[tuple[str, str], tuple[dict, list[tuple[Step, dict]]]]:
    """For each case the session runs (test name, case id): the one-rank step, and each other layout's step with
    what it saved. The steps of every case run in one torchrun job per process count (1, 2 and 4), each step from a
    fresh seed, model, trainer and context groups, so torch and a job start three times, not once per step."""
    selected = {(item.originalname, getattr(item, "callspec", None) and item.callspec.id)
                for item in request.session.items if item.module is request.module}
    root = tmp_path_factory.mktemp("context")
    cases: dict[tuple[str, str], tuple[Step, list[Step]]] = {}
    for label, config in (("dense", CONFIG), ("experts", MOE_CONFIG)):
        if (EQUAL_ONE_RANK, label) in selected:
            directory = root / label
            model = make_model(7, config)
            model.save_pretrained(directory / "model")
            with Pool(directory / "pool") as pool:
                fill_from(pool, model, groups=4, group_size=3, calls=3, max_tokens=9)
            cases[EQUAL_ONE_RANK, label] = (Step(directory, directory / "model", 1), [
                Step(directory, directory / "model", nproc, context_parallel=context, micro_batch_tokens=budget,
                     activation_checkpointing=checkpointing) for nproc, context, checkpointing, budget in LAYOUTS[label]])
    if (FAMILY, None) in selected:
        directory = root / "llama"
        model_dir, _ = write_family(directory / "model", "llama", seed=5)
        with Pool(directory / "pool") as pool:
            fill_on_policy(pool, load_model(model_dir)[0], groups=4, vocab=SMALL["vocab_size"], group_size=3,
                           system_len=12)
        cases[FAMILY, None] = (Step(directory, model_dir, 1), [Step(directory, model_dir, 2, context_parallel=2)])
    for label, context in (("data-parallel", 1), ("context-parallel", 2)):
        if (UNEVEN, label) in selected:
            directory = root / label
            make_model(7, CONFIG).save_pretrained(directory / "model")
            write_uneven_stems(directory / "pool", CONFIG.vocab_size)
            cases[UNEVEN, label] = (Step(directory, directory / "model", 1, micro_batch_tokens=16), [
                Step(directory, directory / "model", 2 * context, context_parallel=context, micro_batch_tokens=16)])
    wanted = [step for one, others in cases.values() for step in (one, *others)]
    results = iter(steps(wanted))
    return {case: (next(results), [(other, next(results)) for other in others]) for case, (_, others) in cases.items()}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("config", list(LAYOUTS))
def test_context_parallel_steps_equal_one_rank(context_steps, config):
    one, others = context_steps[EQUAL_ONE_RANK, config]
    assert one["stem_tokens"] > 0 and one["tokens"] == 4 * 3 * 3 * 9
    assert one["stem_rank_tokens"] == one["stem_tokens"]
    for layout, other in others:
        nproc, context, budget = layout.nproc, layout.context_parallel, layout.micro_batch_tokens
        label = (f"{nproc} processes, context groups of {context}, checkpointing {layout.activation_checkpointing}, "
                 f"budget {budget}")
        assert other["tokens"] == one["tokens"], label
        if nproc == context and budget == 64:       # one data-parallel group: the same trees as one rank
            assert (other["packed_tokens"], other["stem_tokens"]) == (one["packed_tokens"], one["stem_tokens"])
            # the stem split as the trees are: each rank computes its zig-zag share of it
            assert other["stem_rank_tokens"] <= -(-one["stem_tokens"] // context) + 1, label
        assert_equal_steps(one, other, label)


def assert_equal_steps(one: dict, other: dict, label: str) -> None:
    assert other["loss"] == pytest.approx(one["loss"], abs=1e-5), label
    assert other["grads"].keys() == one["grads"].keys() and len(one["grads"]) > 10
    for name, grad in one["grads"].items():
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(other["grads"][name], grad, atol=1e-4 * scale, rtol=1e-4, msg=f"{label}: {name}")
    for name in one["state"]:
        assert_same_update(one, other, name)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_context_parallel_steps_a_family_trained_through_transformers_as_one_rank(context_steps):
    """Llama through transformers' own modules, Forge's tree attention registered with them: 2 ranks of one
    context group step as one rank does."""
    one, [(_, other)] = context_steps[FAMILY, None]
    assert one["stem_tokens"] > 0 and other["packed_tokens"] == one["packed_tokens"]
    assert_equal_steps(one, other, "llama, 2 ranks of one context group")


def write_uneven_stems(pool_dir: Path, vocab: int) -> None:
    """Four groups, two whose shared prompts are 60 tokens long, two 5 (their trie sizes alike): under a 16-token
    budget, the two data-parallel ranks' stems (two prompts each) need 8 pieces and 1."""
    rng = random.Random(3)
    with Pool(pool_dir) as pool:
        for group, (first, prompt_len, completion_len) in enumerate([(1, 60, 10), (2, 60, 10), (3, 5, 28),
                                                                     (4, 5, 28)]):
            prompt = [first] + [rng.randrange(3, vocab) for _ in range(prompt_len - 1)]
            for index in range(3):
                session = pool.open_session(task_id=f"t{group}", group_id=f"g{group}", group_size=3).session_id
                completion = [rng.randrange(3, vocab) for _ in range(completion_len)]
                pool.append_call(pool_pb2.CallRecord(
                    session_id=session, index=0, prompt_ids=prompt, completion_ids=completion,
                    logprobs=[-3.0] * completion_len, weight_versions=[0] * completion_len,
                    finish_reason=common_pb2.FINISH_REASON_STOP))
                pool.close_session(session_id=session, outcome_rewards={"correct": float(index)})


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("context", [1, 2], ids=["data-parallel", "context-parallel"])
def test_ranks_whose_stems_need_different_piece_counts_step_as_one_rank(context_steps, context):
    """Every rank runs as many stem passes as the rank needing the most (the others' extra ones discarded): FSDP
    gathers and reduces the parameters in each pass, so a rank running fewer would leave the others waiting."""
    one, [(_, other)] = context_steps[UNEVEN, "context-parallel" if context == 2 else "data-parallel"]
    assert one["stem_tokens"] >= 130
    assert_equal_steps(one, other, f"{2 * context} processes, context groups of {context}, budget 16")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_context_parallel_over_nccl_steps_as_one_gpu(tmp_path):
    """The same split on GPUs, a rank per GPU, the keys and values gathered over NCCL."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"context parallelism over NCCL needs two CUDA GPUs (this machine has {torch.cuda.device_count()})")
    model = make_model(7, CONFIG)
    model.save_pretrained(tmp_path / "model")
    with Pool(tmp_path / "pool") as pool:
        fill_from(pool, model, groups=4, group_size=3, calls=3, max_tokens=9)
    one = stepped(tmp_path, tmp_path / "model", 1, micro_batch_tokens=16, device="cuda")
    other = stepped(tmp_path, tmp_path / "model", 2, context_parallel=2, micro_batch_tokens=16, device="cuda")
    assert one["stem_tokens"] > 0 and other["stem_rank_tokens"] < one["stem_tokens"]
    assert_equal_steps(one, other, "2 GPUs, one context group, budget 16")
