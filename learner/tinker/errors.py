"""The Tinker API's error shapes. A request refused at once answers an HTTP 4xx whose JSON body says why
(``{"error": ..., "category": "user"}``; the SDK raises it as ``BadRequestError``, ``NotFoundError``, ...). A request
accepted and then failed answers its future with ``RequestFailedResponse`` (``{"error", "category"}``), the SDK's
``RequestFailedError``: category ``user`` for what the client got wrong (``UserError``), ``server`` for the rest,
whose details stay in the server's log."""

from __future__ import annotations

import logging
from typing import Any

from forge.learner.tinker.types import NotFound, UserError

log = logging.getLogger(__name__)

USER = "user"
SERVER = "server"


class ApiError(Exception):
    """A request refused before any work: its HTTP status and one-line message."""

    def __init__(self, status: int, message: str, category: str = USER) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.category = category

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "category": self.category}


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def not_found(what: str) -> ApiError:
    """Absent, or another key's: the two are never told apart."""
    return ApiError(404, f"{what} not found")


def unauthorized() -> ApiError:
    return ApiError(401, "missing or unknown API key (send X-API-Key: tml-...)")


def as_api_error(exc: UserError) -> ApiError:
    """A ``UserError`` raised while checking a request, as the HTTP error it answers."""
    return ApiError(404 if isinstance(exc, NotFound) else 400, str(exc) or type(exc).__name__)


def failure(exc: BaseException, what: str) -> dict[str, Any]:
    """The future result of a request that failed with ``exc`` (``what`` names it in the log)."""
    if isinstance(exc, UserError):
        return {"error": str(exc) or type(exc).__name__, "category": USER}
    if isinstance(exc, ApiError):
        return {"error": exc.message, "category": exc.category}
    log.error("%s failed", what, exc_info=(type(exc), exc, exc.__traceback__))
    return {"error": f"{what} failed on the server ({type(exc).__name__}); see the server's log", "category": SERVER}
