"""The dash's guards, as aiohttp middlewares: strict response headers (a Content-Security-Policy that allows only the
dash's own scripts and styles), the key check when the dash has a key, and every failure answered as a JSON error
with a 4xx status for what the request got wrong.

With a key, a browser signs in once through the login form (``POST /login``); it then holds a cookie derived from
the key (an HMAC, so the key itself is never stored in the browser), and programs send ``Authorization: Bearer KEY``
or ``X-Api-Key``. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from forge.pool import InvalidRequestError, NotFoundError
from forge.rpc.auth import matches_any

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin"}
COOKIE = "forge_dash"
OPEN_PATHS = ("/login", "/static/")        # the sign-in form and its assets need no key
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


def session_token(key: str) -> str:
    """The cookie a signed-in browser holds for ``key``."""
    return hmac.new(key.encode(), b"forge dash session", hashlib.sha256).hexdigest()


def presented_key(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("X-Api-Key")


def signed_in(request: web.Request, keys: tuple[str, ...]) -> bool:
    key = presented_key(request)
    if key and matches_any(key, keys):
        return True
    cookie = request.cookies.get(COOKIE)
    return bool(cookie) and matches_any(cookie, [session_token(k) for k in keys])


@web.middleware
async def headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = error(exc.status, exc.reason) if exc.status >= 400 else exc
    except NotFoundError as exc:          # an InvalidRequestError too: first
        response = error(404, str(exc))
    except InvalidRequestError as exc:
        response = error(400, str(exc))
    except Exception:
        log.exception("%s %s failed", request.method, request.path[:200])
        response = error(500, "internal error (see the dash's log)")
    response.headers.update(HEADERS)
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return response


def host_guard(bound_host: str) -> Callable:
    """On a loopback bind, refuse requests whose Host header names another host (DNS rebinding: a web page that
    renames its own host to 127.0.0.1 could otherwise read the dash)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_loopback(bound_host):
            name = (request.host or "").rsplit(":", 1)[0] if not (request.host or "").startswith("[") else \
                (request.host or "").split("]")[0] + "]"
            if not is_loopback(name):
                return error(403, "this dash answers on its loopback address only")
        return await handler(request)

    return guard


def key_guard(keys: tuple[str, ...]) -> Callable:
    """Every request but the sign-in form's needs the key (or the cookie of a signed-in browser)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not keys or request.path.startswith(OPEN_PATHS) or signed_in(request, keys):
            return await handler(request)
        if request.path.startswith("/api/"):
            return error(401, "missing or invalid key")
        raise web.HTTPFound("/login")

    return guard


def login_handler(keys: tuple[str, ...], form: Callable[[], web.StreamResponse]) -> Handler:
    """GET: the sign-in form; POST: check the key, set the cookie and go to the dash."""

    async def login(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return form()
        data = await request.post()
        key = data.get("key")
        if not keys or not isinstance(key, str) or not key or not matches_any(key, keys):
            log.warning("a sign-in with a wrong key from %s", request.remote)
            raise web.HTTPFound("/login?failed=1")
        response = web.HTTPFound("/")
        response.set_cookie(COOKIE, session_token(key), httponly=True, samesite="Strict", path="/")
        raise response

    return login
