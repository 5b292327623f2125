"""The agent side's chat over an in-process engine (``forge model eval``): the entry-point floor is the one place
that may hold an actor backend and the agent side's evaluation together."""

from __future__ import annotations

import asyncio

from forge.actors.backend import Backend, GenerationRequest
from forge.rollout.llm import LocalChat
from forge.sampling.params import SamplingParams
from forge.tokenizer import Tokenizer


class EngineChat(LocalChat):
    """Straight to an in-process backend (e.g. a TorchEngine)."""

    def __init__(self, backend: Backend, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.backend = backend

    async def _generate(self, prompt: list[int], sampling: SamplingParams) -> tuple[list[int], str]:
        stream = self.backend.submit(GenerationRequest("", prompt, sampling))
        chunks = await asyncio.to_thread(list, stream)
        return [t for c in chunks for t in c.token_ids], str(chunks[-1].finish_reason or "stop")
