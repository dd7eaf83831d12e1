"""The command line's way to a running service: which one to use, and one request at a time.

``sandcell run``, ``session``, ``approvals`` and ``audit`` go through a service when one is
reachable (see "The CLI and the service" in docs/service.md):

* ``SANDCELL_URL`` set: that service, with the key in ``SANDCELL_API_KEY`` (both or neither). An
  explicit URL that does not answer is an error, never a quiet fall back to running here: the
  caller asked for that service's profiles, quotas and records.
* else, with ``SANDCELL_API_KEY`` set, the service's Unix socket in the sandcell home
  (``service.sock``) when something listens on it.
* else (or with ``--no-service``): in this process, as without a service.

Without a key the command runs in this process, even though the service would serve this user
keyless on its socket (the local owner): sending every keyless command there would refuse the
options only an in-process run has (``--start``, ``--input DIR``, ``--profile FILE``).

The requests are HTTP/1.1 written on the socket here (Unix or TCP, TLS for https): a command
line call makes one or a few requests, and an HTTP client library would cost more to import than
the request takes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.errors import ConfigError, InfraError

if TYPE_CHECKING:
    from typing import BinaryIO

__all__ = [
    "ENV_KEY",
    "ENV_URL",
    "SOCKET_NAME",
    "Remote",
    "Target",
    "add_service_option",
    "broke_off",
    "checked",
    "find_service",
    "read_response",
]

ENV_URL = "SANDCELL_URL"
ENV_KEY = "SANDCELL_API_KEY"
SOCKET_NAME = "service.sock"


def add_service_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-service",
        action="store_true",
        help=f"run in this process even when a service is reachable (${ENV_URL}, or the local "
        f"socket with ${ENV_KEY})",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A service to send requests to, and the key to send."""

    key: str
    socket: Path | None = None
    """The service's Unix socket; None: TCP to ``host:port``."""
    host: str = ""
    port: int = 0
    tls: bool = False
    prefix: str = ""
    """A path the service is mounted under (a proxy in front of it), without the final '/'."""

    @property
    def netloc(self) -> str:
        """``HOST:PORT`` as a URL (and the Host header) writes it."""
        if self.socket is not None:
            return "localhost"
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{shown}:{self.port}"

    @property
    def where(self) -> str:
        if self.socket is not None:
            return f"unix:{self.socket}"
        return f"{'https' if self.tls else 'http'}://{self.netloc}{self.prefix}"


def find_service(args: argparse.Namespace) -> Target | None:
    """The service this command should use, or None to run in this process.

    Raises:
        ConfigError: for ``SANDCELL_URL`` without a key, or a URL that is not one.
    """
    if getattr(args, "no_service", False):
        return None
    key = os.environ.get(ENV_KEY) or None
    url = os.environ.get(ENV_URL) or None
    if key is not None and not (key.isascii() and key.isprintable() and " " not in key):
        # It goes into a header line: a newline in it would be a header of its own.
        raise ConfigError(f"{ENV_KEY} is not an API key (it has spaces or control characters)")
    if url is not None:
        if key is None:
            raise ConfigError(
                f"{ENV_URL} is set ({url}) but {ENV_KEY} is not: set it to the tenant's API key "
                f"(sandcell tenants add), or unset {ENV_URL} to run here"
            )
        return _parse_url(url, key)
    if key is None:
        return None
    home = args.home or os.environ.get("SANDCELL_HOME")
    if not home:  # platformdirs is imported only when it has something to say
        from sandcell.home import data_dir

        home = data_dir()
    path = Path(home) / SOCKET_NAME
    return Target(key=key, socket=path) if _listening(path) else None


def _parse_url(url: str, key: str) -> Target:
    from urllib.parse import urlsplit

    if url.startswith("unix:"):
        return Target(key=key, socket=Path(url.removeprefix("unix:")))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{ENV_URL}={url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{ENV_URL}={url!r}: give http://HOST:PORT, https://HOST[:PORT] or unix:PATH"
        )
    tls = parts.scheme == "https"
    return Target(
        key=key,
        host=parts.hostname,
        port=port if port is not None else (443 if tls else 80),
        tls=tls,
        prefix=parts.path.rstrip("/"),
    )


def _listening(path: Path) -> bool:
    """Whether a service accepts connections on the Unix socket ``path`` (a socket left by a
    service that died is not one)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)  # a service so busy that it cannot accept is as good as none here
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")


def _quote(text: str) -> str:
    """Percent-encode a URL path or query part (every byte but the unreserved ones and '/')."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode())


@dataclass(slots=True)
class Remote:
    """Requests to one service; each on a connection of its own (a command makes few).

    HTTP/1.1 is spoken here directly over the socket, with ``Connection: close``: one request
    and its whole answer is all a command needs, and ``http.client`` (with ``email`` and
    ``ssl``) would cost more to import than a run through the service takes.
    """

    target: Target
    timeout_s: float | None = None
    """None: wait as long as the request takes (a synchronous run answers when it ends)."""

    def _connect(self) -> socket.socket:
        t = self.target
        if t.socket is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout_s)
                sock.connect(str(t.socket))
            except BaseException:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((t.host, t.port), timeout=self.timeout_s)
        if not t.tls:
            return sock
        import ssl

        try:
            return ssl.create_default_context().wrap_socket(sock, server_hostname=t.host)
        except BaseException:
            sock.close()
            raise

    def call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        raw: bytes | None = None,
        query: dict[str, str | int] | None = None,
        accept: tuple[int, ...] = (),
    ) -> Response:
        """One request; the answer when it is a success (2xx) or its status is in ``accept``.

        Raises:
            InfraError: when the service cannot be reached, or it failed (5xx:
                ``ServiceUnavailable``).
            QuotaExceeded: when a quota refused the request (429: retry later; exit 75).
            ServiceError: when it refused the request (4xx), with the service's reason.
            IsolationUnavailable: when the isolation the run needs is unavailable there
                (``ServiceIsolationUnavailable``).
        """
        url = self.target.prefix + _quote(path)
        if query:
            url += "?" + "&".join(f"{_quote(k)}={_quote(str(v))}" for k, v in query.items())
        payload = raw if raw is not None else b""
        kind = "application/octet-stream"
        if body is not None:
            payload = json.dumps(body, ensure_ascii=False).encode()
            kind = "application/json"
        host = self.target.netloc
        head = (
            f"{method} {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Authorization: Bearer {self.target.key}\r\nAccept: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n"
            + (f"Content-Type: {kind}\r\n" if payload or body is not None else "")
            + "\r\n"
        )
        try:
            sock = self._connect()
        except OSError as exc:
            raise InfraError(
                f"cannot reach the service at {self.target.where}: {exc}; start it (sandcell "
                f"serve), correct {ENV_URL}, or run here with --no-service"
            ) from None
        try:
            sock.sendall(head.encode("latin-1") + payload)
            with sock.makefile("rb") as reader:
                answer = read_response(reader)
        except (OSError, ValueError) as exc:
            raise broke_off(self.target, exc) from None
        finally:
            sock.close()
        return checked(answer, self.target, accept)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.call(method, path, **kwargs).json()


def broke_off(target: Target, exc: Exception) -> InfraError:
    """The error for an answer that ended early or was not HTTP."""
    return InfraError(
        f"the service at {target.where} broke off the answer ({exc}); its log says why"
    )


def checked(answer: Response, target: Target, accept: tuple[int, ...] = ()) -> Response:
    """``answer`` when it is a success (2xx) or its status is in ``accept``; else the error
    :meth:`Remote.call` documents."""
    if answer.status >= 400 and answer.status not in accept:
        raise _problem(answer, target)
    return answer


def read_response(reader: BinaryIO) -> Response:
    """One HTTP/1.1 response: status line, headers, then a body by Content-Length, chunks, or
    up to the end of the connection.

    Raises:
        ValueError: for anything that is not such a response.
    """
    line = reader.readline(65536)
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(65536)
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(reader.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            chunks.append(_exactly(reader, size))
            reader.readline(16)
        data = b"".join(chunks)
    elif "content-length" in headers:
        data = _exactly(reader, int(headers["content-length"]))
    else:
        data = reader.read()
    return Response(int(parts[1]), headers, data)


def _exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise ValueError(f"the answer ended after {len(data)} of {size} bytes")
    return data


def _problem(answer: Response, target: Target) -> Exception:
    """The error for a problem+json answer, carrying the service's sentence."""
    detail = ""
    fields: list[str] = []
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        detail = str(doc.get("detail") or doc.get("title") or "")
        for err in doc.get("errors") or []:
            if isinstance(err, dict):
                fields.append(f"{err.get('field')}: {err.get('message')}")
    if not detail:
        detail = answer.body[:200].decode("utf-8", "replace") or f"HTTP {answer.status}"
    if fields:
        detail += " (" + "; ".join(fields) + ")"
    # The client's classes, chosen as the client chooses them: a 429 exits 75 here as the
    # client's QuotaExceeded is retryable (sandcell.wire). Imported here, on the way out, since
    # the client package costs more to import than a command takes.
    from sandcell.client.errors import (
        QuotaExceeded,
        ServiceError,
        ServiceIsolationUnavailable,
        ServiceUnavailable,
        answer_class,
    )

    status = answer.status
    kind = answer_class(status, detail)
    if kind is ServiceIsolationUnavailable:
        return ServiceIsolationUnavailable(detail, status=status)
    if kind is ServiceUnavailable:
        where = "" if status == 503 else f"the service at {target.where} failed: "
        return ServiceUnavailable(where + detail, status=status)
    if kind is QuotaExceeded:
        after = answer.headers.get("retry-after")
        wait = f"; retry after {after} s" if after else ""
        return QuotaExceeded(
            f"over the tenant's quota at {target.where}: {detail}{wait}",
            detail=detail,
            retry_after_s=float(after) if after and after.isdigit() else None,
        )
    if status == 401:
        message = (
            f"the service at {target.where} refused the key in {ENV_KEY}: {detail}; set it to a "
            "tenant's key (sandcell tenants add), or run here with --no-service"
        )
        return ServiceError(message, status=status, detail=detail)
    return ServiceError(detail, status=status, detail=detail)
