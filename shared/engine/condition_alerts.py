"""Condition alerts (issue 32 item 3), as SQL Server Agent's ``sp_add_alert``.

An alert is one of:

* a **probe** (``ALERT__<name>__QUERY`` with ``ALERT__<name>__SCHEDULE``, a job's schedule
  syntax): a query run at each slot of its schedule, whose rows are the alert — no row, no
  alert. At most ``MAX_PAYLOAD_ROWS`` rows and ``MAX_PAYLOAD_BYTES`` of them are carried in the
  notification, which says when they were cut. The probe is one query (``SELECT`` or ``WITH``
  on PostgreSQL and SQLite; on SQL Server a ``SELECT`` that can stand as a derived table), run
  as a derived table of the agent's own ``SELECT`` with a row limit, within its
  ``TIMEOUT_SECONDS``, in a transaction that is always rolled back: a probe that writes leaves
  nothing, one that commits is refused, one that runs forever is cancelled. A probe defined
  with ``agent.add_alert`` runs with its owner's rights (the caller, as for owned jobs:
  docs/tsql.md); one from the settings with the agent's (``AGENT_JOB_PRINCIPAL`` when set), as
  settings jobs do. A probe that fails is an alert error: recorded on the alert, a warning of
  the tick, notified once when it starts failing (kind ``alert_error``) — never a failure of
  the tick or of another alert.
* an **error watch** (``ALERT__<name>__ERRORS``): error numbers, SQLSTATEs and severities
  (``50000,1205,sqlstate=40P01,severity>=16``) seen in any attempt that failed since the last
  check. The attempts are read once per tick for every such alert (one indexed range read, at
  most ``MAX_FAILURES_READ``; the rest wait for the next tick), matched here.

Each answers at most once per ``DELAY_BETWEEN_RESPONSES_SECONDS`` (0: every check that finds
the condition) with a notification through the outbox (kind ``condition`` or ``errors``; the
body is docs/schemas/notification.schema.json's alert form), a run of ``RESPONSE_JOB`` (run-now
semantics, audited as started by the alert), or both. An occurrence inside the delay is
counted (``occurrences``), not answered, as SQL Server Agent does.

The tick's cost: one statement when there is nothing to check (``select_alert_work``), then a
claim, one read of the failures, one statement recording every result and, when something
fired, one writing the firings and their notifications — whatever the number of alerts — plus
each probe's own query (a probe is work its definer asked for, as a job run is), and one run-now
per response job. Ticks racing each other claim each check once (the claim compares the next
check it read).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Mapping

from shared.control.sqlerrors import describe
from shared.jobs.alert_definitions import (  # noqa: F401 - re-exported: the engine's one place for alerts
    ALERT_SETTING_PREFIX, CONDITION_KINDS, DEFAULT_DELAY_SECONDS, DEFAULT_TIMEOUT_SECONDS, AlertDefinition,
    MAX_FAILURES_CARRIED, MAX_FAILURES_READ, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_ROWS, MAX_ROW_CHARS, InvalidAlert,
    check_definition, parse_errors)
from shared.jobs.schedules import parse_schedule

log = logging.getLogger(__name__)
UTC = timezone.utc
# ERRORS alerts read the failures stamped up to this long before the tick: a failure's time is
# taken before its transaction commits (see check_condition_alerts).
FAILURE_SETTLE_SECONDS = 30
# All the probes of one tick run within this long: each gets what is left of it (at most its own
# TIMEOUT_SECONDS); one that finds nothing left is an alert error for that check, not a tick that
# runs for as long as its probes like.
PROBE_BUDGET_SECONDS = 120

def settings_rows(settings: Any) -> list[dict[str, Any]]:
    """The settings' alerts as sync_settings_alerts takes them (invalid ones with their reason)."""
    rows = []
    for alert in getattr(settings, "alerts", ()):
        rows.append({"alert_name": alert.name, "probe_query": alert.query, "schedule": alert.schedule,
                     "timezone": alert.timezone, "errors": alert.errors, "timeout_seconds": alert.timeout_seconds,
                     "delay_seconds": alert.delay_seconds, "notify": int(alert.notify),
                     "notify_webhook_url": alert.notify_webhook_url, "response_job": alert.response_job,
                     "enabled": int(alert.enabled), "valid": None, "config_error": None})
    for bad in getattr(settings, "invalid_alerts", ()):
        rows.append({"alert_name": bad.key, "probe_query": None, "schedule": None, "timezone": "UTC", "errors": None,
                     "timeout_seconds": DEFAULT_TIMEOUT_SECONDS, "delay_seconds": DEFAULT_DELAY_SECONDS, "notify": 1,
                     "notify_webhook_url": None, "response_job": None, "enabled": 1, "valid": 0,
                     "config_error": bad.message[:4000]})
    return rows


# ------------------------------------------------------------------ probes


@dataclass
class ProbeResult:
    rows: list[Any] = field(default_factory=list)
    cut: str | None = None
    error: str | None = None


class _Rollback(Exception):
    """Ends a probe's transaction: whatever it did is rolled back."""


def _one_query(text: str) -> str:
    query = text.strip()
    while query.endswith(";"):
        query = query[:-1].rstrip()
    return query


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return float(value) if value == value.to_integral_value() or abs(value) < 1e15 else str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value)[:64].hex() + ("..." if len(bytes(value)) > 64 else "")
    return str(value)


def run_probe(store: Any, alert: Mapping[str, Any], job_principal: str | None) -> ProbeResult:
    """Run one alert's probe on ``store`` (a store of its own: an owned probe's connection is
    closed after it) and return its rows (at most MAX_PAYLOAD_ROWS + 1 read) or its error. Never
    raises for the probe's own failure."""
    query = _one_query(alert["probe_query"] or "")
    limit = MAX_PAYLOAD_ROWS + 1
    timeout = int(alert.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
    owner = alert.get("owner") if alert.get("source") == "database" else None
    dialect = store.target.dialect
    result = ProbeResult()
    started = time.monotonic()
    try:
        with store.transaction():
            if dialect == "sqlite":
                result.rows = _sqlite_probe(store, query, limit, timeout)
            elif dialect == "postgres":
                if not (owner or job_principal):
                    # Run as the agent itself: the transaction is read-only from its first statement,
                    # so a write is refused, not merely rolled back. (An owned probe runs inside a
                    # function made for it, which needs a writable transaction; it is rolled back.)
                    store.execute("probe_read_only")
                store.execute("set_probe_timeout", timeout_ms=str(timeout * 1000))
                wrapped = ("SELECT pg_catalog.set_config('agent.probe_rows', (SELECT COALESCE(CAST(pg_catalog.json_agg("
                           f"pg_catalog.left(CAST(pg_catalog.row_to_json(p) AS text), {MAX_ROW_CHARS + 1})) AS text), '[]') "
                           f"FROM (SELECT * FROM (\n{query}\n) AS q LIMIT {limit}) AS p), true);")
                store.run_script(wrapped, owner=owner)
                text = store.execute("probe_rows").scalar() or "[]"
                result.rows = [_row_from_text(item) for item in json.loads(text)]
            else:
                store.execute("prepare_probe")
                wrapped = (f"INSERT INTO #agent_probe (rows_json) SELECT (SELECT TOP ({limit}) * FROM (\n{query}\n) AS p "
                           "FOR JSON PATH, INCLUDE_NULL_VALUES);")
                connection = store.connection
                previous = getattr(connection, "timeout", 0)
                connection.timeout = timeout
                try:
                    store.run_script(wrapped, owner=owner)
                finally:
                    with contextlib.suppress(Exception):
                        connection.timeout = previous
                text = store.execute("probe_rows").scalar() or "[]"
                result.rows = [_cut_row(row) for row in json.loads(text)]
            raise _Rollback()
    except _Rollback:
        pass
    except Exception as exc:  # noqa: BLE001 - the probe's failure is the alert's, never the tick's
        message = describe(exc)
        if time.monotonic() - started >= timeout - 0.5 or "statement timeout" in message or "interrupted" in message:
            message = f"the probe ran past its TIMEOUT_SECONDS={timeout} and was cancelled ({message})"
        result.error = message[:2000]
        return result
    if len(result.rows) > MAX_PAYLOAD_ROWS:
        result.rows = result.rows[:MAX_PAYLOAD_ROWS]
        result.cut = f"more than {MAX_PAYLOAD_ROWS} rows: the first {MAX_PAYLOAD_ROWS} are carried"
    return result


def _row_from_text(text: Any) -> Any:
    if isinstance(text, str) and len(text) > MAX_ROW_CHARS:
        return {"_cut": f"a row of more than {MAX_ROW_CHARS} characters of JSON", "_start": text[:MAX_ROW_CHARS]}
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _cut_row(row: Any) -> Any:
    text = json.dumps(row, default=str)
    if len(text) > MAX_ROW_CHARS:
        return {"_cut": f"a row of more than {MAX_ROW_CHARS} characters of JSON", "_start": text[:MAX_ROW_CHARS]}
    return row


def _sqlite_probe(store: Any, query: str, limit: int, timeout: int) -> list[Any]:
    connection = store.connection
    deadline = time.monotonic() + timeout

    def past_deadline() -> int:
        return 1 if time.monotonic() > deadline else 0

    connection.set_progress_handler(past_deadline, 10_000)
    connection.execute("PRAGMA query_only = ON")        # a write is refused, not merely rolled back
    cursor = connection.cursor()
    try:
        try:
            cursor.execute(f"SELECT * FROM (\n{query}\n) LIMIT {limit}")
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise sqlite3.OperationalError(f"interrupted: the probe ran past its TIMEOUT_SECONDS={timeout}") from None
            raise
        names = [d[0] for d in cursor.description or ()]
        rows = []
        for values in cursor.fetchmany(limit):
            rows.append(_cut_row({name: _jsonable(value) for name, value in zip(names, values)}))
        return rows
    finally:
        connection.set_progress_handler(None, 0)
        connection.execute("PRAGMA query_only = OFF")
        cursor.close()


# ------------------------------------------------------------------ the tick's step


@dataclass
class ConditionReport:
    checked: list[str] = field(default_factory=list)
    firings: list[dict[str, Any]] = field(default_factory=list)
    probe_errors: list[str] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _iso(value: Any) -> str | None:
    value = _time(value)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def _payload_bytes(payload: dict[str, Any]) -> int:
    return len(json.dumps(payload, default=str).encode("utf-8"))


def _bounded(payload: dict[str, Any], key: str, cut_key: str) -> dict[str, Any]:
    """Drop trailing items of payload[key] until the whole is within MAX_PAYLOAD_BYTES."""
    items = payload[key]
    if _payload_bytes(payload) <= MAX_PAYLOAD_BYTES:
        return payload
    low, high = 0, len(items)
    while low < high:                  # the most items that fit
        middle = (low + high + 1) // 2
        if _payload_bytes({**payload, key: items[:middle]}) <= MAX_PAYLOAD_BYTES - 200:
            low = middle
        else:
            high = middle - 1
    kept = items[:low]
    reason = f"more than {MAX_PAYLOAD_BYTES} bytes: the first {low} of {len(items)} are carried"
    previous = payload.get(cut_key)
    return {**payload, key: kept, cut_key: f"{previous}; {reason}" if previous else reason}


def check_condition_alerts(store: Any, new_probe_store: Callable[[], Any], now: datetime, *,
                           default_url: str | None, job_principal: str | None,
                           start_job: Callable[[str, str, int], dict[str, Any]]) -> ConditionReport:
    """The tick's step (module docstring). ``start_job(job_name, alert_name, firing_id)`` makes
    a response's run (run-now semantics, audited) and returns {run_id, status} or raises."""
    report = ConditionReport()
    work = store.execute("select_alert_work", now=now).rows
    if not work:
        return report
    checks, due = [], {}
    for alert in work:
        name = alert["alert_name"]
        if alert["valid"] is None:
            problem, first = check_definition(alert, now)
            checks.append({"alert_name": name, "seen_check_at": store.json_time(_time(alert["next_check_at"])),
                           "updated_at": store.json_time(_time(alert["updated_at"])),
                           "next_check_at": store.json_time(first), "valid": 0 if problem else 1,
                           "config_error": problem})
            if problem:
                report.invalid.append((name, problem))
            continue
        if alert["errors"]:
            following = now
        else:
            try:
                following = parse_schedule(alert["schedule"], alert["timezone"]).next_after(now)
            except (ValueError, OverflowError):
                following = None
            if alert["next_check_at"] is None:
                # Its definition changed since it was checked: the first check is its next slot.
                checks.append({"alert_name": name, "seen_check_at": None,
                               "updated_at": store.json_time(_time(alert["updated_at"])),
                               "next_check_at": store.json_time(following), "valid": 1, "config_error": None})
                continue
        checks.append({"alert_name": name, "seen_check_at": store.json_time(_time(alert["next_check_at"])),
                       "updated_at": store.json_time(_time(alert["updated_at"])),
                       "next_check_at": store.json_time(following), "valid": 1, "config_error": None})
        due[name] = alert
    claimed = {row["alert_name"]: row for row in store.execute("claim_alert_checks", checks=checks, now=now).rows}
    due = {name: alert for name, alert in due.items() if name in claimed}
    if not due:
        return report
    results: dict[str, dict[str, Any]] = {}
    payloads: dict[str, dict[str, Any]] = {}
    # ERRORS alerts: one read of the failures since the earliest watermark.
    watching = {name: alert for name, alert in due.items() if alert["errors"]}
    if watching:
        marks = {name: _time(claimed[name]["checked_until"]) or now for name in watching}
        since = min(marks.values())
        # Up to a little before now: a failure is stamped with its worker's time before its
        # transaction commits, so one stamped just before now may not be visible yet.
        horizon = now - timedelta(seconds=FAILURE_SETTLE_SECONDS)
        failures = store.execute("alert_failures", since=since, now=horizon, limit=MAX_FAILURES_READ).rows
        until = horizon
        if len(failures) >= MAX_FAILURES_READ:
            until = _time(failures[-1]["finished_at"]) or horizon
        for name, alert in watching.items():
            spec = parse_errors(name, alert["errors"])
            mark = marks[name]
            seen = [f for f in failures if (_time(f["finished_at"]) or now) > mark
                    and (_time(f["finished_at"]) or now) <= until and spec.matches(f)
                    and str(f.get("started_by_alert") or "").casefold() != name.casefold()]
            results[name] = {"alert_name": name, "triggered": int(bool(seen)), "error": None,
                             "checked_until": store.json_time(max(until, mark)), "next_response_at": None}
            if seen:
                carried = [{"run_id": f["run_id"], "job": f["job_name"], "finished_at": _iso(f["finished_at"]),
                            "outcome": f["outcome"], "error_number": f["error_number"],
                            "sqlstate": f["error_sqlstate"], "error": f["error_message"]}
                           for f in seen[:MAX_FAILURES_CARRIED]]
                payload = {"failures": carried, "failure_count": len(seen),
                           "failures_cut": (f"{len(seen)} failures: the first {MAX_FAILURES_CARRIED} are carried"
                                            if len(seen) > MAX_FAILURES_CARRIED else None)}
                if until < horizon:
                    note = f"more than {MAX_FAILURES_READ} failures since the last check: the rest at the next tick"
                    payload["failures_cut"] = f"{payload['failures_cut']}; {note}" if payload["failures_cut"] else note
                payloads[name] = _bounded(payload, "failures", "failures_cut")
    # Probes: each its own query, as its owner.
    probes = [alert for alert in due.values() if not alert["errors"]]
    if probes:
        probe_store = new_probe_store()
        budget_ends = time.monotonic() + PROBE_BUDGET_SECONDS
        try:
            for alert in probes:
                name = alert["alert_name"]
                left = int(budget_ends - time.monotonic())
                if left < 1:
                    outcome = ProbeResult(error=f"not run at this check: the probes before it in this tick used the "
                                                f"tick's {PROBE_BUDGET_SECONDS} s for probes (a probe that runs long "
                                                "delays the others: lower its TIMEOUT_SECONDS)")
                else:
                    bounded = {**alert, "timeout_seconds": min(int(alert["timeout_seconds"] or DEFAULT_TIMEOUT_SECONDS), left)}
                    outcome = run_probe(probe_store, bounded, job_principal)
                # An owned probe's connection is closed after its transaction; the next probe
                # (another owner, or the agent) starts on a connection of its own.
                probe_store.close()
                if outcome.error:
                    report.probe_errors.append(f"alert {name}: its probe failed: {outcome.error}")
                results[name] = {"alert_name": name, "triggered": int(bool(outcome.rows)) if not outcome.error else 0,
                                 "error": outcome.error, "checked_until": None, "next_response_at": None}
                if outcome.rows:
                    payloads[name] = _bounded({"rows": outcome.rows, "row_count": len(outcome.rows),
                                               "rows_cut": outcome.cut}, "rows", "rows_cut")
                elif outcome.error:
                    payloads[name] = {"error": outcome.error}
        finally:
            probe_store.close()
    report.checked = sorted(results)
    for name, result in results.items():
        delay = int(due[name]["delay_seconds"] or 0)
        try:
            result["next_response_at"] = store.json_time(now + timedelta(seconds=delay))
        except OverflowError:
            result["next_response_at"] = store.json_time(datetime(9999, 1, 1, tzinfo=UTC))
    recorded = store.execute("record_alert_results", results=list(results.values()), now=now).rows
    firings = []
    for row in recorded:
        name = row["alert_name"]
        alert = due.get(name) or next((a for n, a in due.items() if n.casefold() == str(name).casefold()), None)
        if alert is None:
            continue
        url = alert["notify_webhook_url"] or default_url
        base = {"alert": alert["alert_name"], "raised_at": _iso(now), "source": alert["source"],
                "owner": alert["owner"], "response_job": alert["response_job"],
                "delay_between_responses_seconds": int(alert["delay_seconds"] or 0)}
        if int(row["fired"] or 0):
            kind = "errors" if alert["errors"] else "condition"
            body = {**base, "kind": kind, "condition": alert["errors"] if alert["errors"] else None,
                    **payloads.get(name, {})}
            firings.append({"alert_name": alert["alert_name"], "kind": kind, "detail": json.dumps(body, default=str),
                            "url": url, "notify": int(bool(alert["notify"])), "_alert": alert, "_body": body})
        elif int(row["failing"] or 0):
            body = {**base, "kind": "alert_error", "error": results[name]["error"]}
            firings.append({"alert_name": alert["alert_name"], "kind": "alert_error",
                            "detail": json.dumps(body, default=str), "url": url,
                            "notify": int(bool(alert["notify"])), "_alert": alert, "_body": body})
    if not firings:
        return report
    written = store.execute("insert_alert_firings", now=now, firings=[
        {key: value for key, value in firing.items() if not key.startswith("_")} for firing in firings]).rows
    ids = {(row["alert_name"].casefold(), row["kind"]): row["firing_id"] for row in written}
    for firing in firings:
        alert = firing["_alert"]
        firing_id = ids.get((firing["alert_name"].casefold(), firing["kind"]))
        entry = {"firing_id": firing_id, "alert_name": firing["alert_name"], "kind": firing["kind"],
                 "body": firing["_body"], "response_run_id": None, "response_error": None}
        if firing["kind"] != "alert_error" and alert["response_job"] and firing_id is not None:
            try:
                run = start_job(alert["response_job"], alert["alert_name"], firing_id)
                entry["response_run_id"] = run["run_id"]
                if run.get("status") == "skipped":
                    entry["response_error"] = run.get("note") or "skipped"
            except Exception as exc:  # noqa: BLE001 - the response's failure is recorded, not raised
                entry["response_error"] = describe(exc)[:2000]
            store.execute("set_alert_response", firing_id=firing_id, run_id=entry["response_run_id"],
                          response_error=entry["response_error"])
            report.responses.append(entry)
        report.firings.append(entry)
    return report


def condition_alert_text(row: Mapping[str, Any]) -> str:
    """What an alert watches, in a few words."""
    if row.get("errors"):
        return f"errors {row['errors']}"
    query = " ".join(str(row.get("probe_query") or "").split())
    return f"probe {query[:60]}{'...' if len(query) > 60 else ''} ({row.get('schedule')}, {row.get('timezone')})"
