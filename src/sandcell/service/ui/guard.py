"""What keeps the approval pages safe to open: response headers, the cookie, and the checks on
every form post (same origin, the session's CSRF token).

Everything on these pages came from untrusted code or was chosen by it (output, file names,
arguments of tool calls); the templates escape all of it, and the headers here are the second
wall should an escape ever be missed: no script runs at all (``script-src`` is not granted; the
pages have none), images and styles come only from the service itself, and no other site may
frame a page (clickjacking an Approve button).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.errors import SandcellError
from sandcell.service.ui.browser_sessions import BrowserSession

__all__ = [
    "COOKIE",
    "FILE_CSP",
    "PAGE_CSP",
    "UI_PATH",
    "FormRefused",
    "SecurityHeaders",
    "check_form",
    "clear_cookie",
    "read_form",
    "set_cookie",
]

COOKIE = "sandcell_ui"
UI_PATH = "/ui"
PAGE_CSP = (
    "default-src 'none'; img-src 'self'; style-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
FILE_CSP = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; sandbox"
"""For an artifact or figure opened on its own: an SVG written by the program is shown, but in a
sandbox (no script, an opaque origin), and nothing it links to loads."""
_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
MAX_FORM_BYTES = 64 * 1024


class FormRefused(SandcellError):
    """A form post that fails the origin or CSRF checks (answered 403)."""


class SecurityHeaders:
    """ASGI middleware: every ``/ui`` response gets the headers above, the page CSP unless it
    set its own, and ``Cache-Control: no-store`` unless it set its own (pages show a tenant's
    data; a shared cache must never keep them)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                names = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in _HEADERS if k not in names]
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", PAGE_CSP.encode()))
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _loopback(host: str) -> bool:
    """Whether a Host header (``127.0.0.1:8790``, ``[::1]:8790``, ``localhost``) is loopback."""
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _origin(request: Request) -> str:
    """This service's origin as the browser names it (scheme and Host)."""
    host = request.headers.get("host") or request.url.netloc
    return f"{request.url.scheme}://{host}".lower()


def set_cookie(response: Response, request: Request, session: BrowserSession) -> None:
    """The session's cookie: HttpOnly (no script reads it), SameSite=Strict (no other site's
    page sends it), scoped to ``/ui``; Secure unless the page is plain http on a loopback
    address (a browser drops a Secure cookie set over plain http; anywhere but loopback the
    service belongs behind TLS, so there a plain-http login fails instead of leaking)."""
    secure = not (request.url.scheme == "http" and _loopback(request.headers.get("host", "")))
    response.set_cookie(
        COOKIE,
        session.id,
        path=UI_PATH,
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def clear_cookie(response: Response, request: Request) -> None:
    secure = not (request.url.scheme == "http" and _loopback(request.headers.get("host", "")))
    response.delete_cookie(COOKIE, path=UI_PATH, httponly=True, samesite="strict", secure=secure)


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a urlencoded form post (the first value of each).

    Read from the raw body: the service's body guard hands every POST to the JSON API as JSON,
    whatever it was labelled, so the form's own content type is not relied on.
    """
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise FormRefused(f"the form is over {MAX_FORM_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise FormRefused("the form is not UTF-8") from None
    fields = parse_qs(text, keep_blank_values=True, max_num_fields=32)
    return {name: values[0] for name, values in fields.items() if values}


def check_form(request: Request, session: BrowserSession | None, form: Mapping[str, str]) -> None:
    """Refuse a post that did not come from this service's own page in this session.

    Two checks, either enough on its own against a cross-site post: the browser's ``Origin``
    (or, where a browser sent none, its ``Referer``) must be this service; the form's ``csrf``
    field must be the token of the session its cookie names. A post with neither header is
    refused: every browser that renders these pages sends one of them on a form post.
    """
    own = _origin(request)
    origin = request.headers.get("origin")
    if origin is not None:
        if origin.lower() != own:
            raise FormRefused(f"the form came from {origin!r}, not from this service ({own})")
    else:
        referer = request.headers.get("referer", "").lower()
        if not referer.startswith(own + "/"):
            raise FormRefused(
                "the form post carried neither Origin nor a Referer from this service"
            )
    if session is None:
        raise FormRefused("no session: load the page again (or log in) and resend the form")
    if not session.token_matches(form.get("csrf", "")):
        raise FormRefused("the form's token is not this session's: load the page again")
