"""A webhook POST: bounded by one total deadline, signed per Standard Webhooks.

**Bounded.** A socket timeout bounds each read, not the request: a receiver that answers one
byte every few seconds would hold the caller for as long as it likes. Here the whole POST —
connecting, the TLS handshake, sending the body, reading the status line and headers — has
one deadline: before every socket operation the socket's timeout is set to what is left of
it, so the POST ends (failed) at the deadline whatever the receiver does. (Resolving the
host name is the one step no timeout reaches: it is left to the system resolver.) The
answer's body is not read: only its status counts. Redirects are not followed (a 3xx is a
failed attempt: Standard Webhooks asks senders not to follow them).

**Signed** (https://www.standardwebhooks.com, symmetric scheme): with a secret
``whsec_<base64 of 24 to 64 random bytes>``, each POST carries

* ``webhook-id``: the notification's id, the same on every retry (a receiver's idempotency key);
* ``webhook-timestamp``: when this attempt was made, integer Unix seconds;
* ``webhook-signature``: ``v1,<base64 of HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``,

so a receiver verifies the origin and the freshness of a notification with any Standard
Webhooks library, without a secret in the URL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import http.client
import io
import socket
import ssl
import time
from typing import Any, Mapping
from urllib.parse import urlsplit

from .errors import ConfigError

SECRET_PREFIX = "whsec_"
# Standard Webhooks: a random secret of at least 24 bytes (192 bits), 512 bits at most.
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
SIGNATURE_VERSION = "v1"
USER_AGENT = "sql-agent-notifier/2"


class WebhookError(Exception):
    """A POST that did not end in a 2xx answer, with a one-line reason."""


def parse_secret(setting: str, raw: str | None) -> bytes | None:
    """The signing key of a ``whsec_<base64>`` secret, or None when unset. The value is never
    repeated in an error (it is a secret): only its length and what is wrong."""
    if raw is None or not raw.strip():
        return None
    value = raw.strip()
    shown = f"<secret of {len(value)} characters, not shown>"
    if value.startswith("@Microsoft.KeyVault("):
        raise ConfigError(setting, value[:200],
                          "a secret, not a Key Vault reference App Service could not resolve (give the function "
                          "app's identity the 'Key Vault Secrets User' role on the vault and check the SecretUri)")
    if not value.startswith(SECRET_PREFIX):
        raise ConfigError(setting, shown, f"a Standard Webhooks secret: '{SECRET_PREFIX}' then the base64 of "
                          f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} random bytes (e.g. "
                          "python -c \"import base64,os;print('whsec_'+base64.b64encode(os.urandom(32)).decode())\")")
    try:
        key = base64.b64decode(value[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(setting, shown, f"'{SECRET_PREFIX}' followed by standard base64 (A-Z, a-z, 0-9, +, /, "
                          "= padding)") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ConfigError(setting, shown, f"a key of {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes after "
                          f"'{SECRET_PREFIX}' (it decodes to {len(key)})")
    return key


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``."""
    signed = message_id.encode("utf-8") + b"." + str(int(timestamp)).encode("ascii") + b"." + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode('ascii')}"


def webhook_headers(message_id: str, timestamp: int, body: bytes, key: bytes | None) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt (no signature without a key)."""
    if "." in message_id or not message_id:
        raise ValueError(f"a webhook id may not be empty nor contain '.': {message_id!r}")
    headers = {"webhook-id": message_id, "webhook-timestamp": str(int(timestamp))}
    if key is not None:
        headers["webhook-signature"] = signature(key, message_id, timestamp, body)
    return headers


def post(url: str, body: bytes, headers: Mapping[str, str], deadline_seconds: float) -> int:
    """POST ``body`` to ``url`` and return the 2xx status; raise WebhookError otherwise, at the
    latest ``deadline_seconds`` after the call (plus the name resolution)."""
    deadline = time.monotonic() + deadline_seconds
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = _DeadlineConnection(host, parts.port or (443 if tls else 80), deadline=deadline, tls=tls)
    try:
        connection.request("POST", path, body=body, headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT, "Connection": "close", **headers})
        response = connection.getresponse()
        status, reason = response.status, response.reason
    except (TimeoutError, socket.timeout):
        raise WebhookError(f"no complete answer within {deadline_seconds:g} s (the POST's deadline)") from None
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= deadline:
            raise WebhookError(f"no complete answer within {deadline_seconds:g} s (the POST's deadline)") from None
        raise WebhookError(f"refused or broken: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    if not 200 <= status < 300:
        raise WebhookError(f"HTTP {status} {reason}".rstrip())
    return status


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the POST's deadline passed")
    return left


class DeadlineSocket:
    """A socket whose every operation waits at most what is left until the deadline (its
    timeout is set again before each one). http.client reads the answer through
    ``makefile("rb")``: the file made here reads through this object too."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def _arm(self) -> None:
        self._sock.settimeout(_remaining(self._deadline))

    def sendall(self, data: Any, *args: Any) -> None:
        self._arm()   # since Python 3.5 the timeout bounds the whole sendall
        self._sock.sendall(data, *args)

    def send(self, data: Any, *args: Any) -> int:
        self._arm()
        return self._sock.send(data, *args)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes, flags)

    def recv(self, size: int, flags: int = 0) -> bytes:
        self._arm()
        return self._sock.recv(size, flags)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"only 'rb' is supported, not {mode!r}")
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self) -> None:   # socket.SocketIO calls it when its file closes
        pass

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, *, deadline: float, tls: bool) -> None:
        super().__init__(host, port, timeout=max(0.001, deadline - time.monotonic()))
        self._deadline = deadline
        self._tls = tls

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=_remaining(self._deadline))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls:
                context = ssl.create_default_context()
                # The handshake, as one operation bounded by the time left (CPython's handshake
                # loop counts its waits against one deadline).
                sock.settimeout(_remaining(self._deadline))
                sock = context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = DeadlineSocket(sock, self._deadline)
