"""What the commands print: tables for people, one JSON document under --json, errors as one line
(or one JSON object) naming what was wrong, log records as text or JSON."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import traceback
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


def configure_logging(args: argparse.Namespace, *, process: bool = False) -> None:
    """Every line a command writes to stderr besides its own messages is a log record in the
    documented format (docs/operations.md, "Log records"): one line of text, or under --json one
    JSON object, whoever wrote it: the agent, a library (http.server, the Azure SDK), Python's
    warnings and, when ``process`` (the command is the program: not a test calling main()), an
    error no code caught in a thread, in the command or while the interpreter cleans up (never a
    raw traceback)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter() if args.json else TextLogFormatter())
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in ("run", "work") else logging.WARNING,
                        handlers=[handler])
    if not process:
        return
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = lambda hook: _log_uncaught(hook.exc_type, hook.exc_value, hook.exc_traceback,
                                                      f"thread {hook.thread.name if hook.thread else '?'}")
    sys.unraisablehook = lambda hook: logging.getLogger("sql-agent").warning(
        "%s: %s", hook.err_msg or "exception ignored", hook.object,
        exc_info=(hook.exc_type, hook.exc_value, hook.exc_traceback) if hook.exc_value else None)


def _log_uncaught(exc_type, exc_value, exc_traceback, where: str = "the command") -> None:
    logger = logging.getLogger("sql-agent")
    if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
        logger.warning("%s: interrupted", where)
        return
    if exc_type is not None and issubclass(exc_type, SystemExit):
        return
    logger.critical("%s ended by an unexpected error", where, exc_info=(exc_type, exc_value, exc_traceback))


# C0 and C1 control characters (a line break, an escape sequence for the terminal) as \xNN: a
# text log record stays on one line, and text the agent did not write cannot act on a terminal.
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


class TextLogFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER: MESSAGE` on one line; an exception adds `[TYPE: TEXT at FILE:LINE]`
    (where it was raised) to the same line, its traceback being --json's."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.formatTime(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            line += f" [{exception_summary(record.exc_info[1])}]"
        return line.translate(_CONTROL)


def exception_summary(exc: BaseException) -> str:
    """An exception in one line: its type, its text and where it was raised."""
    summary = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if frames:
        last = frames[-1]
        summary += f" at {last.filename}:{last.lineno} in {last.name}"
    return summary


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record, on one line: time, level, logger, message, and the traceback
    as `exception` when there is one."""

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
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="seconds")
    return "-" if value is None else str(value)


def print_json(value: Any) -> None:

    print(to_json(value))


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
