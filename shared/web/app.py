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
from shared.engine.liveness import liveness
from shared.web.actions import ACTIONS, Actions, Caller, new_session, result_page, session_cookie
from shared.web.html import escape
from shared.web.pages import ActForms, Pages

log = logging.getLogger(__name__)


UTC = timezone.utc


STYLESHEET = Path(__file__).with_name("monitor.css")


ALLOWED_METHODS = ("GET", "HEAD")


SECURITY_HEADERS = {
    # No script may run, whatever a value from the database holds; styles and images only from
    # the app (the stylesheet) or inline data: URIs; forms post only to the app itself (an
    # operator's actions); no framing, no base tricks.
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                "form-action 'self'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer Chromium sends "Origin: null" on the
    # operators' own form POSTs, which the Origin check (shared/web/actions.py) must refuse.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


REFRESH_SETTING = "AGENT_MONITOR_REFRESH_SECONDS"


GROUP_SETTING = "AGENT_MONITOR_ALLOWED_GROUP"


OPERATOR_GROUP_SETTING = "AGENT_MONITOR_OPERATOR_GROUP"


@dataclass(frozen=True)
class MonitorSettings:
    refresh_seconds: int = 30
    allowed_group: str | None = None
    operator_group: str | None = None


def monitor_settings(environ: Mapping[str, str] | None = None) -> MonitorSettings:
    """The monitor's own settings. Read by the monitor alone, at each request: a bad value
    breaks its pages (naming the setting), never the scheduler or the executor."""
    env = os.environ if environ is None else environ
    raw = (env.get(REFRESH_SETTING) or "").strip()
    refresh = 30
    if raw:
        refresh = parse_int(REFRESH_SETTING, raw, 0, 86400)
    group = (env.get(GROUP_SETTING) or "").strip() or None
    operators = (env.get(OPERATOR_GROUP_SETTING) or "").strip() or None
    return MonitorSettings(refresh_seconds=refresh, allowed_group=group, operator_group=operators)


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
                 settings: Callable[[], MonitorSettings], base_path: str = "",
                 actions: Actions | None = None) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.base_path = base_path.rstrip("/")
        self.pages = Pages(self.base_path)
        # The operators' actions (shared/web/actions.py); None: nobody acts here.
        self.actions = actions
        # Single flight: a request that arrives while an identical one is being rendered waits for
        # that render and shares it (a burst of 64 browsers on the 1,000-job page cost 64 renders
        # of ~70 ms each under one GIL: p99 ~2.9 s). A request arriving after it renders anew, so
        # no page is ever older than the request that asked for it.
        self._flights: dict[tuple, "_Flight"] = {}
        self._flights_lock = threading.Lock()

    def handle(self, method: str, path: str, query: str = "", accept: str = "", user: str | None = None, *,
               caller: Caller | None = None, body: bytes = b"", content_type: str | None = None) -> Response:
        """``path``: below the base path ("/", "/jobs/nightly", ...). ``caller``: who asks (as the
        front end established it; by default a reader named ``user``); ``body`` and
        ``content_type``: a POSTed form."""
        method = method.upper()
        caller = caller or Caller(name=user)
        user = caller.name
        if method == "POST" and is_action(path):
            return self._post(path, caller, body, content_type)
        if method not in ALLOWED_METHODS:
            return self._handle(method, path, query, accept, user)
        session, cookie = caller.session, None
        if caller.operator and self.actions is not None and session is None:
            session = new_session()
            cookie = session_cookie(session, caller.secure, self.base_path)
        act = (ActForms(self.base_path, lambda action, target: self.actions.form_token(caller, session, action, target))
               if caller.operator and self.actions is not None else None)
        key = (path, query, accept, user, session if act is not None else None)
        with self._flights_lock:
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
        if leader:
            try:
                flight.response = self._handle("GET", path, query, accept, user, act)
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
        if cookie is not None:
            response.headers["Set-Cookie"] = cookie
        if method == "HEAD":
            response.headers["Content-Length"] = str(len(response.body))
            response.body = b""
        return response

    def _handle(self, method: str, path: str, query: str, accept: str, user: str | None,
                act: ActForms | None = None) -> Response:
        if method not in ALLOWED_METHODS:
            response = self.error_response(405, f"the monitor's pages are read-only: {method} is not allowed (GET or HEAD; "
                                                "an operator's actions are POSTed to actions/<name>)", False, None, 0)
            response.headers["Allow"] = ", ".join(ALLOWED_METHODS)
            return response
        params = {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}
        wants_json = False
        refresh = 0
        try:
            wants_json = _wants_json(params, accept)
            settings = self.settings()
            refresh = settings.refresh_seconds
            response = self._route(path or "/", params, wants_json, user, refresh, act)
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

    def _post(self, path: str, caller: Caller, body: bytes, content_type: str | None) -> Response:
        """An action POSTed from a page (shared/web/actions.py): its result, its confirmation
        step, or the refusal in words."""
        name = unquote(path.strip("/").split("/", 1)[1])
        wants_json = False
        try:
            if self.actions is None:
                raise PageError(403, "this monitor takes no actions")
            outcome = self.actions.handle(name, caller, caller.session, body, content_type)
        except PageError as exc:
            return self.error_response(exc.status, exc.message, wants_json, caller.name, 0)
        except Exception as exc:  # one line, never a traceback in a page
            if _is_database_error(exc):
                return self.error_response(503, f"the control database could not be reached: {type(exc).__name__}: "
                                                f"{classify(exc).message}", False, caller.name, 0)
            log.exception("monitor: action %s failed", name)
            return self.error_response(500, f"internal error ({type(exc).__name__}); the log has the details",
                                       False, caller.name, 0)
        session = caller.session or ""

        def hidden_form(fields: dict[str, str]) -> str:
            kind = ACTIONS[name]
            forms = ActForms(self.base_path, lambda action, target: self.actions.form_token(caller, session, action, target))
            extra = {k: v for k, v in fields.items() if k != kind.target}
            return forms.form(name, fields[kind.target], hidden=extra)

        if outcome.form is not None:     # the job form again: its errors, preview or result (jobform.py)
            from shared.web.jobform import render

            forms = ActForms(self.base_path, lambda action, target: self.actions.form_token(caller, session, action, target))
            pages = Pages(self.base_path, act=forms)
            return Response(outcome.status, pages.document(outcome.form.title, render(outcome.form, pages), "/", {},
                                                           caller.name, 0, None).encode(), "text/html; charset=utf-8")
        body_html = result_page(outcome, lambda p: self.pages.link(p), hidden_form)
        title = {"Done": "Done", "Confirm": "Confirm"}.get(outcome.title, "Refused")
        return Response(outcome.status, self.pages.document(title, body_html, "/", {}, caller.name, 0, None).encode(),
                        "text/html; charset=utf-8")

    def _route(self, path: str, params: dict[str, str], wants_json: bool, user: str | None, refresh: int,
               act: ActForms | None = None) -> Response:
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
        elif parts == ["define"]:
            page = "define"
            if act is None:
                raise PageError(403, "the job form is for the operators (AGENT_MONITOR_OPERATOR_GROUP in Azure; "
                                     "`sql-agent monitor --operator` locally); the jobs page shows every job")
            if wants_json:
                raise PageError(400, "the job form has no JSON twin: `jobs --json` (or /?format=json) lists the jobs, "
                                     "with where each is defined")
        else:
            raise PageError(404, f"no page at {path!r} (pages: jobs, jobs/<name>, runs/<id>, poison, stuck, audit, alerts); "
                                "operators also have define, the job form")
        with self.store() as store:
            alive = liveness(store, now)
            pages = Pages(self.base_path, act=act, alive=alive)
            if page == "jobs":
                data = views.jobs_view(store, now)
                title, body = "Jobs", pages.jobs_page(data)
            elif page == "job":
                window = params.get("window", views.DEFAULT_WINDOW)
                if window not in views.TIMELINE_WINDOWS:
                    raise PageError(400, f"window={window!r}: expected one of {', '.join(views.TIMELINE_WINDOWS)}")
                data = views.job_view(store, parts[1], now, window)
                if data is None:
                    raise PageError(404, f"no job named {parts[1]!r}")
                title, body = f"Job {parts[1]}", pages.job_page(data, now)
            elif page == "run":
                run_id = _int_param("run id", parts[1], 1, MAX_RUN_ID)
                data = views.run_view(store, run_id)
                if data is None:
                    raise PageError(404, f"no run with id {run_id}")
                title, body = f"Run {run_id}", pages.run_page(data)
            elif page == "poison":
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_POISON_LIMIT)), 1, 10000)
                data = views.poison_view(store, limit)
                title, body = "Poison messages", pages.poison_page(data)
            elif page == "audit":
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_AUDIT_LIMIT)), 1, 10000)
                job = params.get("job") or None
                since = _time_param("since", params["since"]) if params.get("since") else None
                data = views.audit_view(store, job, since, limit)
                title, body = "Audit trail", pages.audit_page(data, job, since, limit)
            elif page == "alerts":
                data = views.alerts_view(store)
                title, body = "Condition alerts", pages.alerts_page(data)
            elif page == "define":
                from shared.web.jobform import page_state, render

                state = page_state(store, params.get("job") or None)
                title, body, data = state.title, render(state, pages), None
            else:
                older = _int_param("older_than", params.get("older_than", str(views.DEFAULT_STUCK_AGE_SECONDS)), 1,
                                   MAX_STUCK_AGE_SECONDS)
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_STUCK_LIMIT)), 1, 10000)
                data = views.stuck_view(store, now, older, limit)
                title, body = "Stuck runs", pages.stuck_page(data, older, limit)
        # Every answer says whether the agent is late (shared/engine/liveness.py): the pages in a
        # banner at their top, the JSON twins (whose documents keep their shape) in this header.
        late = {"Agent-Liveness": _liveness_header(alive)}
        if wants_json:
            return Response(200, (views.to_json(data, compact=True) + "\n").encode(), "application/json; charset=utf-8",
                            late)
        # The job form never reloads itself: what an operator types there would be lost.
        # (Its JSON link is the jobs page's: the form has no twin.)
        shown = ("/", {}) if page == "define" else (path, params)
        return Response(200, pages.document(title, body, *shown, user, 0 if page == "define" else refresh,
                                            now).encode(),
                        "text/html; charset=utf-8", late)

    def error_response(self, status: int, message: str, wants_json: bool, user: str | None, refresh: int) -> Response:
        if wants_json:
            return Response(status, (json.dumps({"error": message}) + "\n").encode(), "application/json; charset=utf-8")
        body = f'<h1>{status}</h1>\n<p class="error">{escape(message)}</p>\n'
        return Response(status, self.pages.document(f"Error {status}", body, "/", {}, user, 0, None).encode(),
                        "text/html; charset=utf-8")




def is_action(path: str) -> bool:
    parts = path.strip("/").split("/")
    return len(parts) == 2 and parts[0] == "actions"


def _liveness_header(alive: dict[str, Any]) -> str:
    """``ok; last-tick=...`` or ``late; last-tick=...; since ...`` (ASCII: a header)."""
    at = alive["last_tick_at"].isoformat() if alive.get("last_tick_at") else "none"
    return f"{'late' if alive['late'] else 'ok'}; last-tick={at}; period-seconds={alive.get('period_seconds') or 0}"


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
