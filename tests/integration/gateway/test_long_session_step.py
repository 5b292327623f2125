"""One learner step on a 64k-token session within a stated memory bound: ``forge-learner``, a process of its own,
trains one step on a pool whose group holds a session of 65,536 tokens (two calls, the second's prompt extending the
first's transcript by a long tool output) and a short one sharing its first prompt, at the default
``--micro-batch-tokens`` with activation checkpointing; the kernel's count of the process's peak resident memory
stays under ``MEMORY_BOUND_MB`` (4 GiB), where one T×T matrix of attention scores over the session would alone take
16 GiB. Measured, not timed."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

from forge.pool import Pool
from forge.v1 import common_pb2, pool_pb2

from conftest import script
from helpers.random_model import random_model, small_config

SESSION_TOKENS = 65_536
FIRST_PROMPT, COMPLETION = 24_000, 256
# The process with torch loaded holds about 400 MB before the step; its peak was 590 MB on an idle 2-core machine and
# 1,734 MB on a loaded one (the allocator's arenas per thread keep more freed memory there). The step's activations
# with checkpointing are a layer's over one tree and the stem's keys and values, linear in the tokens: any T x T
# matrix (16 GiB for one head's scores) would break the bound by far.
MEMORY_BOUND_MB = 4_096
CONFIG = small_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, num_nextn_predict_layers=0,
                      max_position_embeddings=SESSION_TOKENS + 1024)


def call(session_id: str, index: int, prompt: list[int], completion: list[int]) -> pool_pb2.CallRecord:
    return pool_pb2.CallRecord(session_id=session_id, index=index, prompt_ids=prompt, completion_ids=completion,
                               logprobs=[-4.0] * len(completion), weight_versions=[0] * len(completion),
                               finish_reason=common_pb2.FINISH_REASON_STOP)


def write_pool(path, rng: random.Random) -> None:
    """A group of two sessions: the long one (two calls, SESSION_TOKENS in all) and a short one (its first prompt)."""
    draw = lambda n: [rng.randrange(3, CONFIG.vocab_size) for _ in range(n)]       # noqa: E731
    prompt = draw(FIRST_PROMPT)
    first = draw(COMPLETION)
    tool_output = draw(SESSION_TOKENS - FIRST_PROMPT - 3 * COMPLETION)
    with Pool(path) as pool:
        for name in ("long", "short"):
            pool.open_session(session_id=name, task_id="t", group_id="g", group_size=2)
        pool.append_call(call("long", 0, prompt, first))
        pool.append_call(call("long", 1, prompt + first + tool_output, draw(COMPLETION)))
        pool.append_call(call("short", 0, prompt, draw(COMPLETION)))
        pool.close_session(session_id="long", outcome_rewards={"correct": 1.0})
        pool.close_session(session_id="short", outcome_rewards={"correct": 0.0})


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_step_on_a_64k_token_session_stays_within_its_memory_bound(tmp_path):
    random_model(CONFIG, seed=0, std=0.2).save_pretrained(tmp_path / "model")
    write_pool(tmp_path / "pool", random.Random(0))
    learner = subprocess.Popen([script("forge-learner"), "--pool", str(tmp_path / "pool"), "--run-dir",
                                str(tmp_path / "run"), "--model", str(tmp_path / "model"), "--no-publish",
                                "--batch-groups", "1", "--max-steps", "1", "--activation-checkpointing"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = learner.stdout.read()
    _, status, usage = os.wait4(learner.pid, 0)       # this process's own peak, not its siblings'
    learner.returncode = os.waitstatus_to_exitcode(status)
    assert learner.returncode == 0, output[-3000:]
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["step"] == 1 and step["positions"] == [0]
    assert step["sample_tokens"] >= SESSION_TOKENS and step["packed_tokens"] <= SESSION_TOKENS, step
    peak_mb = usage.ru_maxrss / 1024
    assert peak_mb < MEMORY_BOUND_MB, f"peak RSS {peak_mb:.0f} MB; the step: {step}"
