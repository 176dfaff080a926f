"""The monitor behind the Azure Functions HTTP trigger: App Service Authentication's principal
headers, the allowed group, the base path /api/monitor."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping
from urllib.parse import urlsplit

from shared.engine.agent import default_agent
from shared.errors import ConfigError
from shared.web.actions import Actions, Caller, own_origin, session_from_cookies
from shared.web.app import (
    ALLOWED_METHODS,
    GROUP_SETTING,
    OPERATOR_GROUP_SETTING,
    Monitor,
    Response,
    is_action,
    monitor_settings,
)

PRINCIPAL_HEADER = "x-ms-client-principal"


PRINCIPAL_NAME_HEADER = "x-ms-client-principal-name"


@dataclass(frozen=True)
class Principal:
    name: str | None
    groups: frozenset[str]


def principal_from_headers(headers: Mapping[str, str]) -> Principal | None:
    """The signed-in user as App Service Authentication passes it (X-MS-CLIENT-PRINCIPAL: base64
    JSON of the token's claims). The platform strips these headers from incoming requests and
    sets them itself, so only it can set them; None when absent or unreadable."""
    lowered = {k.lower(): v for k, v in headers.items()}
    encoded = lowered.get(PRINCIPAL_HEADER)
    if not encoded:
        return None
    try:
        document = json.loads(base64.b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    claims = [c for c in document.get("claims") or [] if isinstance(c, dict)]
    groups = frozenset(str(c.get("val")) for c in claims if c.get("typ") == "groups")
    name = lowered.get(PRINCIPAL_NAME_HEADER) or next(
        (str(c.get("val")) for c in claims if c.get("typ") in ("name", "preferred_username", document.get("name_typ"))),
        None)
    return Principal(name=name, groups=groups)


AZURE_BASE_PATH = "/api/monitor"


# The form tokens' one-use record, for this process (shared/web/actions.py).
_ACTIONS = Actions(default_agent)


def handle_azure_request(method: str, url: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
    """The HTTP trigger's one call. App Service Authentication (infra/functionapp.bicep) signs
    the user in and admits only AGENT_MONITOR_ALLOWED_GROUP and AGENT_MONITOR_OPERATOR_GROUP;
    this checks the same groups again from the principal the platform passes (the operators may
    act, the readers only read), and refuses everyone while the readers' setting is empty."""

    split = urlsplit(url)
    path = split.path
    if path.startswith(AZURE_BASE_PATH):
        path = path[len(AZURE_BASE_PATH):]
    lowered = {k.lower(): v for k, v in headers.items()}
    accept = lowered.get("accept", "")

    @contextlib.contextmanager
    def thread_store() -> Iterator[Any]:
        agent = default_agent()
        try:
            yield agent.store()
        finally:
            agent.release()   # the host's thread keeps no connection between requests

    monitor = Monitor(thread_store, clock=lambda: default_agent().clock(), settings=monitor_settings,
                      base_path=AZURE_BASE_PATH, actions=_ACTIONS)
    posting = method.upper() == "POST" and is_action(path)
    if method.upper() not in ALLOWED_METHODS and not posting:
        return monitor.handle(method, path)
    try:
        settings = monitor_settings()
    except ConfigError as exc:
        return _refused(monitor, method, 500, f"the monitor's settings are invalid: {exc}")
    if settings.allowed_group is None:
        return _refused(monitor, method, 403, f"the monitor is closed: {GROUP_SETTING} names no Entra group (set it, "
                                              "and App Service Authentication, as docs/monitor.md says)")
    principal = principal_from_headers(headers)
    if principal is None:
        response = _refused(monitor, method, 401, "sign-in required (App Service Authentication with Entra ID)")
        response.headers["WWW-Authenticate"] = 'Bearer realm="monitor"'
        return response
    operator = settings.operator_group is not None and settings.operator_group in principal.groups
    if settings.allowed_group not in principal.groups and not operator:
        return _refused(monitor, method, 403, f"{principal.name or 'this user'} is not a member of the Entra groups "
                                              f"the monitor admits ({GROUP_SETTING}, {OPERATOR_GROUP_SETTING})")
    # The origin the browser addresses: App Service ends TLS in front of the app and says so.
    scheme = (last_hop(lowered.get("x-forwarded-proto")) or split.scheme or "https").lower()
    host = (lowered.get("host") or split.netloc).strip()
    secure = scheme == "https"
    forwarded_for = client_address(lowered.get("x-forwarded-for"))
    caller = Caller(name=principal.name or "signed-in user", operator=operator,
                    client=f"monitor at {host}" + (f" from {forwarded_for}" if forwarded_for else ""),
                    session=session_from_cookies(lowered.get("cookie"), secure), origin=lowered.get("origin"),
                    own_origin=own_origin(scheme, host), secure=secure,
                    # A job defined from the form runs as this name: the platform's own header only.
                    owner=(lowered.get(PRINCIPAL_NAME_HEADER) or "").strip() or None)
    return monitor.handle(method, path, split.query, accept, caller=caller, body=body,
                          content_type=lowered.get("content-type"))


# An address as the audit shows it: IPv4 or IPv6 (with a port, brackets), nothing else.
_ADDRESS = re.compile(r"[0-9A-Fa-f.:\[\]]{1,64}")


def last_hop(value: str | None) -> str:
    """The right-most entry of a comma list header (X-Forwarded-For, X-Forwarded-Proto): the one
    the last proxy, the platform's own front end, wrote. A client may send the header itself,
    with any entries it likes; every proxy on the way APPENDS to it (Azure App Service's front
    ends, Azure Front Door, Application Gateway: the address they see the request come from), so
    only the last entry is not the client's word."""
    entries = [entry.strip() for entry in (value or "").split(",")]
    return entries[-1] if entries else ""


def client_address(forwarded_for: str | None) -> str:
    """The client address the audit records (the monitor's "from"): the right-most entry of
    X-Forwarded-For (see :func:`last_hop`), never the first one, which the client writes. Behind
    a proxy of its own in front of App Service (Front Door, Application Gateway) this is that
    proxy's address, not the browser's: an address no client can forge, rather than one it can.
    An entry that is not an address (a header forged to carry text into the audit) is left out."""
    address = last_hop(forwarded_for)
    return address if _ADDRESS.fullmatch(address) else ""


def _refused(monitor: Monitor, method: str, status: int, message: str) -> Response:
    response = monitor.error_response(status, message, False, None, 0)
    if method.upper() == "HEAD":
        response.headers["Content-Length"] = str(len(response.body))
        response.body = b""
    return response
