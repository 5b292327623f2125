"""The dash's query strings to typed values: only the parameters an endpoint knows, each parsed strictly, and
anything else refused as a bad request (InvalidRequestError, answered 400)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from multidict import MultiMapping

from forge.pool import InvalidRequestError
from forge.pool.browse import MAX_PAGE, MAX_PAGE_SIZE, SessionFilter

MAX_TEXT = 256
FILTERS = ("domain", "status", "min_reward", "max_reward", "min_version", "max_version")
LIST_PARAMS = frozenset({"pool", "page", "page_size", *FILTERS})
SESSION_PARAMS = frozenset({"pool"})
RATIO_PARAMS = frozenset({"pool", "step"})
MAX_STEP = 2**63 - 1


def check_known(query: MultiMapping[str], known: frozenset[str]) -> None:
    unknown = sorted(set(query) - known)
    if unknown:
        raise InvalidRequestError(f"unknown parameter {unknown[0][:MAX_TEXT]!r} (known: {', '.join(sorted(known))})")
    for name in set(query):
        if len(query.getall(name)) > 1:
            raise InvalidRequestError(f"{name} is given more than once")


def text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if len(value) > MAX_TEXT:
        raise InvalidRequestError(f"{name} is longer than {MAX_TEXT} characters")
    return value


def integer(query: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    value = text(query, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise InvalidRequestError(f"{name} must be in [{low}, {high}], got {number}")
    return number


def real(query: Mapping[str, str], name: str) -> float | None:
    value = text(query, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InvalidRequestError(f"{name} must be a finite number, got {value!r}")
    return number


def session_filter(query: Mapping[str, str]) -> SessionFilter:
    versions = 2**63 - 1
    return SessionFilter(domain=text(query, "domain"), status=text(query, "status"),
                         min_reward=real(query, "min_reward"), max_reward=real(query, "max_reward"),
                         min_version=integer(query, "min_version", 0, versions),
                         max_version=integer(query, "max_version", 0, versions))


def page(query: Mapping[str, str]) -> tuple[int, int]:
    return (integer(query, "page", 1, MAX_PAGE) or 1, integer(query, "page_size", 1, MAX_PAGE_SIZE) or 50)
