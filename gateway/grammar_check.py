"""The gateway's check of a call's grammar before the call is routed: the grammar an actor would compile (a response
format's schema, a strict tool's call layout) must keep the bounds (``forge.sampling.bounds``) and compile against
the model's tokenizer in the grammar sandbox (``forge.structured.sandbox``), or the call is a 400 naming the field it
came in. No actor receives a grammar the gateway did not accept.

The sandbox's child starts with the first grammar, so a gateway whose agents send none runs no such process; a new
grammar is compiled there while the event loop goes on, one seen before is answered at once."""

from __future__ import annotations

import logging

from forge.gateway.errors import BadRequest, Unavailable
from forge.gateway.modelinfo import ModelInfo
from forge.structured.check import wire_grammar_problem
from forge.structured.sandbox import GrammarSandbox, SandboxSpec, SandboxUnavailable
from forge.v1 import common_pb2

log = logging.getLogger(__name__)


class GrammarCheck:
    def __init__(self, sandbox: GrammarSandbox) -> None:
        self.sandbox = sandbox

    @classmethod
    def of_model(cls, model: ModelInfo, memory_mb: int, timeout_s: float) -> GrammarCheck:
        """The check against ``model``'s tokenizer (its checkpoint's ``tokenizer.json``)."""
        spec = SandboxSpec.of_checkpoint(model.directory, memory_mb, timeout_s) if model.directory else None
        if spec is None:
            raise ValueError(f"the model {model.model_id!r} has no checkpoint directory with a tokenizer.json to "
                             "compile grammars with")
        return cls(GrammarSandbox(spec))

    async def check(self, sampling: common_pb2.SamplingParams, param: str) -> None:
        """BadRequest naming ``param`` unless ``sampling``'s grammar (if any) may be sent to an actor."""
        if not sampling.HasField("grammar"):
            return
        try:
            problem = await wire_grammar_problem(sampling.grammar, self.sandbox)
        except SandboxUnavailable as exc:
            log.error("structured output cannot be checked: %s", exc)
            raise Unavailable(f"structured output is unavailable: {exc}") from None
        if problem is not None:
            raise BadRequest(f"{param}: {problem}", param)

    def gauges(self) -> dict[str, float]:
        return self.sandbox.gauges()

    def close(self) -> None:
        self.sandbox.close()
