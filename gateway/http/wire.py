"""The wire formats the HTTP front end speaks for a model call (OpenAI's chat completions, OpenAI's Responses,
Anthropic's Messages) behind one interface, so that every format runs the same call (rendered, routed, recorded
token-in-token-out) and only its shapes differ: a request body checked into a ``ChatCall`` with its options; the
answer as one JSON object or as server-sent events; errors in the format's own shape. ``Conversations`` keeps what
a format needs of earlier answers (see ``forge.gateway.http.conversations``)."""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Any

from forge.gateway.calls import ChatDelta, ChatResult
from forge.gateway.errors import GatewayError
from forge.gateway.http.conversations import Conversations
from forge.gateway.messages import ChatCall
from forge.gateway.modelinfo import ModelInfo


@dataclass(frozen=True)
class Event:
    """One server-sent event: its JSON body (None: OpenAI's closing ``[DONE]``) and its name, for the formats that
    name their events."""

    data: Any
    name: str | None = None

    def encode(self) -> bytes:
        body = "[DONE]" if self.data is None else json.dumps(self.data, separators=(",", ":"))
        return (f"event: {self.name}\n" if self.name else "").encode() + f"data: {body}\n\n".encode()


@dataclass(frozen=True)
class Answering:
    """What an answer is written with: the model (its tokenizer) and the name responses give it."""

    model: ModelInfo
    model_name: str


def forge_json(result: ChatResult) -> dict:
    """Forge's own object in every format's answer: the session, the call's index and how its prompt was built."""
    return {"session_id": result.session_id, "call_index": result.call_index, "tito": result.tito}


class StreamWriter(abc.ABC):
    """The events of one streamed answer."""

    @abc.abstractmethod
    def first(self) -> list[Event]:
        """Sent before the first delta."""

    @abc.abstractmethod
    def deltas(self, delta: ChatDelta) -> list[Event]:
        """For new text of the running call."""

    @abc.abstractmethod
    def final(self, result: ChatResult) -> list[Event]:
        """Once the call is recorded: the rest of the answer and its end."""

    def failed(self, error: GatewayError) -> list[Event]:
        """The call failed after the stream began."""
        return [Event(error.to_json())]


class WireFormat(abc.ABC):
    """One API's request and response shapes."""

    name: str

    @abc.abstractmethod
    def parse(self, body: dict, vocab_size: int, context_length: int | None) -> tuple[ChatCall, Any]:
        """The call and the format's options of a request body (a pure function of its arguments: it may run in
        another process)."""

    def streams(self, options: Any) -> bool:
        """Whether the request asked for a stream (its options' ``stream``)."""
        return options.stream

    def samples(self, options: Any) -> int:
        """How many answers to its prompt the request asked for (each is a call of the session)."""
        return 1

    def complete(self, call: ChatCall, options: Any, conversations: Conversations, session_id: str | None
                 ) -> tuple[ChatCall, str | None]:
        """The call with what the request refers to filled in from earlier answers (e.g. a previous response),
        and the session it runs in."""
        return call, session_id

    @abc.abstractmethod
    def answer(self, result: ChatResult, answering: Answering, options: Any) -> dict:
        """The whole answer of a call that was not streamed."""

    def answer_samples(self, results: list[ChatResult], answering: Answering, options: Any) -> dict:
        """The whole answer of the calls of a request that asked for ``samples`` of them (one, unless the format
        takes more)."""
        return self.answer(results[0], answering, options)

    @abc.abstractmethod
    def writer(self, answering: Answering, options: Any) -> StreamWriter:
        """The writer of a streamed answer."""

    def sample_writers(self, answering: Answering, options: Any, count: int) -> list[StreamWriter]:
        """The writers of ``count`` streamed answers to one prompt, one each, into one stream."""
        return [self.writer(answering, options)]

    def closing(self, writers: list[StreamWriter], results: list[ChatResult], options: Any) -> list[Event]:
        """Sent once every streamed answer (written by ``writers``) has ended."""
        return []

    def remember(self, call: ChatCall, options: Any, result: ChatResult,  # noqa: B027 - most keep nothing
                 conversations: Conversations) -> None:
        """Keep what later requests may refer to, once the call is recorded."""

    def error(self, error: GatewayError) -> dict:
        """An error in this format's shape."""
        return error.to_json()
