"""The grammar sandbox (forge.structured.sandbox): grammars compiled against the tokenizer in a child process under
a memory limit. An allocation past the limit ends the child, not the caller, and the next check starts a new one; a
grammar that compiles but cannot take its first token is refused; verdicts are kept; a child that does not answer in
time is ended; a check awaited on an event loop leaves the loop free."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from forge.checkpoints import resolve_model
from forge.sampling.grammar import json_lark
from forge.structured.sandbox import GrammarSandbox, SandboxSpec

TINY = resolve_model("tiny").directory


def lark_of(schema: object) -> str:
    """A schema's grammar as the engines compile it, without the bounds check in front (the sandbox's own test)."""
    return "start: " + json_lark(json.dumps(schema))


@pytest.fixture
def sandbox():
    spec = SandboxSpec.of_checkpoint(TINY, memory_mb=512)
    assert spec is not None and spec.vocab_size == 1024 and spec.eos_token_ids
    checker = GrammarSandbox(spec)
    yield checker
    checker.close()


def test_a_grammar_needing_more_memory_than_the_limit_ends_the_child_not_the_caller(sandbox):
    assert sandbox.problem(lark_of({"type": "object"})) is None
    first = sandbox.pid
    problem = sandbox.problem(lark_of({"type": "array", "minItems": 1_000_000_000}))
    assert problem == "compiling the grammar needs more than 512 MiB"
    assert sandbox.pid is None                                     # the child is gone; we are not
    assert sandbox.problem(lark_of({"type": "array", "items": {"type": "integer"}})) is None
    assert sandbox.pid not in (None, first)
    assert sandbox.counts["grammar_checker_restarts"] == 1


@pytest.mark.parametrize("schema, says", [
    ({"$ref": "#"}, "fails before its first token"),
    ({"type": "foo"}, "Invalid type: foo"),
    ({"type": "string", "pattern": "(("}, "unclosed group"),
])
def test_grammars_that_cannot_run_are_refused_with_the_reason(sandbox, schema, says):
    problem = sandbox.problem(lark_of(schema))
    assert problem is not None and says in problem
    assert "x-guidance" not in problem                  # the layout Forge adds is not echoed back


def test_a_grammar_failing_after_its_first_token_is_refused(sandbox):
    """Compiles and takes "{", then only refers to itself: the engines would fail at the second mask."""
    assert sandbox.problem('start: "{" a\na: b\nb: a') == "the grammar fails after 1 token: NoExtensionBias"
    assert sandbox.problem('start: "{" a "}"\na: "x" | "y" a') is None           # recursion that ends


def test_verdicts_are_kept_so_a_schema_is_compiled_once(sandbox):
    lark = lark_of({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert sandbox.known(lark) == (False, None)
    assert sandbox.problem(lark) is None
    assert sandbox.known(lark) == (True, None)
    assert sandbox.problem(lark) is None
    assert sandbox.counts["grammar_checks"] == 1 and sandbox.counts["grammar_check_hits"] >= 2


def test_a_child_that_does_not_answer_in_time_is_ended_and_replaced():
    checker = GrammarSandbox(SandboxSpec.of_checkpoint(TINY, timeout_s=0.5))
    try:
        checker.start()
        stopped = checker.pid
        os.kill(stopped, signal.SIGSTOP)                  # the child can no longer answer, however fast the machine
        lark = lark_of({"type": "string"})
        assert checker.problem(lark) == "the grammar took longer than 0.5 s to compile"
        assert checker.pid is None                        # ended
        assert checker.known(lark) == (False, None)       # a time-out depends on the load: not kept
        checker.start()
        assert checker.pid not in (None, stopped)
    finally:
        checker.close()


def test_a_check_on_an_event_loop_leaves_the_loop_free(sandbox):
    """While the child is stopped, a check is awaited and the loop still runs other work; it answers once the
    child runs again."""
    assert sandbox.problem(lark_of({"type": "object"})) is None
    pid = sandbox.pid

    async def scenario() -> tuple[list[int], str | None]:
        os.kill(pid, signal.SIGSTOP)
        check = asyncio.ensure_future(sandbox.check(lark_of({"type": "array"})))
        ticks = []
        for i in range(20):                                 # the loop keeps turning while the check waits
            await asyncio.sleep(0)
            ticks.append(i)
        assert not check.done()
        os.kill(pid, signal.SIGCONT)
        return ticks, await check

    ticks, verdict = asyncio.run(scenario())
    assert ticks == list(range(20)) and verdict is None


def test_a_checkpoint_without_a_tokenizer_has_no_sandbox(tmp_path):
    assert SandboxSpec.of_checkpoint(tmp_path) is None
