"""What a gateway check says of an input: the message of the BadRequest it raises, or None, so that two ways of
checking the same input can be compared outright."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forge.gateway.errors import BadRequest


def refusal(check: Callable[..., Any], *args: Any) -> str | None:
    """The message of the BadRequest that ``check(*args)`` raises, or None."""
    try:
        check(*args)
    except BadRequest as exc:
        return exc.message
    return None
