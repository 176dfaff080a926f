"""What the commands print: tables for people, one JSON document under --json, errors as one line
(or one JSON object) naming what was wrong, log records as text or JSON."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from shared.engine.views import target_label, to_json
from shared.jobs.run_model import RunStatus

UTC = timezone.utc
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141


class ErrorStyle:
    """How errors print: one JSON object per error when --json is anywhere on the line (main
    decides it once, before parsing, so a usage error prints the way the caller asked)."""

    json = False


def configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if args.json:       # stderr stays machine-readable: one JSON object per log record
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in ("run", "work") else logging.WARNING,
                        handlers=[handler])


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(), "level": record.levelname,
                    "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


def known_fields(exc: BaseException) -> dict[str, Any]:
    """setting, value and expected of an error that carries them (UsageError(..., setting=...))."""
    return {name: getattr(exc, name) for name in ("setting", "value", "expected")
            if getattr(exc, name, None) is not None}


def print_error(message: str, kind: str, **details: Any) -> None:
    """An error: `error: MESSAGE` on stderr, or under --json one JSON object on one line of
    stderr: {"error": MESSAGE, "kind": usage|config|not_found|failure|interrupted, and the
    setting, value and expected when known}."""
    if not ErrorStyle.json:
        print(message if kind == "interrupted" else f"error: {message}", file=sys.stderr)
        return
    document = {"error": message, "kind": kind}
    document.update(details)
    print(json.dumps(document, ensure_ascii=False, default=str), file=sys.stderr, flush=True)


def warn(args: argparse.Namespace, warnings: list[str], message: str) -> None:
    """A warning: a `warning: ...` line on stderr, or under --json kept for the document."""
    if args.json:
        warnings.append(message)
    else:
        print(f"warning: {message}", file=sys.stderr)


def last_targets(row: dict[str, Any]) -> str:
    """The fleet of a job's last run: "T, F failed" ("-" when it had no targets)."""
    total = row.get("last_targets_total")
    if not total:
        return "-"
    return f"{total}, {row.get('last_targets_failed') or 0} failed"


def print_fleets(runs: list[dict[str, Any]]) -> None:
    """history: under each fleet run, its executions grouped by target (a target's name on its
    first execution only), each with its step, status, attempts and last error."""

    for run in runs:
        executions = run.get("targets") or []
        if not executions:
            continue
        counts = ", ".join(f"{n} {status}" for status, n in run["target_statuses"].items())
        print(f"\nrun {run['run_id']} ({run['job_name'] or 'task'}) {run['status']}: "
              f"{run['targets_total']} target(s), {run['targets_failed'] or 0} failed ({counts})")
        table, previous = [], None
        for execution in executions:
            label = target_label(execution)
            table.append(["  " + (label if label != previous else ""), execution["step"] or "-", execution["run_id"],
                          execution["status"], f"{execution['attempts']}/{execution['max_attempts']}",
                          time_text(execution["finished_at"]), (execution["last_error"] or "")[:200]])
            previous = label
        print_table(["  TARGET", "STEP", "EXECUTION", "STATUS", "ATTEMPTS", "FINISHED", "ERROR"], table)


def print_attempt_output(runs: list[dict[str, Any]], by_run: dict[int, list[dict[str, Any]]]) -> None:
    """history --output: every attempt (of every step) with its outcome and what the server said."""
    for run in runs:
        failed = f", failed at step {run['failed_step']}" if run.get("failed_step") and run["status"] == RunStatus.FAILED else ""
        print(f"\nrun {run['run_id']} ({run['job_name'] or 'task'}) {run['status']}{failed}")
        for attempt in by_run.get(run["run_id"], []):
            step = f"step {attempt['step']} " if attempt.get("step") else ""
            where = f" in {attempt['target_database']}" if attempt.get("target_database") else ""
            error = f": {attempt['error_message']}" if attempt.get("error_message") else ""
            print(f"  attempt {attempt['attempt']} {step}{attempt['outcome']}{where} "
                  f"({time_text(attempt['started_at'])} - {time_text(attempt['finished_at'])}){error}")
            for line in (attempt.get("output") or "").splitlines():
                print(f"    | {line}")


def dispatched_text(dispatched: int | None) -> str:
    return "; the local runner starts it" if dispatched is None else f"; {dispatched} run(s) dispatched"


def time_text(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def print_json(value: Any) -> None:

    print(to_json(value))


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
