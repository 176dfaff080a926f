"""The Job Activity Monitor: read-only HTML pages (and their JSON twins) over the control
database, served by the function app's HTTP trigger (/api/monitor/...) and, locally, by
`monitor --port 8080` on 127.0.0.1.

Pages: the jobs (one row each, as SQL Server Agent's Job Activity Monitor shows them), a job (a
timeline of its runs drawn as SVG by the server, its history and its events), a run, the poison
messages, the stuck runs and the audit trail (who did what). Each has a JSON twin (``?format=json`` or ``Accept:
application/json``) holding exactly what the CLI's ``--json`` prints: both come from
shared/engine/views.py.

Safe by construction: only GET and HEAD are answered (anything else gets 405); the views run
only SELECTs; every value from the database is HTML-escaped where it is written; every response
carries a Content-Security-Policy that allows no script at all (the pages have none: a meta
refresh reloads them) and the stylesheet only from the app itself.

This module knows nothing of Azure or of http.server: ``Monitor.handle`` takes a method, a path,
the query string and the Accept header and returns a ``Response``; the trigger
(functions/monitor_trigger.py, through ``handle_azure_request``) and the local server
(``serve``) adapt it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping
from urllib.parse import parse_qs, unquote

from shared.control.sqlerrors import classify
from shared.engine import views
from shared.errors import AgentError, ConfigError, PageError
from shared.values import BIGINT_MAX, MAX_STUCK_AGE_SECONDS, parse_int
from shared.web.html import escape
from shared.web.pages import Pages

log = logging.getLogger(__name__)


UTC = timezone.utc


STYLESHEET = Path(__file__).with_name("monitor.css")


ALLOWED_METHODS = ("GET", "HEAD")


SECURITY_HEADERS = {
    # No script may run, whatever a value from the database holds; styles and images only from
    # the app (the stylesheet) or inline data: URIs; no form posts, no framing, no base tricks.
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                "form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


REFRESH_SETTING = "AGENT_MONITOR_REFRESH_SECONDS"


GROUP_SETTING = "AGENT_MONITOR_ALLOWED_GROUP"


@dataclass(frozen=True)
class MonitorSettings:
    refresh_seconds: int = 30
    allowed_group: str | None = None


def monitor_settings(environ: Mapping[str, str] | None = None) -> MonitorSettings:
    """The monitor's own settings. Read by the monitor alone, at each request: a bad value
    breaks its pages (naming the setting), never the scheduler or the executor."""
    env = os.environ if environ is None else environ
    raw = (env.get(REFRESH_SETTING) or "").strip()
    refresh = 30
    if raw:
        refresh = parse_int(REFRESH_SETTING, raw, 0, 86400)
    group = (env.get(GROUP_SETTING) or "").strip() or None
    return MonitorSettings(refresh_seconds=refresh, allowed_group=group)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)

    def all_headers(self) -> dict[str, str]:
        return {"Content-Type": self.content_type, **SECURITY_HEADERS, **self.headers}


class _Flight:
    """One render that identical requests arriving meanwhile share (Monitor.handle)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Response | None = None


class Monitor:
    """Routes a request to a view and renders it.

    ``store``: a context manager factory giving a Store for one request (the local server lends
    one from a pool; the trigger uses the thread's). ``base_path``: where the pages live
    ("/api/monitor" in Azure, "" locally); every link carries it."""

    def __init__(self, store: Callable[[], ContextManager[Any]], *, clock: Callable[[], datetime],
                 settings: Callable[[], MonitorSettings], base_path: str = "") -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.base_path = base_path.rstrip("/")
        self.pages = Pages(self.base_path)
        # Single flight: a request that arrives while an identical one is being rendered waits for
        # that render and shares it (a burst of 64 browsers on the 1,000-job page cost 64 renders
        # of ~70 ms each under one GIL: p99 ~2.9 s). A request arriving after it renders anew, so
        # no page is ever older than the request that asked for it.
        self._flights: dict[tuple, "_Flight"] = {}
        self._flights_lock = threading.Lock()

    def handle(self, method: str, path: str, query: str = "", accept: str = "", user: str | None = None) -> Response:
        """``path``: below the base path ("/", "/jobs/nightly", ...)."""
        method = method.upper()
        if method not in ALLOWED_METHODS:
            return self._handle(method, path, query, accept, user)
        key = (path, query, accept, user)
        with self._flights_lock:
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
        if leader:
            try:
                flight.response = self._handle("GET", path, query, accept, user)
            finally:
                with self._flights_lock:
                    self._flights.pop(key, None)
                flight.done.set()
        else:
            flight.done.wait()
        rendered = flight.response
        if rendered is None:   # the leader's render raised (it logged why)
            rendered = self.error_response(500, "internal error; the log has the details", False, user, 0)
        response = Response(rendered.status, rendered.body, rendered.content_type, dict(rendered.headers))
        if method == "HEAD":
            response.headers["Content-Length"] = str(len(response.body))
            response.body = b""
        return response

    def _handle(self, method: str, path: str, query: str, accept: str, user: str | None) -> Response:
        if method not in ALLOWED_METHODS:
            response = self.error_response(405, f"the monitor is read-only: {method} is not allowed (GET or HEAD)", False, None, 0)
            response.headers["Allow"] = ", ".join(ALLOWED_METHODS)
            return response
        params = {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}
        wants_json = False
        refresh = 0
        try:
            wants_json = _wants_json(params, accept)
            settings = self.settings()
            refresh = settings.refresh_seconds
            response = self._route(path or "/", params, wants_json, user, refresh)
        except PageError as exc:
            response = self.error_response(exc.status, exc.message, wants_json, user, refresh)
        except ConfigError as exc:
            response = self.error_response(500, f"the monitor's settings are invalid: {exc}", wants_json, user, 0)
        except Exception as exc:  # one line, never a traceback in a page
            if _is_database_error(exc):
                message = f"the control database could not be read: {type(exc).__name__}: {classify(exc).message}"
                response = self.error_response(503, message, wants_json, user, refresh)
            else:
                log.exception("monitor: %s %s failed", method, path)
                response = self.error_response(500, f"internal error ({type(exc).__name__}); the log has the details",
                                               wants_json, user, refresh)
        return response

    # ------------------------------------------------------------ routing

    def _route(self, path: str, params: dict[str, str], wants_json: bool, user: str | None, refresh: int) -> Response:
        parts = [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []
        if parts == ["monitor.css"]:
            return Response(200, STYLESHEET.read_bytes(), "text/css; charset=utf-8")
        now = self.clock()
        if not parts or parts == ["jobs"]:
            page = "jobs"
        elif len(parts) == 2 and parts[0] == "jobs":
            page = "job"
        elif len(parts) == 2 and parts[0] == "runs":
            page = "run"
        elif parts == ["poison"]:
            page = "poison"
        elif parts == ["stuck"]:
            page = "stuck"
        elif parts == ["audit"]:
            page = "audit"
        elif parts == ["alerts"]:
            page = "alerts"
        else:
            raise PageError(404, f"no page at {path!r} (pages: jobs, jobs/<name>, runs/<id>, poison, stuck, audit, alerts)")
        with self.store() as store:
            if page == "jobs":
                data = views.jobs_view(store, now)
                title, body = "Jobs", self.pages.jobs_page(data)
            elif page == "job":
                window = params.get("window", views.DEFAULT_WINDOW)
                if window not in views.TIMELINE_WINDOWS:
                    raise PageError(400, f"window={window!r}: expected one of {', '.join(views.TIMELINE_WINDOWS)}")
                data = views.job_view(store, parts[1], now, window)
                if data is None:
                    raise PageError(404, f"no job named {parts[1]!r}")
                title, body = f"Job {parts[1]}", self.pages.job_page(data, now)
            elif page == "run":
                run_id = _int_param("run id", parts[1], 1, MAX_RUN_ID)
                data = views.run_view(store, run_id)
                if data is None:
                    raise PageError(404, f"no run with id {run_id}")
                title, body = f"Run {run_id}", self.pages.run_page(data)
            elif page == "poison":
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_POISON_LIMIT)), 1, 10000)
                data = views.poison_view(store, limit)
                title, body = "Poison messages", self.pages.poison_page(data)
            elif page == "audit":
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_AUDIT_LIMIT)), 1, 10000)
                job = params.get("job") or None
                since = _time_param("since", params["since"]) if params.get("since") else None
                data = views.audit_view(store, job, since, limit)
                title, body = "Audit trail", self.pages.audit_page(data, job, since, limit)
            elif page == "alerts":
                data = views.alerts_view(store)
                title, body = "Condition alerts", self.pages.alerts_page(data)
            else:
                older = _int_param("older_than", params.get("older_than", str(views.DEFAULT_STUCK_AGE_SECONDS)), 1,
                                   MAX_STUCK_AGE_SECONDS)
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_STUCK_LIMIT)), 1, 10000)
                data = views.stuck_view(store, now, older, limit)
                title, body = "Stuck runs", self.pages.stuck_page(data, older, limit)
        if wants_json:
            return Response(200, (views.to_json(data, compact=True) + "\n").encode(), "application/json; charset=utf-8")
        return Response(200, self.pages.document(title, body, path, params, user, refresh, now).encode(),
                        "text/html; charset=utf-8")

    def error_response(self, status: int, message: str, wants_json: bool, user: str | None, refresh: int) -> Response:
        if wants_json:
            return Response(status, (json.dumps({"error": message}) + "\n").encode(), "application/json; charset=utf-8")
        body = f'<h1>{status}</h1>\n<p class="error">{escape(message)}</p>\n'
        return Response(status, self.pages.document(f"Error {status}", body, "/", {}, user, 0, None).encode(),
                        "text/html; charset=utf-8")




def _is_database_error(exc: BaseException) -> bool:
    """What the driver or the store raised (unreachable server, missing schema, ...), as opposed
    to a bug of the monitor's own."""


    pyodbc = sys.modules.get("pyodbc")
    return isinstance(exc, (sqlite3.Error, AgentError)) or (pyodbc is not None and isinstance(exc, pyodbc.Error))


def _wants_json(params: dict[str, str], accept: str) -> bool:
    wanted = params.get("format")
    if wanted is not None:
        if wanted not in ("json", "html"):
            raise PageError(400, f"format={wanted!r}: expected json or html")
        return wanted == "json"
    accept = (accept or "").lower()
    return "application/json" in accept and "text/html" not in accept


# Run ids are bigint; a larger number names no run (404), it is never sent to the database.
MAX_RUN_ID = BIGINT_MAX


def _time_param(name: str, raw: str) -> datetime:
    """An ISO-8601 time from the query string (UTC when it has no offset)."""
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):
        raise PageError(400, f"{name}={raw!r}: expected an ISO-8601 date and time (e.g. 2026-01-31T02:00:00Z)") from None


def _int_param(name: str, raw: str, low: int, high: int | None = None) -> int:
    try:
        # Digits only (int() also takes '+', '_' and spaces) and no more than a bigint's 19.
        value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 19 else None
    except (TypeError, ValueError, AttributeError):
        value = None
    if value is None or value < low or (high is not None and value > high):
        expected = f"a whole number from {low} to {high}" if high is not None else f"a whole number, {low} or more"
        raise PageError(400 if name != "run id" else 404, f"{name}={raw!r}: expected {expected}")
    return value
