"""The monitor's pages as HTML: the page around, the jobs, a job (with its timeline), a run, the
poison messages, the stuck runs; the column tables and cells they are built of. Rendering only: the
rows come from shared.engine.views."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Callable
from urllib.parse import quote

from shared.engine import views
from shared.engine.alerts import alert_limits_text
from shared.jobs.params import read_json
from shared.jobs.run_model import RunStatus
from shared.web.html import OUTCOME_COLOURS, escape, visible, when


class Pages:
    """The monitor's HTML pages, every link under ``base_path`` ("/api/monitor" in Azure, ""
    locally). Rendering only: the rows come from shared.engine.views."""

    def __init__(self, base_path: str = "", act: "ActForms | None" = None, alive: dict[str, Any] | None = None) -> None:
        self.base_path = base_path.rstrip("/")
        # The operator's forms (None: a reader, who sees no button); the agent's liveness (the
        # banner at the top of every page when it is late).
        self.act = act
        self.alive = alive

    def link(self, path: str, **params: str) -> str:
        query = "&".join(f"{quote(k)}={quote(str(v), safe='')}" for k, v in params.items())
        return escape(f"{self.base_path}{path}" + (f"?{query}" if query else ""))

    def job_link(self, name: Any) -> str:
        return f'<a href="{self.link("/jobs/" + quote(str(name), safe=""))}">{escape(name)}</a>'

    def run_link(self, run_id: Any) -> str:
        if run_id is None:
            return "-"
        return f'<a href="{self.link(f"/runs/{int(run_id)}")}">{escape(run_id)}</a>'

    def document(self, title: str, body: str, path: str, params: dict[str, str], user: str | None,
                  refresh: int, now: datetime | None) -> str:
        meta = f'<meta http-equiv="refresh" content="{int(refresh)}">\n' if refresh > 0 else ""
        who = f'<span class="user">Signed in as {escape(user)}</span>' if user else '<span class="user">local</span>'
        twin = {**params, "format": "json"}
        asof = f'<span class="asof">as of {when(now)} UTC</span>' if now else ""
        refreshing = f" · refreshes every {int(refresh)} s" if refresh > 0 else ""
        define = f' <a href="{self.link("/define")}">Define jobs</a>' if self.act is not None else ""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escape(title)} · SQL Agent monitor</title>\n{meta}"
            f'<link rel="stylesheet" href="{self.link("/monitor.css")}">\n</head>\n<body>\n'
            f'<header><nav><a href="{self.link("/")}">Jobs</a> <a href="{self.link("/poison")}">Poison</a> '
            f'<a href="{self.link("/stuck")}">Stuck</a> <a href="{self.link("/audit")}">Audit</a> '
            f'<a href="{self.link("/alerts")}">Alerts</a>{define}</nav> {who} {asof}</header>\n'
            f"{self.liveness_banner()}<main>\n{body}</main>\n"
            f'<footer><a href="{self.link(path if path.startswith("/") else "/" + path, **twin)}">JSON</a>{refreshing}'
            "</footer>\n</body>\n</html>\n")

    def liveness_banner(self) -> str:
        alive = self.alive
        if not alive or not alive.get("late"):
            return ""
        return f'<div class="liveness late" role="alert"><strong>Agent late:</strong> {escape(alive["message"])}</div>\n'

    def job_buttons(self, row: dict[str, Any], *, full: bool) -> str:
        """An operator's buttons for a job: start (with its parameters on the job page), stop
        (while runs are in flight), pause (with until and reason on the job page) or resume."""
        act = self.act
        if act is None or row.get("job_name") is None:
            return ""
        name = row["job_name"]
        out = []
        if row.get("valid") and row.get("configured"):
            fields = ""
            if full:
                for param, default in (row.get("params") or {}).items():
                    hint = f"default: {default}" if default is not None else "required"
                    fields += (f'<label>{escape(param)} <input type="text" name="{escape("param." + param)}" '
                               f'placeholder="{escape(hint)}"></label> ')
            out.append(act.form("start", name, fields))
        if row.get("runs_in_flight"):
            out.append(act.form("stop", name))
        if row.get("paused"):
            out.append(act.form("resume", name))
        if full:        # pausing a paused job keeps its start and takes the new end and reason
            out.append(act.form("pause", name,
                                '<label>until (UTC) <input type="text" name="until" placeholder="2026-01-31 02:00; empty: '
                                'until resumed"></label> <label>reason <input type="text" name="reason" maxlength="400">'
                                "</label> "))
        elif not row.get("paused"):
            out.append(act.form("pause", name))
        if row.get("source") == "database":     # its definition, on the job form (shared/web/jobform.py)
            out.append(f'<a class="edit-job" href="{self.link("/define", job=name)}">Edit</a>')
        return f'<div class="actions">{"".join(out)}</div>'

    def jobs_page(self, rows: list[dict[str, Any]]) -> str:
        lines = ["<h1>Jobs</h1>"]
        if not rows:
            lines.append("<p>No jobs yet: the agent records the jobs of its settings at its next tick.</p>")
            return "\n".join(lines) + "\n"
        lines.append('<table class="jobs">\n<thead><tr><th>Job</th><th>Defined in</th><th>State</th><th>Schedule</th>'
                     "<th>Time zone</th><th>Status now</th><th>Last outcome</th><th>Next slot</th>"
                     + ("<th>Actions</th>" if self.act else "") + "</tr></thead>\n<tbody>")
        for row in rows:
            state = f'<span class="state-{escape(row["state"])}">{escape(row["state"])}</span>' + _pause_text(row)
            if row["config_error"]:
                state += f'<div class="error">{escape(row["config_error"])}</div>'
            last = "-"
            if row["last_run_id"]:
                last = (f'<span class="outcome-{escape(row["last_status"])}">{escape(row["last_status"])}</span> '
                        f'{self.run_link(row["last_run_id"])} {when(row["last_finished_at"])}{_last_targets(row)}')
            lines.append(
                f'<tr class="job" id="job-{escape(row["job_name"])}"><td>{self.job_link(row["job_name"])}</td>'
                f'<td>{escape(row["source"])}</td><td>{state}</td>'
                f'<td>{escape(row["schedule_words"])}<div><code>{escape(row["schedule"])}</code></div>'
                f'{_calendars(row)}{_after(self, row)}{_catchup(row)}</td>'
                f'<td>{escape(row["timezone"])}</td><td class="status">{status_text(row)}</td><td>{last}</td>'
                f"<td>{_next_slot(row)}</td>{'<td>' + self.job_buttons(row, full=False) + '</td>' if self.act else ''}</tr>")
        lines.append("</tbody></table>")
        return "\n".join(lines) + "\n"

    def job_page(self, data: dict[str, Any], now: datetime) -> str:
        job = data["job"]
        name = job["job_name"]
        state = (escape(job["state"]) + _pause_text(job)
                 + (f'<div class="error">{escape(job["config_error"])}</div>' if job["config_error"] else ""))
        facts = [
            ("Defined in", escape(job["source"])), ("State", state),
            ("Schedule", f'{escape(job["schedule_words"])} <code>{escape(job["schedule"])}</code>'
                         f'{_calendars(job)}{_after(self, job)}{_catchup(job)}'),
            ("Time zone", escape(job["timezone"])), ("Status now", status_text(job)),
            ("Last outcome", f'{escape(job["last_status"] or "-")} {self.run_link(job["last_run_id"])} '
                             f'{when(job["last_finished_at"]) if job["last_run_id"] else ""}{_last_targets(job)}'),
            ("Next slot", _next_slot(job)), ("Overlap / misfire", f'{escape(job["overlap"])} / {escape(job["misfire"])}'),
            ("Max attempts", escape(job["max_attempts"])),
            # MAX_DURATION_SECONDS, STOP_AFTER_SECONDS, SLOWER_THAN, DEADLINE_SECONDS (docs/configuration.md).
            ("Alerts", escape(alert_limits_text(job))),
        ]
        out = [f"<h1>Job {escape(name)}</h1>", self.job_buttons(job, full=True), '<dl class="facts">']
        out += [f"<dt>{label}</dt><dd>{value}</dd>" for label, value in facts]
        out.append("</dl>")
        windows = " ".join(
            f'<strong>{escape(w)}</strong>' if w == data["window"]
            else f'<a href="{self.link("/jobs/" + quote(str(name), safe=""), window=w)}">{escape(w)}</a>'
            for w in views.TIMELINE_WINDOWS)
        out.append(self.next_slots(data["next"]))
        out.append(f'<h2>Runs over the last {escape(data["window"])}</h2>\n<p class="windows">Window: {windows}</p>')
        out.append(self.timeline(data, now))
        out.append("<h2>History</h2>")
        out.append(self.table("history", _history_columns(data["runs"]), data["runs"]) if data["runs"]
                   else "<p>No runs yet.</p>")
        out.append("<h2>Job events</h2>")
        out.append(self.table("events", EVENT_COLUMNS, data["job_events"]) if data["job_events"]
                   else "<p>No job events.</p>")
        return "\n".join(out) + "\n"

    def next_slots(self, upcoming: dict[str, Any]) -> str:
        """The slots to come (as `sql-agent next JOB`), in UTC and in the job's time zone."""
        out = ["<h2>Next slots</h2>"]
        if upcoming["slots"]:
            rows = "".join(f'<tr><td>{k}</td><td>{when(slot["at"])}</td><td>{escape((slot["local"] or "").replace("T", " "))}</td>'
                           f'<td>{escape(_slot_note(slot))}</td></tr>'
                           for k, slot in enumerate(upcoming["slots"], start=1))
            out.append(f'<table class="next"><thead><tr><th>#</th><th>UTC</th><th>{escape(upcoming["timezone"])}</th>'
                       f"<th>Note</th></tr></thead><tbody>{rows}</tbody></table>")
        if upcoming["removed"]:
            rows = "".join(f'<tr><td>{when(slot["at"])}</td><td>{escape((slot["local"] or "").replace("T", " "))}</td>'
                           f'<td>{escape(slot["calendar"])}</td><td>{when(slot["moved_to"]) if slot["moved_to"] else "-"}</td></tr>'
                           for slot in upcoming["removed"])
            out.append(f'<p>Slots the calendars remove:</p><table class="removed"><thead><tr><th>UTC</th>'
                       f'<th>{escape(upcoming["timezone"])}</th><th>By</th><th>Moved to (UTC)</th></tr></thead>'
                       f"<tbody>{rows}</tbody></table>")
        elif not upcoming["note"] and not upcoming["slots"]:
            out.append("<p>No slot to come.</p>")
        if upcoming["note"]:
            out.append(f'<p class="note">{escape(upcoming["note"])}</p>')
        return "\n".join(out)

    def timeline(self, data: dict[str, Any], now: datetime) -> str:
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
                             f'fill="#424242">{escape(label)}</text>')
            mark += tick
        for run in reversed(data["timeline"]["runs"]):
            begin = run["started_at"] or run["scheduled_for"]
            finish = run["finished_at"] or (now if run["status"] == RunStatus.RUNNING else begin)
            x0 = x(begin)
            bar = max(x(finish) - x0, 2.0)
            title = (f'run {run["run_id"]} · {run["status"]} · slot {when(run["scheduled_for"])} UTC · '
                     f'attempts {run["attempt"]}/{run["max_attempts"]}')
            if run["finished_at"] and run["started_at"]:
                title += f' · {_duration(run["finished_at"] - run["started_at"])}'
            if run["last_error"] or run["note"]:
                title += f' · {run["last_error"] or run["note"]}'
            colour = OUTCOME_COLOURS.get(run["status"], "#000000")
            href = self.link("/runs/%d" % int(run["run_id"]))
            parts.append(f'<a href="{href}">'
                         f'<rect class="bar bar-{escape(run["status"])}" data-run="{int(run["run_id"])}" x="{x0:.1f}" '
                         f'y="{top}" width="{bar:.1f}" height="{height}" fill="{colour}">'
                         f"<title>{escape(title)}</title></rect></a>")
        parts.append("</svg>")
        shown = len(data["timeline"]["runs"])
        note = f'<p class="timeline-note">{shown} run(s) in the window.</p>'
        if data["timeline"]["cut"]:
            note = (f'<p class="timeline-note cut">The window holds more than {data["timeline"]["limit"]:,} runs: '
                    f'the latest {data["timeline"]["limit"]:,} are drawn.</p>')
        legend = " ".join(f'<span class="legend"><svg width="10" height="10" viewBox="0 0 10 10">'
                          f'<rect width="10" height="10" fill="{colour}"/></svg> {escape(status)}</span>'
                          for status, colour in OUTCOME_COLOURS.items() if status != RunStatus.PENDING)
        return "\n".join(parts) + f"\n{note}\n<p class=\"legend\">{legend}</p>"

    def run_page(self, data: dict[str, Any]) -> str:
        run = data["run"]
        out = [f'<h1>Run {escape(run["run_id"])}</h1>']
        if self.act is not None and run.get("status") in UNFINISHED:
            out.append(f'<div class="actions">{self.act.form("cancel", run["run_id"])}</div>')
        out.append('<dl class="facts">')
        facts = {**run, "parent": data.get("parent"), "target_statuses": data.get("target_statuses") or {}}
        for label, render in RUN_FIELDS:
            out.append(f"<dt>{escape(label)}</dt><dd>{render(self, facts)}</dd>")
        out.append("</dl>")
        if run.get("targets_total") is not None:
            out.append(f'<h2>Targets</h2>\n<p class="fleet">{_fleet_summary(run, data.get("target_statuses") or {})}</p>')
            out.append(self.table("targets", TARGET_COLUMNS, _grouped(data["targets"])) if data["targets"]
                       else "<p>No executions (the run's targets were gone).</p>")
        for key, title, columns in RUN_SECTIONS:
            out.append(f"<h2>{escape(title)}</h2>")
            out.append(self.table(key, columns, data[key]) if data[key] else f"<p>No {escape(title.lower())}.</p>")
        return "\n".join(out) + "\n"

    def poison_page(self, rows: list[dict[str, Any]]) -> str:
        out = ["<h1>Poison messages</h1>",
               "<p>Messages taken out of circulation, newest first; "
               "<code>sql-agent poison requeue ID</code> gives the run one more attempt.</p>"]
        columns = POISON_COLUMNS + ([("Action", _requeue_button)] if self.act is not None else [])
        out.append(self.table("poison", columns, rows) if rows else "<p>No poison messages.</p>")
        return "\n".join(out) + "\n"

    def stuck_page(self, rows: list[dict[str, Any]], older_than: int, limit: int) -> str:
        out = ["<h1>Stuck runs</h1>",
               f"<p>Runs in flight past their lease, and runs runnable for more than {older_than} s "
               f"that have not started (at most {limit}).</p>"]
        out.append(self.table("stuck", STUCK_COLUMNS, rows) if rows else "<p>No stuck runs.</p>")
        return "\n".join(out) + "\n"

    def audit_page(self, rows: list[dict[str, Any]], job: str | None, since: datetime | None, limit: int) -> str:
        """The audit trail (as `sql-agent audit`), newest first. Every value came from an operator or a
        script: escaped, its invisible format characters shown (html.visible), and each in a <bdi>
        so that one cannot reorder the others."""
        scope = (f" of job <bdi>{visible(job)}</bdi>" if job else "") + (f" since {when(since)} UTC" if since else "")
        out = ["<h1>Audit trail</h1>",
               f"<p>Operator actions{scope}, newest first (at most {int(limit)}): from the command line and the "
               "T-SQL procedures; a refused action is recorded as refused.</p>"]
        out.append(self.table("audit", AUDIT_COLUMNS, rows) if rows else "<p>No audited actions.</p>")
        return "\n".join(out) + "\n"

    def alerts_page(self, data: dict[str, Any]) -> str:
        """The condition alerts (as `sql-agent alerts`) and their latest responses. Names, queries and
        errors came from settings and callers: escaped, isolated."""
        out = ["<h1>Condition alerts</h1>",
               "<p>Probes whose rows are the alert, and error watches over every run's failures, each answered at "
               "most once per its delay (docs/monitoring.md, Condition alerts).</p>"]
        out.append(self.table("alerts", ALERT_COLUMNS, data["alerts"]) if data["alerts"]
                   else "<p>No condition alerts (ALERT__&lt;name&gt;__QUERY or __ERRORS, or agent.add_alert).</p>")
        out.append("<h2>Latest responses</h2>")
        out.append(self.table("firings", FIRING_COLUMNS, data["firings"]) if data["firings"] else "<p>None yet.</p>")
        return "\n".join(out) + "\n"

    def table(self, name: str, columns: list[tuple[str, Callable[["Pages", dict[str, Any]], str]]],
               rows: list[dict[str, Any]]) -> str:
        head = "".join(f"<th>{escape(title)}</th>" for title, _ in columns)
        body = "\n".join("<tr>" + "".join(f"<td>{render(self, row)}</td>" for _, render in columns) + "</tr>"
                         for row in rows)
        return f'<table class="{escape(name)}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>'


# A run an operator may cancel (operations.cancel takes these).
UNFINISHED = ("pending", "queued", "running", "waiting")


class ActForms:
    """An operator's forms: each POSTs one action with its target and a token made for this
    session, this principal, this action and this target (shared/web/actions.py)."""

    def __init__(self, base_path: str, token: Callable[[str, Any], str]) -> None:
        self.base_path = base_path.rstrip("/")
        self.token = token

    def form(self, action: str, target: Any, fields: str = "", hidden: dict[str, str] | None = None) -> str:
        from shared.web.actions import ACTIONS

        kind = ACTIONS[action]
        values = {kind.target: str(target), **(hidden or {})}
        inputs = "".join(f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in values.items())
        button = "Yes, " + kind.button.lower() if (hidden or {}).get("confirm") == "yes" else kind.button
        return (f'<form class="action action-{escape(action)}" method="post" '
                f'action="{escape(self.base_path + "/actions/" + action)}">{inputs}'
                f'<input type="hidden" name="token" value="{escape(self.token(action, target))}">{fields}'
                f'<button type="submit" class="act-{escape(action)}">{escape(button)}</button></form>')


def _requeue_button(pages: Pages, row: dict[str, Any]) -> str:
    if pages.act is None or row.get("run_id") is None or row.get("requeued_at") is not None:
        return "-"
    return pages.act.form("requeue", row["poison_id"])


def _field(key: str) -> Callable[[Pages, dict[str, Any]], str]:
    return lambda monitor, row: when(row.get(key))


def _text(key: str, css: str = "") -> Callable[[Pages, dict[str, Any]], str]:
    return lambda monitor, row: f'<span class="{css}">{escape(row.get(key))}</span>' if css and row.get(key) else escape(row.get(key))


def _pre(key: str) -> Callable[[Pages, dict[str, Any]], str]:
    return lambda monitor, row: f"<pre>{escape(row.get(key))}</pre>" if row.get(key) not in (None, "") else "-"


def _status(key: str = "status") -> Callable[[Pages, dict[str, Any]], str]:
    return lambda monitor, row: f'<span class="outcome-{escape(row.get(key))}">{escape(row.get(key))}</span>'


def _run_params(row: dict[str, Any]) -> str:
    """The values the run started with (agent.runs.params; read-only here), each escaped."""
    values = row["params"] if isinstance(row.get("params"), dict) else read_json(row.get("params"))
    if not values:
        return "-"
    return "<dl class=\"params\">" + "".join(f"<dt>{escape(name)}</dt><dd><pre>{escape(value)}</pre></dd>"
                                              for name, value in values.items()) + "</dl>"


def _run_duration(pages: Pages, row: dict[str, Any]) -> str:
    if row.get("started_at") and row.get("finished_at"):
        return escape(_duration(row["finished_at"] - row["started_at"]))
    return "-"


def _attempt_lines(pages: Pages, row: dict[str, Any]) -> str:
    lines = []
    for attempt in row.get("attempts", []):
        error = f': <span class="error">{escape(attempt["error_message"])}</span>' if attempt["error_message"] else ""
        step = f'step {escape(attempt["step"])} ' if attempt.get("step") else ""
        lines.append(f'<li>#{escape(attempt["attempt"])} {step}<span class="outcome-{escape(attempt["outcome"])}">'
                     f'{escape(attempt["outcome"])}</span> {when(attempt["started_at"])}{error}</li>')
    return f'<ul class="attempts">{"".join(lines)}</ul>' if lines else "-"


def _history_columns(runs: list[dict[str, Any]]) -> list[tuple[str, Callable[[Pages, dict[str, Any]], str]]]:
    """The job page's history table, one entry per column; a Targets column when a run shown
    ran on a fleet."""
    fleet = [("Targets", _targets_cell)] if any(run.get("targets") for run in runs) else []
    return [
        ("Run", lambda m, r: m.run_link(r["run_id"])),
        ("Kind", _run_kind),
        ("Slot (UTC)", _field("scheduled_for")),
        ("Status", _status()),
        ("Attempts", lambda m, r: f'{escape(r["attempt"])}/{escape(r["max_attempts"])}'),
        ("Started", _field("started_at")),
        ("Finished", _field("finished_at")),
        ("Duration", _run_duration),
        ("Worker", _text("worker")),
        ("Each attempt", _attempt_lines),
        *fleet,
        ("Error / note", lambda m, r: f'<span class="error">{escape(r["last_error"])}</span>' if r["last_error"] else escape(r["note"])),
    ]


def _last_targets(row: dict[str, Any]) -> str:
    """A job's last run on a fleet: " · T targets, F failed" (nothing for a run without targets)."""
    total = row.get("last_targets_total")
    if not total:
        return ""
    failed = row.get("last_targets_failed") or 0
    css = "targets-failed" if failed else "targets"
    return f' <span class="{css}">· {escape(total)} target{"s" if total != 1 else ""}, {escape(failed)} failed</span>'


def _fleet_summary(run: dict[str, Any], statuses: dict[str, int]) -> str:
    """A fleet run's counts: its targets (every fleet step added up), how many failed, and its
    executions per status now (HTML, escaped)."""
    now = ", ".join(f'{escape(n)} <span class="outcome-{escape(s)}">{escape(s)}</span>' for s, n in statuses.items())
    return (f'{escape(run.get("targets_total") or 0)} target(s), {escape(run.get("targets_failed") or 0)} failed'
            + (f" ({now})" if now else ""))


def _execution_line(pages: Pages, execution: dict[str, Any]) -> str:
    error = f': <span class="error">{escape(execution["last_error"])}</span>' if execution["last_error"] else ""
    return (f'step {escape(execution["step"])} {pages.run_link(execution["run_id"])} '
            f'<span class="outcome-{escape(execution["status"])}">{escape(execution["status"])}</span> '
            f'{escape(execution["attempts"])}/{escape(execution["max_attempts"])}{error}')


def _targets_cell(pages: Pages, row: dict[str, Any]) -> str:
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
                out.append(f'<li><span class="target">{escape(label)}</span>: '
                           + "; ".join(_execution_line(pages, e) for e in shown) + "</li>")
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


TARGET_COLUMNS = [("Target", lambda m, r: f'<span class="target">{escape(r["target"])}</span>' if r["target"] else ""),
                  ("Step", _text("step")), ("Execution", lambda m, r: m.run_link(r["run_id"])),
                  ("Status", _status()),
                  ("Attempts", lambda m, r: f'{escape(r["attempts"])}/{escape(r["max_attempts"])}'),
                  ("Started (UTC)", _field("started_at")), ("Finished", _field("finished_at")),
                  ("Error", lambda m, r: f'<pre class="error">{escape(r["last_error"])}</pre>' if r["last_error"] else "-")]


EVENT_COLUMNS = [("Event", _text("event_id")), ("At (UTC)", _field("event_at")), ("Kind", _text("kind")),
                 ("Detail", _pre("detail"))]


def _run_job(pages: Pages, run: dict[str, Any]) -> str:
    if run["job_name"]:
        return pages.job_link(run["job_name"])
    parent = run.get("parent")
    if run.get("parent_run_id") is not None:
        job = f' of job {pages.job_link(parent["job_name"])}' if parent and parent["job_name"] else ""
        return f'(a target of run {pages.run_link(run["parent_run_id"])}{job})'
    return "(task)"


def _run_kind(pages: Pages, run: dict[str, Any]) -> str:
    """The run's kind; for a run a job that follows a job started, the run it followed, linked."""
    if run.get("followed_run_id") is None:
        return escape(run.get("kind"))
    return f'{escape(run.get("kind"))}, <span class="after">after run {pages.run_link(run["followed_run_id"])}</span>'


def _slot_note(slot: dict[str, Any]) -> str:
    """What a slot to come says beside its time: where a calendar moved it from, or its jitter."""
    if slot["moved"]:
        return slot["moved"]
    return f"jitter +{slot['jitter_seconds']} s" if slot["jitter_seconds"] else ""


def _calendars(job: dict[str, Any]) -> str:
    """The job's calendars in words, as a line under its schedule; nothing when it has none."""
    words = job.get("calendar_words")
    return f'<div class="calendars">{escape(words)}</div>' if words else ""


def _catchup(job: dict[str, Any]) -> str:
    """The job's catch-up window (CATCHUP_SECONDS), as a line under its schedule; nothing when none."""
    words = views.catchup_words(job)
    return f'<div class="catchup">{escape(words)}</div>' if words else ""


def _after(pages: Pages, job: dict[str, Any]) -> str:
    """Whom a job follows, as a line under its schedule ("after load", "after load failed"), the
    job linked; nothing for a job that follows none."""
    leader = job.get("after_job")
    if not leader:
        return ""
    outcome = job.get("after_outcome") or "succeeded"
    when = "" if outcome == "succeeded" else f" {escape(outcome)}"
    return f'<div class="after">after {pages.job_link(leader)}{when}</div>'


def _run_fleet(pages: Pages, run: dict[str, Any]) -> str:
    """What the run has to do with a fleet: an execution's run, step and target; a fleet run's
    counts; "-" for any other run."""
    if run.get("parent_run_id") is not None:
        parent = run.get("parent")
        state = f' ({escape(parent["status"])})' if parent else " (gone)"
        own = "" if run.get("target_server") else " (the agent's own server)"
        return (f'execution of run {pages.run_link(run["parent_run_id"])}{state}, step {escape(run["step"])}, '
                f'on target <span class="target">{escape(views.target_label(run))}</span>{own}')
    if run.get("targets_total") is not None:
        return _fleet_summary(run, run.get("target_statuses") or {})
    return "-"


ATTEMPT_COLUMNS = [("Attempt", _text("attempt")), ("Step", _text("step")), ("Database", _text("target_database")),
                   ("Outcome", _status("outcome")), ("Worker", _text("worker")),
                   ("Started (UTC)", _field("started_at")), ("Finished", _field("finished_at")),
                   ("Dequeue count", _text("dequeue_count")), ("Error number", _text("error_number")),
                   ("SQLSTATE", _text("error_sqlstate")),
                   ("Error", lambda m, r: f'<pre class="error">{escape(r["error_message"])}</pre>' if r["error_message"] else "-"),
                   ("Output", _pre("output"))]


def _errors_list(pages: Pages, row: dict[str, Any]) -> str:
    items = "".join(f"<li>{escape(error if isinstance(error, str) else json.dumps(error, default=str))}</li>"
                    for error in row.get("errors") or [])
    return f'<ul class="errors">{items}</ul>' if items else "-"


POISON_COLUMNS = [("Id", _text("poison_id")), ("Run", lambda m, r: m.run_link(r["run_id"])),
                  ("Message id", _text("message_id")), ("Dequeues", _text("dequeue_count")),
                  ("Poisoned (UTC)", _field("poisoned_at")), ("Requeued", _field("requeued_at")),
                  ("Reason", lambda m, r: f'<span class="error">{escape(r["reason"])}</span>'),
                  ("Errors", _errors_list), ("Body", _pre("body"))]


# The run page's sections below its facts: (key of run_view's result, title, columns).
RUN_FIELDS: list[tuple[str, Callable[[Pages, dict[str, Any]], str]]] = [
    ("Job", _run_job), ("Fleet", _run_fleet),
    ("Kind", _run_kind), ("Status", _status()), ("Step", _text("step")), ("Slot (UTC)", _field("scheduled_for")),
    ("Attempts", lambda m, r: f'{escape(r["attempt"])} of {escape(r["max_attempts"])} (failures {escape(r["failures"])}, '
                              f'lapses {escape(r["lapses"])}, transient errors {escape(r["transient_errors"])})'),
    ("Created", _field("created_at")), ("Runnable at", _field("runnable_at")), ("Dispatched", _field("dispatched_at")),
    ("Started", _field("started_at")), ("Finished", _field("finished_at")), ("Duration", _run_duration),
    ("Worker", _text("worker")), ("Lease expires", _field("lease_expires_at")), ("Token", _text("token")),
    ("Target database", _text("target_database")), ("Target server", _text("target_server")),
    ("Task order", _text("task_order")),
    ("Operation id", _text("operation_id")), ("Command", _pre("command")),
    ("Parameters", lambda m, r: _run_params(r)),
    ("Last error", lambda m, r: (f'<pre class="error">{escape(r["last_error"])}</pre>' if r["last_error"] else "-")),
    ("Note", _text("note")),
]

RUN_SECTIONS = [("attempts", "Attempts", ATTEMPT_COLUMNS), ("poison", "Poison messages", POISON_COLUMNS)]


STUCK_COLUMNS = [("Run", lambda m, r: m.run_link(r["run_id"])),
                 ("Job", lambda m, r: m.job_link(r["job_name"]) if r["job_name"] else "(task)"),
                 ("Kind", _text("kind")), ("Status", _status()), ("Step", _text("step")), ("Slot (UTC)", _field("scheduled_for")),
                 ("Runnable at", _field("runnable_at")), ("Lease expired", _field("lease_expires_at")),
                 ("Token", _text("token")), ("Attempt", _text("attempt"))]


def _isolated(key: str) -> Callable[[Pages, dict[str, Any]], str]:
    return lambda monitor, row: f"<bdi>{visible(row.get(key))}</bdi>" if row.get(key) not in (None, "") else "-"


def _audit_target(pages: Pages, row: dict[str, Any]) -> str:
    parts = []
    if row.get("job_name"):
        parts.append(f'job <bdi><a href="{pages.link("/jobs/" + quote(str(row["job_name"]), safe=""))}">'
                     f'{visible(row["job_name"])}</a></bdi>')
    if row.get("run_id") is not None:
        parts.append(f"run {pages.run_link(row['run_id'])}")
    return ", ".join(parts) or "-"


def _audit_arguments(pages: Pages, row: dict[str, Any]) -> str:
    arguments = row.get("arguments") or {}
    if not arguments:
        return "-"
    return f"<bdi><code>{visible(json.dumps(arguments, ensure_ascii=False, default=str))}</code></bdi>"


AUDIT_COLUMNS = [("Id", _text("audit_id")), ("At (UTC)", _field("acted_at")), ("Principal", _isolated("principal")),
                 ("From", _isolated("client")), ("Source", _text("source")), ("Action", _text("action")),
                 ("Target", _audit_target), ("Arguments", _audit_arguments),
                 ("Outcome", lambda m, r: f'<span class="audit-{escape(r["outcome"])}">{escape(r["outcome"])}</span>'),
                 ("Detail", _isolated("detail"))]


def status_text(row: dict[str, Any]) -> str:
    """The status now, in words (HTML, escaped)."""
    status = row["status"]
    flight = row["runs_in_flight"]
    more = f" ({flight} runs in flight)" if flight > 1 else ""
    if status == "running":
        worker = f" on {escape(row['status_worker'])}" if row["status_worker"] else ""
        text = f"running since {when(row['status_since'])}{worker}"
    elif status == "queued":
        text = f"queued since its slot {when(row['status_since'])}"
    elif status == "retrying":
        text = f"retrying at {when(row['retry_at'])}"
    elif status == "waiting":
        text = f"waiting since its slot {when(row['status_since'])}"
    elif status == "due":
        text = f"claimed for its slot {when(row['status_since'])}"
    else:
        text = "idle"
    return f'<span class="now-{escape(status)}">{text}</span>{more}'


def _pause_text(row: dict[str, Any]) -> str:
    """A paused job's pause under its state: until when (or until resumed), since when, by whom, why."""
    if not row.get("paused"):
        return ""
    until = f"until {when(row['paused_until'])}" if row.get("paused_until") else "until resumed"
    by = f" by {escape(row['paused_by'])}" if row.get("paused_by") else ""
    reason = f": {escape(row['pause_reason'])}" if row.get("pause_reason") else ""
    return f'<div class="pause">{until}; since {when(row["paused_at"])}{by}{reason}</div>'


def _next_slot(row: dict[str, Any]) -> str:
    if row.get("next_due_at") is None:
        return "-"
    if row.get("paused"):
        # A paused job runs no slot (each one the pause holds is recorded skipped); the slots
        # after the pause run at their time.
        return f'<span class="pause">none while paused</span> (next: {when(row["next_due_at"])} UTC)'

    local = row.get("next_due_local")
    shown = f'{when(row["next_due_at"])} UTC'
    if local and row.get("timezone") not in (None, "UTC"):
        shown += f'<div class="local">{escape(local[:19].replace("T", " "))} {escape(row["timezone"])}</div>'
    return shown


def _duration(delta: timedelta) -> str:
    seconds = max(delta.total_seconds(), 0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def _alert_watches(pages: Pages, row: dict[str, Any]) -> str:
    if row.get("errors"):
        return f"errors <bdi><code>{visible(row['errors'])}</code></bdi>"
    return (f"<bdi><code>{visible(row.get('probe_query'))}</code></bdi> at <bdi>{visible(row.get('schedule'))}</bdi> "
            f"({escape(row.get('timezone') or 'UTC')})")


def _alert_response(pages: Pages, row: dict[str, Any]) -> str:
    parts = ["notify"] if row.get("notify") else []
    if row.get("response_job"):
        parts.append(f'start <bdi><a href="{pages.link("/jobs/" + quote(str(row["response_job"]), safe=""))}">'
                     f'{visible(row["response_job"])}</a></bdi>')
    return ", ".join(parts) or "-"


def _firing_said(pages: Pages, row: dict[str, Any]) -> str:
    body = row.get("detail") or {}
    if row.get("kind") == "condition":
        text = f"{body.get('row_count', 0)} row(s)" + (f" ({body['rows_cut']})" if body.get("rows_cut") else "")
    elif row.get("kind") == "errors":
        text = f"{body.get('failure_count', 0)} failure(s) matching {body.get('condition')}"
    else:
        text = f"probe failed: {body.get('error')}"
    return f"<bdi>{visible(text)}</bdi>"


ALERT_COLUMNS = [("Alert", _isolated("alert_name")), ("Defined in", _text("source")), ("Owner", _isolated("owner")),
                 ("Watches", _alert_watches), ("Delay (s)", _text("delay_seconds")), ("Response", _alert_response),
                 ("State", lambda m, r: f'<span class="alert-{escape(r["state"])}">{escape(r["state"])}</span>'),
                 ("Next check (UTC)", _field("next_check_at")), ("Last response (UTC)", _field("last_response_at")),
                 ("Seen / answered", lambda m, r: f'{escape(r["occurrences"])} / {escape(r["responses"])}'),
                 ("Problem", lambda m, r: f"<bdi>{visible(r.get('config_error') or r.get('last_error'))}</bdi>"
                  if (r.get("config_error") or r.get("last_error")) else "-")]

FIRING_COLUMNS = [("Firing", _text("firing_id")), ("Alert", _isolated("alert_name")), ("At (UTC)", _field("raised_at")),
                  ("Kind", _text("kind")), ("Said", _firing_said),
                  ("Response run", lambda m, r: m.run_link(r["response_run_id"]) if r.get("response_run_id")
                   else (f"<bdi>{visible(r['response_error'])}</bdi>" if r.get("response_error") else "-"))]
