"""Pools to browse: a small one recorded with the built-in tokenizer's text (groups of two domains, several weight
versions, a context-management rewrite, a completion holding markup), and many small sessions for counting work."""

from __future__ import annotations

from pathlib import Path

from forge.pool import Pool
from forge.v1 import common_pb2, pool_pb2

MARKUP = "<script>alert(1)</script><b>bold</b> & <img src=x onerror=alert(2)>"


def _call(session_id: str, index: int, prompt: list[int], completion: list[int], version: int,
          logprob: float = -0.5) -> pool_pb2.CallRecord:
    return pool_pb2.CallRecord(
        session_id=session_id, index=index, prompt_ids=prompt, completion_ids=completion,
        logprobs=[logprob - 0.1 * (i % 5) for i in range(len(completion))], weight_versions=[version] * len(completion),
        actor="actor-0", finish_reason=common_pb2.FINISH_REASON_STOP, created_at=1000.0 + index)


def record_demo(path: Path) -> dict[str, str]:
    """A pool at ``path``: group "math" (3 sessions, rewards 1, 0, 1, versions 1-2, one with two calls and one
    whose second call rewrites its history), group "web" (2 sessions, the first answering ``MARKUP``, rewards 0.5 and
    failed), and one open session. Returns the notable session ids by role."""
    from forge.checkpoints import tiny_tokenizer

    tok = tiny_tokenizer()

    def chat(role: str, text: str) -> list[int]:
        return tok.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n")

    system = chat("system", "You are a careful assistant.")
    with Pool(path, sync=False) as pool:
        for i, reward in enumerate((1.0, 0.0, 1.0)):
            sid = f"math-{i}"
            pool.open_session(session_id=sid, task_id="add", domain="math", group_id="math", group_size=3)
            prompt = system + chat("user", "What is 12 + 30?") + tok.encode("<|im_start|>assistant\n")
            answer = tok.encode("<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 12, \"b\": 30}}</tool_call>")
            pool.append_call(_call(sid, 0, prompt, answer, 1))
            if i == 0:
                follow = prompt + answer + chat("tool", "42") + tok.encode("<|im_start|>assistant\n")
                pool.append_call(_call(sid, 1, follow, tok.encode("It is 42."), 2, -0.2))
                pool.add_process_reward(sid, 1, 0.25)
            if i == 2:        # context management: the history is rewritten to the system prompt and a summary
                rewritten = system + chat("user", "Summary: the tool said 42.") + tok.encode("<|im_start|>assistant\n")
                pool.append_call(_call(sid, 1, rewritten, tok.encode("42."), 2, -0.1))
            pool.close_session(session_id=sid, outcome_rewards={"correct": reward})
        for i in range(2):
            sid = f"web-{i}"
            pool.open_session(session_id=sid, task_id="page", domain="web", group_id="web", group_size=2)
            prompt = system + chat("user", "Write a web page.") + tok.encode("<|im_start|>assistant\n")
            pool.append_call(_call(sid, 0, prompt, tok.encode(MARKUP if i == 0 else "No."), 3, -1.5))
            if i == 0:
                pool.close_session(session_id=sid, outcome_rewards={"correct": 0.5})
            else:
                pool.close_session(session_id=sid, failed=True, failure_reason="timeout")
        pool.open_session(session_id="open-0", task_id="later", domain="math")
    return {"multi": "math-0", "rewrite": "math-2", "markup": "web-0", "failed": "web-1", "open": "open-0"}


def record_many(path: Path, sessions: int, group_size: int = 4) -> None:
    """``sessions`` closed sessions of one call each, in groups, domains "a" and "b" alternating by group, rewards
    by session parity, weight version the group's number."""
    with Pool(path, sync=False) as pool:
        for g in range(sessions // group_size):
            for i in range(group_size):
                sid = f"s{g:05d}-{i}"
                pool.open_session(session_id=sid, task_id=f"t{g}", domain="ab"[g % 2], group_id=f"g{g}",
                                  group_size=group_size)
                pool.append_call_async(_call(sid, 0, [1, 2, 3, g % 100], [4, 5], g))
            for i in range(group_size):
                pool.close_session(session_id=f"s{g:05d}-{i}", outcome_rewards={"r": float(i % 2)})
