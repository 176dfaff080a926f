"""The Job Activity Monitor: read-only HTML pages (and their JSON twins) over the control
database, served by the function app's HTTP trigger (/api/monitor/...) and, locally, by
`monitor --port 8080` on 127.0.0.1.

Pages: the jobs (one row each, as SQL Server Agent's Job Activity Monitor shows them), a job (a
timeline of its runs drawn as SVG by the server, its history and its events), a run, the poison
messages and the stuck runs. Each has a JSON twin (``?format=json`` or ``Accept:
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

import base64
import binascii
import contextlib
import html
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Mapping
from urllib.parse import parse_qs, quote, unquote, urlsplit

from shared.engine import views
from shared.engine.agent import default_agent
from shared.errors import AgentError, ConfigError, PageError
from shared.jobs.run_model import RunStatus

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
# Outcome colours of the timeline bars (fill attributes, not styles: the CSP forbids inline styles).
OUTCOME_COLOURS = {
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "poisoned": "#6a1b9a",
    "running": "#1565c0",
    "queued": "#f9a825",
    "pending": "#f9a825",
    "skipped": "#9e9e9e",
    "cancelled": "#616161",
}
REFRESH_SETTING = "AGENT_MONITOR_REFRESH_SECONDS"
GROUP_SETTING = "AGENT_MONITOR_ALLOWED_GROUP"
PRINCIPAL_HEADER = "x-ms-client-principal"
PRINCIPAL_NAME_HEADER = "x-ms-client-principal-name"


# ---------------------------------------------------------------- settings


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
        from shared.values import parse_int

        refresh = parse_int(REFRESH_SETTING, raw, 0, 86400)
    group = (env.get(GROUP_SETTING) or "").strip() or None
    return MonitorSettings(refresh_seconds=refresh, allowed_group=group)


# ---------------------------------------------------------------- responses


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


def _e(value: Any) -> str:
    """Every value written into a page goes through here (or through _t for times)."""
    return html.escape("" if value is None else str(value), quote=True)


def _t(value: Any) -> str:
    if isinstance(value, datetime):
        if value.utcoffset():          # the store gives UTC already; anything else is converted
            value = value.astimezone(UTC)
        return value.isoformat(" ", "seconds")[:19]
    return "-" if value is None else _e(value)


# ---------------------------------------------------------------- the monitor


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
                from shared.control.sqlerrors import classify

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
        else:
            raise PageError(404, f"no page at {path!r} (pages: jobs, jobs/<name>, runs/<id>, poison, stuck)")
        with self.store() as store:
            if page == "jobs":
                data = views.jobs_view(store, now)
                title, body = "Jobs", self._jobs_page(data)
            elif page == "job":
                window = params.get("window", views.DEFAULT_WINDOW)
                if window not in views.TIMELINE_WINDOWS:
                    raise PageError(400, f"window={window!r}: expected one of {', '.join(views.TIMELINE_WINDOWS)}")
                data = views.job_view(store, parts[1], now, window)
                if data is None:
                    raise PageError(404, f"no job named {parts[1]!r}")
                title, body = f"Job {parts[1]}", self._job_page(data, now)
            elif page == "run":
                run_id = _int_param("run id", parts[1], 1, MAX_RUN_ID)
                data = views.run_view(store, run_id)
                if data is None:
                    raise PageError(404, f"no run with id {run_id}")
                title, body = f"Run {run_id}", self._run_page(data)
            elif page == "poison":
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_POISON_LIMIT)), 1, 10000)
                data = views.poison_view(store, limit)
                title, body = "Poison messages", self._poison_page(data)
            else:
                older = _int_param("older_than", params.get("older_than", str(views.DEFAULT_STUCK_AGE_SECONDS)), 1,
                                   MAX_STUCK_AGE_SECONDS)
                limit = _int_param("limit", params.get("limit", str(views.DEFAULT_STUCK_LIMIT)), 1, 10000)
                data = views.stuck_view(store, now, older, limit)
                title, body = "Stuck runs", self._stuck_page(data, older, limit)
        if wants_json:
            return Response(200, (views.to_json(data, compact=True) + "\n").encode(), "application/json; charset=utf-8")
        return Response(200, self._document(title, body, path, params, user, refresh, now).encode(),
                        "text/html; charset=utf-8")

    def error_response(self, status: int, message: str, wants_json: bool, user: str | None, refresh: int) -> Response:
        if wants_json:
            return Response(status, (json.dumps({"error": message}) + "\n").encode(), "application/json; charset=utf-8")
        body = f'<h1>{status}</h1>\n<p class="error">{_e(message)}</p>\n'
        return Response(status, self._document(f"Error {status}", body, "/", {}, user, 0, None).encode(),
                        "text/html; charset=utf-8")

    # ------------------------------------------------------------ links

    def link(self, path: str, **params: str) -> str:
        query = "&".join(f"{quote(k)}={quote(str(v), safe='')}" for k, v in params.items())
        return _e(f"{self.base_path}{path}" + (f"?{query}" if query else ""))

    def job_link(self, name: Any) -> str:
        return f'<a href="{self.link("/jobs/" + quote(str(name), safe=""))}">{_e(name)}</a>'

    def run_link(self, run_id: Any) -> str:
        if run_id is None:
            return "-"
        return f'<a href="{self.link(f"/runs/{int(run_id)}")}">{_e(run_id)}</a>'

    # ------------------------------------------------------------ the page around

    def _document(self, title: str, body: str, path: str, params: dict[str, str], user: str | None,
                  refresh: int, now: datetime | None) -> str:
        meta = f'<meta http-equiv="refresh" content="{int(refresh)}">\n' if refresh > 0 else ""
        who = f'<span class="user">Signed in as {_e(user)}</span>' if user else '<span class="user">local</span>'
        twin = {**params, "format": "json"}
        asof = f'<span class="asof">as of {_t(now)} UTC</span>' if now else ""
        refreshing = f" · refreshes every {int(refresh)} s" if refresh > 0 else ""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_e(title)} · SQL Agent monitor</title>\n{meta}"
            f'<link rel="stylesheet" href="{self.link("/monitor.css")}">\n</head>\n<body>\n'
            f'<header><nav><a href="{self.link("/")}">Jobs</a> <a href="{self.link("/poison")}">Poison</a> '
            f'<a href="{self.link("/stuck")}">Stuck</a></nav> {who} {asof}</header>\n'
            f"<main>\n{body}</main>\n"
            f'<footer><a href="{self.link(path if path.startswith("/") else "/" + path, **twin)}">JSON</a>{refreshing}'
            "</footer>\n</body>\n</html>\n")

    # ------------------------------------------------------------ pages

    def _jobs_page(self, rows: list[dict[str, Any]]) -> str:
        lines = ["<h1>Jobs</h1>"]
        if not rows:
            lines.append("<p>No jobs yet: the agent records the jobs of its settings at its next tick.</p>")
            return "\n".join(lines) + "\n"
        lines.append('<table class="jobs">\n<thead><tr><th>Job</th><th>Defined in</th><th>State</th><th>Schedule</th>'
                     "<th>Time zone</th><th>Status now</th><th>Last outcome</th><th>Next slot</th></tr></thead>\n<tbody>")
        for row in rows:
            state = f'<span class="state-{_e(row["state"])}">{_e(row["state"])}</span>' + _pause_text(row)
            if row["config_error"]:
                state += f'<div class="error">{_e(row["config_error"])}</div>'
            last = "-"
            if row["last_run_id"]:
                last = (f'<span class="outcome-{_e(row["last_status"])}">{_e(row["last_status"])}</span> '
                        f'{self.run_link(row["last_run_id"])} {_t(row["last_finished_at"])}{_last_targets(row)}')
            lines.append(
                f'<tr class="job" id="job-{_e(row["job_name"])}"><td>{self.job_link(row["job_name"])}</td>'
                f'<td>{_e(row["source"])}</td><td>{state}</td>'
                f'<td>{_e(row["schedule_words"])}<div><code>{_e(row["schedule"])}</code></div>{_after(self, row)}</td>'
                f'<td>{_e(row["timezone"])}</td><td class="status">{status_text(row)}</td><td>{last}</td>'
                f"<td>{_next_slot(row)}</td></tr>")
        lines.append("</tbody></table>")
        return "\n".join(lines) + "\n"

    def _job_page(self, data: dict[str, Any], now: datetime) -> str:
        job = data["job"]
        name = job["job_name"]
        state = (_e(job["state"]) + _pause_text(job)
                 + (f'<div class="error">{_e(job["config_error"])}</div>' if job["config_error"] else ""))
        facts = [
            ("Defined in", _e(job["source"])), ("State", state),
            ("Schedule", f'{_e(job["schedule_words"])} <code>{_e(job["schedule"])}</code>{_after(self, job)}'),
            ("Time zone", _e(job["timezone"])), ("Status now", status_text(job)),
            ("Last outcome", f'{_e(job["last_status"] or "-")} {self.run_link(job["last_run_id"])} '
                             f'{_t(job["last_finished_at"]) if job["last_run_id"] else ""}{_last_targets(job)}'),
            ("Next slot", _next_slot(job)), ("Overlap / misfire", f'{_e(job["overlap"])} / {_e(job["misfire"])}'),
            ("Max attempts", _e(job["max_attempts"])),
        ]
        out = [f"<h1>Job {_e(name)}</h1>", '<dl class="facts">']
        out += [f"<dt>{label}</dt><dd>{value}</dd>" for label, value in facts]
        out.append("</dl>")
        windows = " ".join(
            f'<strong>{_e(w)}</strong>' if w == data["window"]
            else f'<a href="{self.link("/jobs/" + quote(str(name), safe=""), window=w)}">{_e(w)}</a>'
            for w in views.TIMELINE_WINDOWS)
        out.append(f'<h2>Runs over the last {_e(data["window"])}</h2>\n<p class="windows">Window: {windows}</p>')
        out.append(self._timeline(data, now))
        out.append("<h2>History</h2>")
        out.append(self._table("history", _history_columns(data["runs"]), data["runs"]) if data["runs"]
                   else "<p>No runs yet.</p>")
        out.append("<h2>Job events</h2>")
        out.append(self._table("events", EVENT_COLUMNS, data["job_events"]) if data["job_events"]
                   else "<p>No job events.</p>")
        return "\n".join(out) + "\n"

    def _timeline(self, data: dict[str, Any], now: datetime) -> str:
        """One bar per run: x from its start to its end (or now while it runs), colour by status,
        a <title> the browser shows on hover, a link to the run."""
        width, left, top, height = 1000, 10, 8, 34
        start, end = data["window_start"], data["window_end"]
        span = (end - start).total_seconds() or 1.0

        def x(moment: datetime) -> float:
            seconds = (min(max(moment, start), end) - start).total_seconds()
            return left + seconds / span * (width - 2 * left)

        parts = [f'<svg class="timeline" role="img" aria-label="runs of the window" viewBox="0 0 {width} 70" '
                 f'width="{width}" height="70" xmlns="http://www.w3.org/2000/svg">',
                 f'<rect class="lane" x="{left}" y="{top}" width="{width - 2 * left}" height="{height}" fill="#f5f5f5"/>']
        tick = timedelta(hours=3) if data["window"] == "24h" else timedelta(days=1)
        mark = start.replace(minute=0, second=0, microsecond=0)
        while mark <= end:
            if mark >= start:
                label = mark.strftime("%H:%M") if data["window"] == "24h" else mark.strftime("%a %d")
                parts.append(f'<line x1="{x(mark):.1f}" y1="{top}" x2="{x(mark):.1f}" y2="{top + height + 4}" stroke="#bdbdbd"/>'
                             f'<text x="{x(mark):.1f}" y="{top + height + 18}" font-size="11" text-anchor="middle" '
                             f'fill="#424242">{_e(label)}</text>')
            mark += tick
        for run in reversed(data["timeline"]["runs"]):
            begin = run["started_at"] or run["scheduled_for"]
            finish = run["finished_at"] or (now if run["status"] == RunStatus.RUNNING else begin)
            x0 = x(begin)
            bar = max(x(finish) - x0, 2.0)
            title = (f'run {run["run_id"]} · {run["status"]} · slot {_t(run["scheduled_for"])} UTC · '
                     f'attempts {run["attempt"]}/{run["max_attempts"]}')
            if run["finished_at"] and run["started_at"]:
                title += f' · {_duration(run["finished_at"] - run["started_at"])}'
            if run["last_error"] or run["note"]:
                title += f' · {run["last_error"] or run["note"]}'
            colour = OUTCOME_COLOURS.get(run["status"], "#000000")
            href = self.link("/runs/%d" % int(run["run_id"]))
            parts.append(f'<a href="{href}">'
                         f'<rect class="bar bar-{_e(run["status"])}" data-run="{int(run["run_id"])}" x="{x0:.1f}" '
                         f'y="{top}" width="{bar:.1f}" height="{height}" fill="{colour}">'
                         f"<title>{_e(title)}</title></rect></a>")
        parts.append("</svg>")
        shown = len(data["timeline"]["runs"])
        note = f'<p class="timeline-note">{shown} run(s) in the window.</p>'
        if data["timeline"]["cut"]:
            note = (f'<p class="timeline-note cut">The window holds more than {data["timeline"]["limit"]:,} runs: '
                    f'the latest {data["timeline"]["limit"]:,} are drawn.</p>')
        legend = " ".join(f'<span class="legend"><svg width="10" height="10" viewBox="0 0 10 10">'
                          f'<rect width="10" height="10" fill="{colour}"/></svg> {_e(status)}</span>'
                          for status, colour in OUTCOME_COLOURS.items() if status != RunStatus.PENDING)
        return "\n".join(parts) + f"\n{note}\n<p class=\"legend\">{legend}</p>"

    def _run_page(self, data: dict[str, Any]) -> str:
        run = data["run"]
        out = [f'<h1>Run {_e(run["run_id"])}</h1>', '<dl class="facts">']
        facts = {**run, "parent": data.get("parent"), "target_statuses": data.get("target_statuses") or {}}
        for label, render in RUN_FIELDS:
            out.append(f"<dt>{_e(label)}</dt><dd>{render(self, facts)}</dd>")
        out.append("</dl>")
        if run.get("targets_total") is not None:
            out.append(f'<h2>Targets</h2>\n<p class="fleet">{_fleet_summary(run, data.get("target_statuses") or {})}</p>')
            out.append(self._table("targets", TARGET_COLUMNS, _grouped(data["targets"])) if data["targets"]
                       else "<p>No executions (the run's targets were gone).</p>")
        for key, title, columns in RUN_SECTIONS:
            out.append(f"<h2>{_e(title)}</h2>")
            out.append(self._table(key, columns, data[key]) if data[key] else f"<p>No {_e(title.lower())}.</p>")
        return "\n".join(out) + "\n"

    def _poison_page(self, rows: list[dict[str, Any]]) -> str:
        out = ["<h1>Poison messages</h1>",
               "<p>Messages taken out of circulation, newest first; "
               "<code>sql-agent poison requeue ID</code> gives the run one more attempt.</p>"]
        out.append(self._table("poison", POISON_COLUMNS, rows) if rows else "<p>No poison messages.</p>")
        return "\n".join(out) + "\n"

    def _stuck_page(self, rows: list[dict[str, Any]], older_than: int, limit: int) -> str:
        out = ["<h1>Stuck runs</h1>",
               f"<p>Runs in flight past their lease, and runs runnable for more than {older_than} s "
               f"that have not started (at most {limit}).</p>"]
        out.append(self._table("stuck", STUCK_COLUMNS, rows) if rows else "<p>No stuck runs.</p>")
        return "\n".join(out) + "\n"

    def _table(self, name: str, columns: list[tuple[str, Callable[["Monitor", dict[str, Any]], str]]],
               rows: list[dict[str, Any]]) -> str:
        head = "".join(f"<th>{_e(title)}</th>" for title, _ in columns)
        body = "\n".join("<tr>" + "".join(f"<td>{render(self, row)}</td>" for _, render in columns) + "</tr>"
                         for row in rows)
        return f'<table class="{_e(name)}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>'


# ---------------------------------------------------------------- page pieces (data-driven)


def _field(key: str) -> Callable[[Monitor, dict[str, Any]], str]:
    return lambda monitor, row: _t(row.get(key))


def _text(key: str, css: str = "") -> Callable[[Monitor, dict[str, Any]], str]:
    return lambda monitor, row: f'<span class="{css}">{_e(row.get(key))}</span>' if css and row.get(key) else _e(row.get(key))


def _pre(key: str) -> Callable[[Monitor, dict[str, Any]], str]:
    return lambda monitor, row: f"<pre>{_e(row.get(key))}</pre>" if row.get(key) not in (None, "") else "-"


def _status(key: str = "status") -> Callable[[Monitor, dict[str, Any]], str]:
    return lambda monitor, row: f'<span class="outcome-{_e(row.get(key))}">{_e(row.get(key))}</span>'


def _run_duration(monitor: Monitor, row: dict[str, Any]) -> str:
    if row.get("started_at") and row.get("finished_at"):
        return _e(_duration(row["finished_at"] - row["started_at"]))
    return "-"


def _attempt_lines(monitor: Monitor, row: dict[str, Any]) -> str:
    lines = []
    for attempt in row.get("attempts", []):
        error = f': <span class="error">{_e(attempt["error_message"])}</span>' if attempt["error_message"] else ""
        step = f'step {_e(attempt["step"])} ' if attempt.get("step") else ""
        lines.append(f'<li>#{_e(attempt["attempt"])} {step}<span class="outcome-{_e(attempt["outcome"])}">'
                     f'{_e(attempt["outcome"])}</span> {_t(attempt["started_at"])}{error}</li>')
    return f'<ul class="attempts">{"".join(lines)}</ul>' if lines else "-"


def _history_columns(runs: list[dict[str, Any]]) -> list[tuple[str, Callable[[Monitor, dict[str, Any]], str]]]:
    """The job page's history table, one entry per column; a Targets column when a run shown
    ran on a fleet."""
    fleet = [("Targets", _targets_cell)] if any(run.get("targets") for run in runs) else []
    return [
        ("Run", lambda m, r: m.run_link(r["run_id"])),
        ("Kind", _run_kind),
        ("Slot (UTC)", _field("scheduled_for")),
        ("Status", _status()),
        ("Attempts", lambda m, r: f'{_e(r["attempt"])}/{_e(r["max_attempts"])}'),
        ("Started", _field("started_at")),
        ("Finished", _field("finished_at")),
        ("Duration", _run_duration),
        ("Worker", _text("worker")),
        ("Each attempt", _attempt_lines),
        *fleet,
        ("Error / note", lambda m, r: f'<span class="error">{_e(r["last_error"])}</span>' if r["last_error"] else _e(r["note"])),
    ]


def _last_targets(row: dict[str, Any]) -> str:
    """A job's last run on a fleet: " · T targets, F failed" (nothing for a run without targets)."""
    total = row.get("last_targets_total")
    if not total:
        return ""
    failed = row.get("last_targets_failed") or 0
    css = "targets-failed" if failed else "targets"
    return f' <span class="{css}">· {_e(total)} target{"s" if total != 1 else ""}, {_e(failed)} failed</span>'


def _fleet_summary(run: dict[str, Any], statuses: dict[str, int]) -> str:
    """A fleet run's counts: its targets (every fleet step added up), how many failed, and its
    executions per status now (HTML, escaped)."""
    now = ", ".join(f'{_e(n)} <span class="outcome-{_e(s)}">{_e(s)}</span>' for s, n in statuses.items())
    return (f'{_e(run.get("targets_total") or 0)} target(s), {_e(run.get("targets_failed") or 0)} failed'
            + (f" ({now})" if now else ""))


def _execution_line(monitor: Monitor, execution: dict[str, Any]) -> str:
    error = f': <span class="error">{_e(execution["last_error"])}</span>' if execution["last_error"] else ""
    return (f'step {_e(execution["step"])} {monitor.run_link(execution["run_id"])} '
            f'<span class="outcome-{_e(execution["status"])}">{_e(execution["status"])}</span> '
            f'{_e(execution["attempts"])}/{_e(execution["max_attempts"])}{error}')


def _targets_cell(monitor: Monitor, row: dict[str, Any]) -> str:
    """The job page's fleet of a run: its counts, the executions that did not succeed in sight,
    every execution by target behind a <details> (no script: the browser opens it)."""
    executions = row.get("targets") or []
    if not executions:
        return "-"
    groups: dict[str, list[dict[str, Any]]] = {}
    for execution in executions:
        groups.setdefault(views.target_label(execution), []).append(execution)

    def items(only_unsuccessful: bool) -> str:
        out = []
        for label, group in groups.items():
            shown = [e for e in group if e["status"] != RunStatus.SUCCEEDED] if only_unsuccessful else group
            if shown:
                out.append(f'<li><span class="target">{_e(label)}</span>: '
                           + "; ".join(_execution_line(monitor, e) for e in shown) + "</li>")
        return "".join(out)

    unsuccessful = items(True)
    return (f'<div class="fleet">{_fleet_summary(row, row.get("target_statuses") or {})}</div>'
            + (f'<ul class="targets unsuccessful">{unsuccessful}</ul>' if unsuccessful else "")
            + f'<details><summary>every target</summary><ul class="targets">{items(False)}</ul></details>')


def _grouped(executions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run page's executions, a target's name on its first execution only (they come
    grouped by target)."""
    rows, previous = [], None
    for execution in executions:
        label = views.target_label(execution)
        rows.append({**execution, "target": label if label != previous else ""})
        previous = label
    return rows


TARGET_COLUMNS = [("Target", lambda m, r: f'<span class="target">{_e(r["target"])}</span>' if r["target"] else ""),
                  ("Step", _text("step")), ("Execution", lambda m, r: m.run_link(r["run_id"])),
                  ("Status", _status()),
                  ("Attempts", lambda m, r: f'{_e(r["attempts"])}/{_e(r["max_attempts"])}'),
                  ("Started (UTC)", _field("started_at")), ("Finished", _field("finished_at")),
                  ("Error", lambda m, r: f'<pre class="error">{_e(r["last_error"])}</pre>' if r["last_error"] else "-")]


EVENT_COLUMNS = [("Event", _text("event_id")), ("At (UTC)", _field("event_at")), ("Kind", _text("kind")),
                 ("Detail", _pre("detail"))]

def _run_job(monitor: Monitor, run: dict[str, Any]) -> str:
    if run["job_name"]:
        return monitor.job_link(run["job_name"])
    parent = run.get("parent")
    if run.get("parent_run_id") is not None:
        job = f' of job {monitor.job_link(parent["job_name"])}' if parent and parent["job_name"] else ""
        return f'(a target of run {monitor.run_link(run["parent_run_id"])}{job})'
    return "(task)"


def _run_kind(monitor: Monitor, run: dict[str, Any]) -> str:
    """The run's kind; for a run a job that follows a job started, the run it followed, linked."""
    if run.get("followed_run_id") is None:
        return _e(run.get("kind"))
    return f'{_e(run.get("kind"))}, <span class="after">after run {monitor.run_link(run["followed_run_id"])}</span>'


def _after(monitor: Monitor, job: dict[str, Any]) -> str:
    """Whom a job follows, as a line under its schedule ("after load", "after load failed"), the
    job linked; nothing for a job that follows none."""
    leader = job.get("after_job")
    if not leader:
        return ""
    outcome = job.get("after_outcome") or "succeeded"
    when = "" if outcome == "succeeded" else f" {_e(outcome)}"
    return f'<div class="after">after {monitor.job_link(leader)}{when}</div>'


def _run_fleet(monitor: Monitor, run: dict[str, Any]) -> str:
    """What the run has to do with a fleet: an execution's run, step and target; a fleet run's
    counts; "-" for any other run."""
    if run.get("parent_run_id") is not None:
        parent = run.get("parent")
        state = f' ({_e(parent["status"])})' if parent else " (gone)"
        own = "" if run.get("target_server") else " (the agent's own server)"
        return (f'execution of run {monitor.run_link(run["parent_run_id"])}{state}, step {_e(run["step"])}, '
                f'on target <span class="target">{_e(views.target_label(run))}</span>{own}')
    if run.get("targets_total") is not None:
        return _fleet_summary(run, run.get("target_statuses") or {})
    return "-"


RUN_FIELDS: list[tuple[str, Callable[[Monitor, dict[str, Any]], str]]] = [
    ("Job", _run_job), ("Fleet", _run_fleet),
    ("Kind", _run_kind), ("Status", _status()), ("Step", _text("step")), ("Slot (UTC)", _field("scheduled_for")),
    ("Attempts", lambda m, r: f'{_e(r["attempt"])} of {_e(r["max_attempts"])} (failures {_e(r["failures"])}, '
                              f'lapses {_e(r["lapses"])}, transient errors {_e(r["transient_errors"])})'),
    ("Created", _field("created_at")), ("Runnable at", _field("runnable_at")), ("Dispatched", _field("dispatched_at")),
    ("Started", _field("started_at")), ("Finished", _field("finished_at")), ("Duration", _run_duration),
    ("Worker", _text("worker")), ("Lease expires", _field("lease_expires_at")), ("Token", _text("token")),
    ("Target database", _text("target_database")), ("Target server", _text("target_server")),
    ("Task order", _text("task_order")),
    ("Operation id", _text("operation_id")), ("Command", _pre("command")),
    ("Last error", lambda m, r: (f'<pre class="error">{_e(r["last_error"])}</pre>' if r["last_error"] else "-")),
    ("Note", _text("note")),
]

ATTEMPT_COLUMNS = [("Attempt", _text("attempt")), ("Step", _text("step")), ("Database", _text("target_database")),
                   ("Outcome", _status("outcome")), ("Worker", _text("worker")),
                   ("Started (UTC)", _field("started_at")), ("Finished", _field("finished_at")),
                   ("Dequeue count", _text("dequeue_count")), ("Error number", _text("error_number")),
                   ("SQLSTATE", _text("error_sqlstate")),
                   ("Error", lambda m, r: f'<pre class="error">{_e(r["error_message"])}</pre>' if r["error_message"] else "-"),
                   ("Output", _pre("output"))]


def _errors_list(monitor: Monitor, row: dict[str, Any]) -> str:
    items = "".join(f"<li>{_e(error if isinstance(error, str) else json.dumps(error, default=str))}</li>"
                    for error in row.get("errors") or [])
    return f'<ul class="errors">{items}</ul>' if items else "-"


POISON_COLUMNS = [("Id", _text("poison_id")), ("Run", lambda m, r: m.run_link(r["run_id"])),
                  ("Message id", _text("message_id")), ("Dequeues", _text("dequeue_count")),
                  ("Poisoned (UTC)", _field("poisoned_at")), ("Requeued", _field("requeued_at")),
                  ("Reason", lambda m, r: f'<span class="error">{_e(r["reason"])}</span>'),
                  ("Errors", _errors_list), ("Body", _pre("body"))]

# The run page's sections below its facts: (key of run_view's result, title, columns).
RUN_SECTIONS = [("attempts", "Attempts", ATTEMPT_COLUMNS), ("poison", "Poison messages", POISON_COLUMNS)]

STUCK_COLUMNS = [("Run", lambda m, r: m.run_link(r["run_id"])),
                 ("Job", lambda m, r: m.job_link(r["job_name"]) if r["job_name"] else "(task)"),
                 ("Kind", _text("kind")), ("Status", _status()), ("Step", _text("step")), ("Slot (UTC)", _field("scheduled_for")),
                 ("Runnable at", _field("runnable_at")), ("Lease expired", _field("lease_expires_at")),
                 ("Token", _text("token")), ("Attempt", _text("attempt"))]


def status_text(row: dict[str, Any]) -> str:
    """The status now, in words (HTML, escaped)."""
    status = row["status"]
    flight = row["runs_in_flight"]
    more = f" ({flight} runs in flight)" if flight > 1 else ""
    if status == "running":
        worker = f" on {_e(row['status_worker'])}" if row["status_worker"] else ""
        text = f"running since {_t(row['status_since'])}{worker}"
    elif status == "queued":
        text = f"queued since its slot {_t(row['status_since'])}"
    elif status == "retrying":
        text = f"retrying at {_t(row['retry_at'])}"
    elif status == "waiting":
        text = f"waiting since its slot {_t(row['status_since'])}"
    elif status == "due":
        text = f"claimed for its slot {_t(row['status_since'])}"
    else:
        text = "idle"
    return f'<span class="now-{_e(status)}">{text}</span>{more}'


def _pause_text(row: dict[str, Any]) -> str:
    """A paused job's pause under its state: until when (or until resumed), since when, by whom, why."""
    if not row.get("paused"):
        return ""
    until = f"until {_t(row['paused_until'])}" if row.get("paused_until") else "until resumed"
    by = f" by {_e(row['paused_by'])}" if row.get("paused_by") else ""
    reason = f": {_e(row['pause_reason'])}" if row.get("pause_reason") else ""
    return f'<div class="pause">{until}; since {_t(row["paused_at"])}{by}{reason}</div>'


def _next_slot(row: dict[str, Any]) -> str:
    if row.get("next_due_at") is None:
        return "-"
    if row.get("paused"):
        # A paused job claims no slot; the one it waits for runs after the pause, if the misfire
        # policy says so.
        return f'<span class="pause">none while paused</span> (next: {_t(row["next_due_at"])} UTC)'

    local = row.get("next_due_local")
    shown = f'{_t(row["next_due_at"])} UTC'
    if local and row.get("timezone") not in (None, "UTC"):
        shown += f'<div class="local">{_e(local[:19].replace("T", " "))} {_e(row["timezone"])}</div>'
    return shown


def _duration(delta: timedelta) -> str:
    seconds = max(delta.total_seconds(), 0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def _is_database_error(exc: BaseException) -> bool:
    """What the driver or the store raised (unreachable server, missing schema, ...), as opposed
    to a bug of the monitor's own."""
    import sqlite3


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
MAX_RUN_ID = 2**63 - 1
# older_than beyond a century would push the cut-off before year 1 (an overflow, not a question).
MAX_STUCK_AGE_SECONDS = 100 * 366 * 86400


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


# ---------------------------------------------------------------- Azure: App Service Authentication


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


def handle_azure_request(method: str, url: str, headers: Mapping[str, str]) -> Response:
    """The HTTP trigger's one call. App Service Authentication (infra/functionapp.bicep) signs
    the user in and admits only AGENT_MONITOR_ALLOWED_GROUP; this checks the same group again
    from the principal the platform passes, and refuses everyone while the setting is empty."""

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
                      base_path=AZURE_BASE_PATH)
    if method.upper() not in ALLOWED_METHODS:
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
    if settings.allowed_group not in principal.groups:
        return _refused(monitor, method, 403, f"{principal.name or 'this user'} is not a member of the Entra group "
                                              f"the monitor admits ({GROUP_SETTING})")
    return monitor.handle(method, path, split.query, accept, user=principal.name or "signed-in user")


def _refused(monitor: Monitor, method: str, status: int, message: str) -> Response:
    response = monitor.error_response(status, message, False, None, 0)
    if method.upper() == "HEAD":
        response.headers["Content-Length"] = str(len(response.body))
        response.body = b""
    return response


# ---------------------------------------------------------------- locally: the standard library's server


class StorePool:
    """Stores lent to the server's request threads, one request at a time, at most ``size`` at
    once: a burst of requests waits for a free one instead of opening a connection each. The
    connections themselves come from the process's pool (AGENT_MAX_CONNECTIONS, shared.control.pool),
    shared with the workers and the tick: each request's connection goes back to it when the
    request ends, and an idle one is closed after a minute, so a quiet monitor holds none."""

    def __init__(self, agent, size: int = 4, idle_seconds: float = 60.0, wait_seconds: float = 30.0) -> None:
        self.agent = agent
        self.size = size
        self.idle_seconds = idle_seconds
        self.wait_seconds = wait_seconds
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Any] = []      # Store objects without a connection, for the next request
        self._lock = threading.Lock()
        self.opened = 0                 # Store objects made (at most size)

    @contextlib.contextmanager
    def lend(self) -> Iterator[Any]:
        if not self._slots.acquire(timeout=self.wait_seconds):
            raise PageError(503, f"the monitor is busy: all {self.size} of its database connections stayed in use "
                                 f"for {self.wait_seconds:.0f} s; try again")
        try:
            with self._lock:
                store = self._idle.pop() if self._idle else None
            if store is None:
                store = self.agent.new_store()
                self.opened += 1
            try:
                yield store
            finally:
                store.close()       # the connection back to the process's pool
                with self._lock:
                    self._idle.append(store)
        finally:
            self._slots.release()

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def connections(self) -> int:
        """Connections the monitor's stores hold now (0 between requests)."""
        with self._lock:
            return sum(1 for store in self._idle if store.connected)

    def close(self) -> None:
        with self._lock:
            stores, self._idle = list(self._idle), []
        for store in stores:
            store.close()


def make_server(agent, port: int, environ: Mapping[str, str] | None = None):
    """A ThreadingHTTPServer on 127.0.0.1:port serving the monitor (port 0: any free port).
    Raises OSError when the port is taken."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pool = StorePool(agent)
    env = dict(os.environ if environ is None else environ)
    monitor = Monitor(pool.lend, clock=agent.clock, settings=lambda: monitor_settings(env), base_path="")

    class Handler(BaseHTTPRequestHandler):
        server_version = "agent-monitor"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        # A request line the library cannot read leaves the version at its default; at HTTP/0.9 the
        # library writes an error body with no status line and no headers at all.
        default_request_version = "HTTP/1.0"

        def _answer(self) -> None:
            port_now = self.server.server_address[1]
            allowed = {f"127.0.0.1:{port_now}", f"localhost:{port_now}"}
            host = (self.headers.get("Host") or "").strip().lower()
            split = urlsplit(self.path)
            if host not in allowed:
                # DNS rebinding: a page of another site whose name now points here would reach
                # the monitor with its own name as Host. Only the loopback names are served.
                response = monitor.error_response(421, f"Host {host!r} is not served: open http://127.0.0.1:{port_now}/",
                                          False, None, 0)
                if self.command == "HEAD":
                    response.headers["Content-Length"] = str(len(response.body))
                    response.body = b""
            else:
                # X-MS-CLIENT-PRINCIPAL* are ignored here: locally nobody signs in, and a header
                # a client sets itself proves nothing.
                response = monitor.handle(self.command, split.path, split.query, self.headers.get("Accept", ""))
            self._send(response)

        def _send(self, response: Response) -> None:
            self.send_response(response.status)
            for name, value in response.all_headers().items():
                self.send_header(name, value)
            if "Content-Length" not in response.headers:
                self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if response.body:
                self.wfile.write(response.body)

        def __getattr__(self, name: str):
            # Every method, known to the standard library or not (TRACE, CONNECT, PROPFIND, FOO),
            # reaches the monitor's own handler: 405 with Allow and the security headers, never
            # the library's bare 501 page.
            if name.startswith("do_"):
                return self._answer
            raise AttributeError(name)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            # The library's own refusals (414 URI too long, 400 bad request line, 431 headers too
            # large, 505 version) answered as the monitor answers: its page and security headers.
            short, _ = self.responses.get(code, ("Error", ""))
            response = monitor.error_response(code, message or short, False, None, 0)
            self.close_connection = True
            response.headers["Connection"] = "close"
            if getattr(self, "command", None) == "HEAD" or code < 200 or code in (204, 304):
                response.headers["Content-Length"] = str(len(response.body))
                response.body = b""
            try:
                self._send(response)
            except OSError:
                pass  # the client is gone

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the runner logs beside it
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # The standard library listens with a backlog of 5: a burst of 64 browsers' requests waited
        # in SYN retries for up to 28 s. A thread serves each connection; the store pool bounds
        # the database connections they share.
        request_queue_size = 128

        def server_close(self) -> None:
            super().server_close()
            pool.close()

    server = Server(("127.0.0.1", port), Handler)
    server.store_pool = pool
    return server
