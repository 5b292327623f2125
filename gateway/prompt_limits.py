"""How long a chat call's prompt may be, as a small value with no tokenizer in it: it travels to the process that
decodes large request bodies, so that a body far over the context is refused there, before the gateway renders or
tokenises anything."""

from __future__ import annotations

from dataclasses import dataclass

from forge.gateway.errors import BadRequest
from forge.gateway.messages import ChatCall, shown_chars


@dataclass(frozen=True)
class PromptLimits:
    context_length: int
    chars_per_token: int | None = None      # the most characters one token covers (None: no sound bound)

    @property
    def max_prompt_chars(self) -> int | None:
        """The longest prompt text (in characters) that may still fit the context with room for one new token."""
        if self.chars_per_token is None:
            return None
        return (self.context_length - 1) * self.chars_per_token

    def too_long(self, what: str, chars: int, at_least: str = "") -> BadRequest:
        per_token = self.chars_per_token
        return BadRequest(f"{what} has {at_least}{chars} characters; no token covers more than {per_token}, so it "
                          f"takes at least {-(-chars // per_token)} tokens and cannot fit the model's context of "
                          f"{self.context_length} tokens with room to generate", "messages",
                          "context_length_exceeded")

    def check_size(self, call: ChatCall) -> None:
        """Refuse, before any rendering, a call whose message text alone cannot fit the context."""
        limit = self.max_prompt_chars
        if limit is not None:
            chars = shown_chars(call)
            if chars > limit:
                raise self.too_long("the text of the messages", chars)
