"""The check of a grammar off the wire before a process serving the network takes it: compiled as Lark, within the
bounds, then compiled in the grammar sandbox. A grammar the sandbox judged before is answered from its verdicts
first, so a schema an agent sends with every call costs a lookup, not a walk of its bounds."""

from __future__ import annotations

from forge.sampling.grammar import GrammarError
from forge.sampling.params import SamplingError
from forge.sampling.wire import grammar_of
from forge.structured.sandbox import GrammarSandbox
from forge.v1 import common_pb2


async def wire_grammar_problem(message: common_pb2.Grammar, sandbox: GrammarSandbox | None) -> str | None:
    """Why the grammar ``message`` may not be compiled here, or None; without a sandbox (a model without a
    tokenizer.json, which serves no structured output) only its form and bounds are checked. SandboxUnavailable
    when the sandbox cannot start."""
    try:
        grammar = grammar_of(message)
        lark = grammar.lark()
    except (GrammarError, SamplingError) as exc:
        return str(exc)
    if sandbox is not None:
        known, verdict = sandbox.known(lark)
        if known:
            return verdict
    problem = grammar.bounds_problem()
    if problem is not None or sandbox is None:
        return problem
    return await sandbox.check(lark)
