"""What a request must be before the app reads it: addressed to a host this server answers for (the
Host header, against DNS rebinding), carrying the API key where one is set (every route but
`/health`), and for a POST a JSON body of at most `max_body_bytes` that is UTF-8. `Gate`, an ASGI
middleware, answers each refusal at once in OpenAI's error body; a body is read no further than its limit.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import os
from dataclasses import dataclass
from typing import Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdraft.api.protocol import error_body

log = logging.getLogger("specdraft.server")
DEFAULT_MAX_BODY_BYTES = 4 << 20  # an 8k-token prompt is ~32 KB of text or ~56 KB of token ids
API_KEY_ENV = "SPECDRAFT_API_KEY"
OPEN_PATH = "/health"  # the one route without a key: a load balancer's probe
PAGE_PATH = "/"  # the playground: a browser asks its user for the key (`Gate._key`)
LOCAL_NAMES = frozenset({"localhost"})
ANY_HOST = "*"


@dataclass(frozen=True)
class Access:
    """Who may call a server. api_key: what clients send as `Authorization: Bearer KEY` (None: no key);
    hosts: the host names a Host header may carry (None: any; an IP address always may, since a page
    that rebinds a name to this server sends that name); max_body_bytes: the largest body read."""

    api_key: str | None = None
    hosts: frozenset[str] | None = LOCAL_NAMES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("the API key must be a non-empty string")
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes!r}")


def access_for(host: str, api_key: str | None = None, allowed_hosts: Sequence[str] = (),
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Access:
    """The access of a server bound to `host` (`specdraft serve`): the API key given, else
    $SPECDRAFT_API_KEY where set; Host headers naming localhost, the bound host or one of
    `allowed_hosts` ("*": any). Warns where it listens beyond this machine without a key."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
    names = None if ANY_HOST in allowed_hosts else LOCAL_NAMES | {_name(host)} | {_name(h) for h in allowed_hosts}
    if key is None and not _loopback(host):
        log.warning("serving on %s without an API key: anyone who can reach it can use it "
                    "(set --api-key or %s)", host, API_KEY_ENV)
    return Access(key, names, max_body_bytes)


class Gate:
    """ASGI middleware: checks each HTTP request against an `Access` before `app` sees it."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._host(headers) or self._key(scope["path"], headers)
        if refusal is None and scope["method"] == "POST":
            refusal = self._json(headers) or self._declared_size(headers)
            if refusal is None:
                body, refusal = await self._body(receive)
                if body is None and refusal is None:  # the client went away while sending
                    return
                receive = _replay(body, receive)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _host(self, headers: Headers) -> JSONResponse | None:
        given = headers.get("host")
        if self.access.hosts is None or not given:
            return None
        name = _name(given)
        if name in self.access.hosts or _ip(name) is not None:
            return None
        return _refuse(421, f"this server does not answer for the host {name!r} (the Host header); start it with "
                            f"--allowed-hosts {name} to allow that name")

    def _key(self, path: str, headers: Headers) -> JSONResponse | None:
        """The API key as clients send it (`Authorization: Bearer KEY`), or as a browser does once it has
        asked for it (`Basic`, the key as the password, any user name): the playground page asks by
        `WWW-Authenticate: Basic`, and the browser sends what was typed with the page's own requests."""
        if self.access.api_key is None or path == OPEN_PATH:
            return None
        challenge = {"WWW-Authenticate": 'Basic realm="specdraft", charset="UTF-8"' if path == PAGE_PATH else "Bearer"}
        given = headers.get("authorization")
        if not given:
            return _refuse(401, "no API key given: send it in the header Authorization: Bearer YOUR_KEY",
                           headers=challenge)
        scheme, _, token = given.partition(" ")
        # Headers arrive as bytes (latin-1 here); the key compared as the client's UTF-8 bytes, in constant time.
        key = token.strip().encode("latin-1")
        if scheme.lower() == "basic":
            key = _basic_password(key)
        elif scheme.lower() != "bearer":
            key = b""
        if not hmac.compare_digest(key, self.access.api_key.encode("utf-8")):
            return _refuse(401, "incorrect API key provided", code="invalid_api_key", headers=challenge)
        return None

    @staticmethod
    def _json(headers: Headers) -> JSONResponse | None:
        """Only JSON: a form or text/plain, which a web page may send to any server without asking, is refused."""
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
            return None
        got = f"got {media!r}" if media else "no Content-Type was sent"
        return _refuse(415, f"the body must be JSON, sent with the header Content-Type: application/json ({got})")

    def _declared_size(self, headers: Headers) -> JSONResponse | None:
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.access.max_body_bytes:
            return self._too_large(f"{int(declared)} bytes")
        return None

    async def _body(self, receive: Receive) -> tuple[bytes | None, JSONResponse | None]:
        """The whole body, counted as it arrives (a chunked body declares no length), and a refusal
        where it runs past the limit or is not UTF-8; (None, None) where the client went away."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.access.max_body_bytes:
                return None, self._too_large(f"more than {self.access.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, _refuse(400, f"the body is not valid UTF-8: the byte 0x{body[exc.start]:02X} at offset {exc.start}")
        return body, None

    def _too_large(self, size: str) -> JSONResponse:
        return _refuse(413, f"the request body is {size}; this server reads at most {self.access.max_body_bytes} "
                            "bytes (--max-body-bytes)")


def _basic_password(credentials: bytes) -> bytes:
    """The password of `Basic` credentials (base64 of "user:password"); b"" where they are malformed."""
    try:
        return base64.b64decode(credentials, validate=True).partition(b":")[2]
    except binascii.Error:
        return b""


def _refuse(status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error", None, code), status, headers=headers)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body already read, then what the client sends next (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


def _name(host: str) -> str:
    """The host name of a Host header or bind address, without its port or brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    name = _name(host)
    address = _ip(name)
    return name in LOCAL_NAMES if address is None else address.is_loopback
