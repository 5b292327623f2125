"""A 64k-token prompt through a real gateway and actor: prefilled in chunks while another session's call is admitted
and decodes to its end, and recorded in the pool with the ids its chat template renders and the log-probs a full
forward pass of the model gives."""

from __future__ import annotations

import random
import threading

import grpc
import httpx
import pytest

from forge.assets import TINY_DIR
from forge.model import CausalLM
from forge.pool import PoolReader
from forge.sampling.params import SamplingParams
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2_grpc, common_pb2

from helpers.engines import full_forward_logprobs
from helpers.gateway_procs import start_actor, start_gateway
from helpers.random_model import random_tiny
from helpers.waiting import wait_for

TOK = Tokenizer.from_dir(TINY_DIR)
PROMPT_TOKENS = 64 * 1024
WORDS = ("ledger", "amber", "north", "valve", "copper", "quiet", "seven", "harbor", "linen", "orbit", "maple", "delta")


def long_message(tokens: int, seed: int = 0) -> list[dict]:
    """One user message whose rendered prompt is at least ``tokens`` tokens (a tool transcript's worth of words)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(tokens)]
    low, high = 1, len(words)
    while low < high:               # the fewest words that render to ``tokens`` tokens or more
        middle = (low + high) // 2
        rendered = TOK.render_chat([{"role": "user", "content": " ".join(words[:middle])}], add_generation_prompt=True)
        low, high = (middle + 1, high) if len(TOK.encode(rendered)) < tokens else (low, middle)
    return [{"role": "user", "content": " ".join(words[:low])}]


def running(address: str) -> float:
    with grpc.insecure_channel(address) as channel:
        return actor_pb2_grpc.ActorStub(channel).Stats(common_pb2.StatsRequest(), timeout=30).gauges["running"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_64k_token_prompt_is_recorded_exactly_while_another_session_decodes(tmp_path):
    checkpoint = random_tiny(tmp_path, context=PROMPT_TOKENS + 1024, layers=1)
    actor = start_actor(tmp_path, "actor", "--model", str(checkpoint), "--kv-cache-mb", "256", "--threads", "2",
                        "--max-batched-tokens", "2048")
    try:
        gateway = start_gateway(tmp_path, [actor.address], tmp_path / "pool", "--model", str(checkpoint))
        try:
            messages = long_message(PROMPT_TOKENS)
            finished: list[str] = []
            answers: dict[str, httpx.Response] = {}

            def call(name: str, body: dict) -> None:
                answers[name] = httpx.post(f"{gateway.base_url}/chat/completions", timeout=1500,
                                           json={"model": "forge-tiny", "temperature": 0, **body})
                finished.append(name)

            long_call = threading.Thread(target=call, args=("long", {"messages": messages, "max_tokens": 4}))
            long_call.start()
            wait_for(lambda: "long" in answers or running(actor.address) >= 1, "the actor prefilling the long prompt",
                     timeout_s=600, watched=[actor.proc, gateway.proc])
            call("short", {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 4})
            long_call.join(1500)
            for name, response in answers.items():
                assert response.status_code == 200, (name, response.text[:500])
            assert finished == ["short", "long"]            # admitted and done while the long prompt was prefilled
        finally:
            gateway.stop()
    finally:
        actor.stop()

    expected = TOK.encode(TOK.render_chat(messages, add_generation_prompt=True))
    assert PROMPT_TOKENS <= len(expected) < PROMPT_TOKENS + 64
    with PoolReader(tmp_path / "pool") as reader:
        (record,) = reader.get_session(answers["long"].json()["forge"]["session_id"]).calls
    assert list(record.prompt_ids) == expected
    assert len(record.completion_ids) == len(record.logprobs) == 4
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    recomputed = full_forward_logprobs(CausalLM.from_pretrained(checkpoint).eval(), expected,
                                       list(record.completion_ids), greedy)
    assert list(record.logprobs) == pytest.approx(recomputed, abs=2e-4)
