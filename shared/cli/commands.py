"""Operator commands and the local runner: the `sql-agent` command. A command parses its
arguments, calls one operator action (shared.engine.operations) or view (shared.engine.views), and prints; it
runs no statement of its own (tests/test_layers.py).

    sql-agent [--db DB] [--settings FILE] [--json] COMMAND ...
    python -m shared.cli ...          (the same, from a clone)

Exit codes: 0 success, 1 runtime failure or a finding (doctor's failed check, a tick's errors,
jobs import-sqlagent could not carry over), 2 usage or configuration error (a bad argument or
setting, a job, run or poison message that does not exist), 130 interrupted (Ctrl-C) before the
command finished, 141 stdout closed by its reader (`| head`). Errors are one line on stderr, without a traceback; with --json, every command
prints one JSON document on stdout and an error is one JSON object on stderr:
{"error": ..., "kind": ..., "setting": ..., "value": ..., "expected": ...} (the last three when known).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import re
import signal
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from shared import __version__
from shared.engine.fleet import resolve_fleet
from shared.engine.operations import (
    add_scheduled_jobs,
    apply_grant_scripts,
    apply_operator_grant,
    cancel,
    pause_job,
    requeue,
    resume_job,
    run_now,
    stop,
    submit,
)
from shared.engine.runner import LocalRunner
from shared.engine.views import after_words, history_view, jobs_view, poison_view, stuck_view, target_label, to_json
from shared.errors import AgentError, ConfigError, NotFoundError, UsageError
from shared.jobs.run_model import RunStatus
from shared.ops.doctor import run_doctor
from shared.ops.fleet import job_fleet
from shared.ops.grants import (
    OPERATOR_WARNING,
    fleet_grant_scripts,
    fleet_postgres_scripts,
    grant_scripts,
    name_problem,
    operator_sql,
    render,
    render_fleet,
)
from shared.ops.sqlagent_import import ScriptError, apply_calls, convert_script, report
from shared.settings import merged_environment
from shared.web.app import monitor_settings
from shared.web.local_server import make_server

UTC = timezone.utc
PROG = "sql-agent"
DISTRIBUTION = "sql-agent-azure"     # pyproject.toml's project name
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141
# Operator commands (doctor, jobs, history, ...) wait at most this long for a connection; the
# commands that run the agent or install it wait the whole AGENT_CONNECT_RETRY_SECONDS.
COMMAND_CONNECT_RETRY_SECONDS = 10
WAITING_COMMANDS = ("run", "work", "tick", "init-db")
COMPLETION_SHELLS = ("bash", "zsh", "tcsh")


def version() -> str:
    """The installed distribution's version when this very code is the installed one, else the
    constant in shared/__init__.py (a clone; pyproject.toml reads the same constant)."""


    try:
        from importlib import metadata

        dist = metadata.distribution(DISTRIBUTION)
        installed = Path(str(dist.locate_file("shared/__init__.py"))).resolve()
        if installed == Path(__file__).parent.parent.joinpath("__init__.py").resolve():
            return dist.version
    except Exception:      # not installed, or installed metadata without files
        pass
    return __version__


class _ArgumentValueError(argparse.ArgumentTypeError):
    """A bad argument value, with what was given and what is expected (for --json errors)."""

    def __init__(self, value: str, expected: str, message: str) -> None:
        super().__init__(message)
        self.value = value
        self.expected = expected


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors become one JSON object on stderr under --json (exit 2)."""

    json_errors = False

    def error(self, message: str):  # type: ignore[override]
        if not Parser.json_errors:
            super().error(message)
        details: dict[str, Any] = {}
        current = sys.exc_info()[1]
        if isinstance(current, argparse.ArgumentError):
            details["setting"] = current.argument_name
            cause = current.__context__
            if isinstance(cause, _ArgumentValueError):
                details.update(value=cause.value, expected=cause.expected)
        else:
            required = re.match(r"the following arguments are required: (.*)", message)
            if required:
                details["setting"] = required.group(1)
        invalid = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if invalid:
            details.update(value=invalid.group(1), expected=f"one of {invalid.group(2)}")
        _print_error(message, "usage", **details)
        self.exit(EXIT_USAGE)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        if Parser.json_errors:       # --json anywhere on the line
            _print_json({"name": DISTRIBUTION, "version": version(), "python": "%d.%d.%d" % sys.version_info[:3]})
        else:
            print(f"{PROG} {version()} (Python {'%d.%d.%d' % sys.version_info[:3]})")
        parser.exit(EXIT_OK)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="SQL Agent for Azure SQL: operator commands "
                                           "(also: python -m shared.cli from a clone).")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    parser.add_argument("--db", help="control database: sqlite:///PATH or an ODBC connection string (default: AGENT_DB)")
    parser.add_argument("--settings", metavar="FILE", help="a local.settings.json whose Values are used as app settings")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--json", action="store_true", default=False,
                        help="one JSON document on stdout; an error is one JSON object on stderr (also after COMMAND)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    commands.add_parser("init-db", help="create or upgrade the control schema (idempotent) and the queue")

    tick = commands.add_parser("tick", help="one scheduler tick: expire leases, claim due runs, dispatch")
    tick.add_argument("--now", type=_iso_datetime,
                      help="ISO-8601 time to tick at (default: the database's clock); refused when further from "
                           "the database's clock than AGENT_MAX_CLOCK_SKEW_SECONDS")

    work = commands.add_parser("work", help="execute what is runnable now (from the runs table, or from the storage "
                                            "queue as the queue trigger would), then stop")
    mode = work.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one run (or message) on each of --concurrency workers")
    mode.add_argument("--until-idle", action="store_true", help="until nothing is runnable now")
    work.add_argument("--concurrency", type=_positive_int, help="workers in parallel (default AGENT_MAX_CONCURRENCY)")
    work.add_argument("--visibility-timeout", type=_non_negative_float, metavar="SECONDS",
                      help="redelivery delay after a failure (default: host.json visibilityTimeout)")
    work.add_argument("--max-seconds", type=_non_negative_float, help="with --until-idle: stop after this long")

    run = commands.add_parser("run", help="run the agent locally: tick on schedule and work the queue (Ctrl-C stops)")
    run.add_argument("--concurrency", type=_positive_int, help="worker threads (default AGENT_MAX_CONCURRENCY)")

    commands.add_parser("jobs", help="the jobs as the agent last synced them: state, next slot and last run")

    history = commands.add_parser("history", help="runs, newest first, with attempts and job events")
    history.add_argument("--job", help="only this job")
    history.add_argument("--limit", type=_positive_int, default=50)
    history.add_argument("--output", action="store_true",
                         help="each attempt (each step's) with what the server said: messages and rows affected")

    stuck = commands.add_parser("stuck", help="reconciliation: runs past their lease or waiting too long")
    stuck.add_argument("--older-than", type=_positive_int, default=600, metavar="SECONDS",
                       help="pending runs runnable for longer than this count as stuck (default 600)")
    stuck.add_argument("--limit", type=_positive_int, default=500, help="at most this many runs (default 500)")

    poison = commands.add_parser("poison", help="poison messages")
    poison_commands = poison.add_subparsers(dest="poison_command", metavar="ACTION", required=True)
    poison_list = poison_commands.add_parser("list", help="poison messages, newest first")
    poison_list.add_argument("--limit", type=_positive_int, default=50)
    requeue = poison_commands.add_parser("requeue", help="give the poisoned run one more attempt")
    requeue.add_argument("poison_id", type=_positive_int, metavar="ID")

    run_now = commands.add_parser("run-now", help="run a job now, as the agent last synced it (its overlap policy applies)")
    run_now.add_argument("name")

    pause = commands.add_parser("pause", help="pause a job: it claims no slot (each slot that comes is recorded "
                                              "skipped 'paused') until resumed or --until; its runs in flight finish")
    pause.add_argument("name", metavar="JOB")
    pause.add_argument("--until", type=_iso_datetime, metavar="TIME",
                       help="the pause ends by itself at this time (ISO-8601; UTC when no offset is given)")
    pause.add_argument("--reason", help="why (shown by jobs, the monitor and agent.job_activity)")

    resume = commands.add_parser("resume", help="resume a paused job (its misfire policy decides the slots it missed)")
    resume.add_argument("name", metavar="JOB")

    submit = commands.add_parser("submit", help="queue ad-hoc SQL to run asynchronously")
    submit.add_argument("--sql", required=True, help="the SQL to run")
    submit.add_argument("--order", type=_non_negative_int, help="starts only after every task with a lower order finished")
    submit.add_argument("--max-attempts", type=_positive_int, default=1)
    submit.add_argument("--timeout-seconds", type=_positive_int, default=1800)

    cancel = commands.add_parser("cancel", help="cancel a run that has not finished (a running one is stopped)")
    cancel.add_argument("run_id", type=_positive_int, metavar="RUN_ID")

    monitor = commands.add_parser("monitor", help="serve the read-only Job Activity Monitor on 127.0.0.1 "
                                                  "(Ctrl-C stops); see docs/monitor.md")
    monitor.add_argument("--port", type=_non_negative_int, default=8080,
                         help="TCP port on 127.0.0.1 (default 8080; 0 picks a free one)")

    stop = commands.add_parser("stop", help="stop a job (SQL Agent's sp_stop_job): cancel its runs in flight, the "
                                            "running step included; its future slots stay")
    stop.add_argument("name", metavar="JOB")

    doctor = commands.add_parser("doctor", help="check driver, connectivity, authentication, schema, session, "
                                                "permissions and queue")
    doctor.add_argument("--processes", type=_positive_int, default=1,
                        help="processes running the agent at once (Functions instances: maximumInstanceCount; "
                             "local runners): warns when AGENT_MAX_CONNECTIONS x this exceeds the server's limit")

    grant = commands.add_parser("grant-sql", help="T-SQL creating the function app's database user with least "
                                                  "privilege (printed; --apply runs it, as an Entra admin)")
    grant.add_argument("--app-name", metavar="NAME",
                       help="the function app's name (system-assigned identity) or its user-assigned identity's name")
    grant.add_argument("--job-database", action="append", default=None, metavar="DB",
                       help="a JOB__<name>__DATABASE target that needs the user too (repeatable; "
                            "default: every database the job settings name)")
    grant.add_argument("--execute-schema", action="append", default=[], metavar="SCHEMA",
                       help="grant EXECUTE on this schema to the user, for jobs that call procedures (repeatable)")
    grant.add_argument("--job-principal", metavar="USER",
                       help="the user jobs run as, without rights on schema agent (default: AGENT_JOB_PRINCIPAL; "
                            "unset: jobs run as the app)")
    grant.add_argument("--operator", metavar="PRINCIPAL",
                       help="instead: make PRINCIPAL a member of agent_operator (EXECUTE on the T-SQL interface's "
                            "procedures, SELECT on its views, nothing on the tables) and let the agent run its jobs as "
                            "it (with --app-name on SQL Server: IMPERSONATE for that user)")
    grant.add_argument("--targets", metavar="JOB",
                       help="instead: the scripts for the fleet targets of JOB (resolved now: one per target "
                            "database, one per master that lists databases), grouped by server")
    grant.add_argument("--apply", action="store_true",
                       help="run it on the control database (and on each job database) instead of printing it "
                            "(with --targets: on each target and master)")
    importer = commands.add_parser("import-sqlagent", help="SQL Server Agent jobs scripted by SSMS (Script Job as -> "
                                                           "CREATE To) as JOB__<name>__* app settings (JSON), or "
                                                           "--apply: agent.add_scheduled_job on the control database")
    importer.add_argument("files", nargs="+", metavar="FILE.sql", help="T-SQL scripts (one or many jobs each)")
    importer.add_argument("--timezone", metavar="TZ",
                          help="IANA time zone of the SQL Server the jobs ran on (SQL Agent runs in server local "
                               "time); default UTC, with a warning")
    importer.add_argument("--apply", action="store_true",
                          help="define the one-step jobs with agent.add_scheduled_job on the control database "
                               "(--db); jobs with steps are printed as settings and listed")
    completion = commands.add_parser("completion", help="print the shell completion script for sql-agent "
                                                        "(e.g. sql-agent completion bash > ~/.local/share/"
                                                        "bash-completion/completions/sql-agent)")
    completion.add_argument("shell", choices=COMPLETION_SHELLS)
    _json_everywhere(parser)
    return parser


def _json_everywhere(parser: argparse.ArgumentParser) -> None:
    """--json after every command and sub-command too (`sql-agent poison list --json`); its
    default is left out, so that `sql-agent --json poison list` keeps the top level's True."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                if "--json" not in sub._option_string_actions:
                    sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                                     help="one JSON document on stdout; an error is one JSON object on stderr")
                _json_everywhere(sub)


# ---------------------------------------------------------------- argument types


def _iso_datetime(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _ArgumentValueError(text, "an ISO-8601 date and time (e.g. 2026-01-31T02:00:00Z)",
                                  f"{text!r} is not an ISO-8601 date and time (e.g. 2026-01-31T02:00:00Z)")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _number_at_least(kind: type, minimum: int, what: str):
    """An argparse type: a whole number (int) or a number (float) no smaller than minimum."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise _ArgumentValueError(text, f"{what}, {minimum} or more", f"{text!r} is not {what}")
        if value < minimum:
            raise _ArgumentValueError(text, f"{minimum} or more", f"{text!r}: expected {minimum} or more")
        return value

    return parse


_positive_int = _number_at_least(int, 1, "a whole number")
_non_negative_int = _number_at_least(int, 0, "a whole number")
_non_negative_float = _number_at_least(float, 0, "a number")


# ---------------------------------------------------------------- commands


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Known before parsing, so that a usage error is JSON too: --json anywhere before a "--".
    Parser.json_errors = "--json" in arguments[:arguments.index("--")] if "--" in arguments else "--json" in arguments
    try:
        parser = build_parser()
        args = parser.parse_args(arguments)
        Parser.json_errors = args.json
        _configure_logging(args)
        return _run(args)
    finally:
        Parser.json_errors = False


def _configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if args.json:       # stderr stays machine-readable: one JSON object per log record
        handler.setFormatter(_JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in ("run", "work") else logging.WARNING,
                        handlers=[handler])


class _JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(), "level": record.levelname,
                    "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


def _run(args: argparse.Namespace) -> int:
    agent = None
    try:
        if args.command == "completion":
            return cmd_completion(None, args)           # the parser only
        if args.command == "import-sqlagent" and not args.apply:
            return cmd_import_sqlagent(None, args)      # reads files only: no settings, no database
        from shared.engine.agent import Agent
        from shared.settings import load_settings

        settings = load_settings(settings_file=args.settings)
        if args.command not in WAITING_COMMANDS:
            # An operator's command answers within seconds: it waits out a short outage and says
            # what it saw when the database stays away (the agent itself, and init-db, wait
            # AGENT_CONNECT_RETRY_SECONDS, as long as a paused serverless database takes).
            settings = replace(settings, agent=replace(
                settings.agent, connect_retry_seconds=min(settings.agent.connect_retry_seconds,
                                                          COMMAND_CONNECT_RETRY_SECONDS)))
        agent = Agent(settings, db=args.db)
        handler = COMMANDS[args.command]
        return handler(agent, args)
    except ConfigError as exc:
        _print_error(str(exc), "config", setting=exc.setting, value=exc.value, expected=exc.expected)
        return EXIT_USAGE
    except NotFoundError as exc:
        _print_error(str(exc), "not_found", **_known_fields(exc))
        return EXIT_USAGE
    except UsageError as exc:
        _print_error(str(exc), "usage", **_known_fields(exc))
        return EXIT_USAGE
    except AgentError as exc:
        _print_error(str(exc), "failure", **_known_fields(exc))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _print_error("interrupted", "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as shell tools do; stdout goes to
        # /dev/null so that the interpreter's last flush does not fail again.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # driver errors and the like: one line, classified
        from shared.control.sqlerrors import classify

        info = classify(exc)
        code = f" [{info.number or info.sqlstate}]" if (info.number or info.sqlstate) else ""
        extra = {key: value for key, value in (("number", info.number), ("sqlstate", info.sqlstate)) if value}
        _print_error(f"{type(exc).__name__}{code}: {info.message}", "failure", **extra)
        return EXIT_FAILURE
    finally:
        if agent is not None:
            agent.close()


def _known_fields(exc: BaseException) -> dict[str, Any]:
    """setting, value and expected of an error that carries them (UsageError(..., setting=...))."""
    return {name: getattr(exc, name) for name in ("setting", "value", "expected")
            if getattr(exc, name, None) is not None}


def _print_error(message: str, kind: str, **details: Any) -> None:
    """An error: `error: MESSAGE` on stderr, or under --json one JSON object on one line of
    stderr: {"error": MESSAGE, "kind": usage|config|not_found|failure|interrupted, and the
    setting, value and expected when known}."""
    if not Parser.json_errors:
        print(message if kind == "interrupted" else f"error: {message}", file=sys.stderr)
        return
    document = {"error": message, "kind": kind}
    document.update(details)
    print(json.dumps(document, ensure_ascii=False, default=str), file=sys.stderr, flush=True)


def _warn(args: argparse.Namespace, warnings: list[str], message: str) -> None:
    """A warning: a `warning: ...` line on stderr, or under --json kept for the document."""
    if args.json:
        warnings.append(message)
    else:
        print(f"warning: {message}", file=sys.stderr)


def cmd_init_db(agent, args) -> int:
    before, after = agent.init()
    if args.json:
        _print_json({"database": agent.target.display, "dialect": agent.target.dialect,
                     "schema_version_before": before, "schema_version": after, "upgraded": before != after})
    elif before == after:
        print(f"{agent.target.display}: schema is at version {after}, nothing to do")
    else:
        print(f"{agent.target.display}: schema upgraded from version {before} to {after}")
    return EXIT_OK


def cmd_tick(agent, args) -> int:
    report = agent.tick(args.now)
    summary = report.summary()
    if report.refused and not args.json:
        print(f"error: {report.errors[0]}", file=sys.stderr)   # one line: the skew, and that nothing changed
        return EXIT_FAILURE
    if args.json:
        _print_json(summary)
    else:
        print(f"tick at {summary['now']}: {summary['jobs_due']} due, {summary['runs_claimed']} claimed, "
              f"{summary['runs_skipped']} skipped, {summary['runs_dispatched']} dispatched, "
              f"{summary['leases_expired']} leases expired ({summary['statements']} statements, "
              f"{summary['duration_ms']} ms)")
        for warning in report.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for error in report.errors:
            print(f"error: {error}", file=sys.stderr)
    return EXIT_FAILURE if report.errors else EXIT_OK


def cmd_work(agent, args) -> int:

    agent.store().require_schema()
    agent.release()   # the workers take connections as they find work (AGENT_MAX_CONNECTIONS)
    runner = LocalRunner(agent, concurrency=args.concurrency, visibility_timeout=args.visibility_timeout)
    count = runner.work_once() if args.once else runner.work_until_idle(args.max_seconds)
    if args.json:
        _print_json({"processed": count, "unit": "messages" if agent.queue_mode else "runs"})
    else:
        print(f"processed {count} {'message(s)' if agent.queue_mode else 'run(s)'}")
    return EXIT_OK


def cmd_run(agent, args) -> int:

    before, after = agent.init()
    agent.release()
    runner = LocalRunner(agent, concurrency=args.concurrency)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())
    jobs = ", ".join(job.name for job in agent.settings.jobs) or "none"
    where = (f"queue {agent.queue.name}" if agent.queue_mode
             else f"workers claim from the runs table, {runner.concurrency} at most at once")
    # Announced inside the try: a Ctrl-C right after the announcement stops the runner as usual.
    try:
        if args.json:        # the one document, at start (the runner runs until stopped)
            print(json.dumps({"running": True, "database": agent.target.display, "schema_version": after,
                              "mode": "queue" if agent.queue_mode else "direct",
                              "queue": agent.queue.name if agent.queue_mode else None,
                              "concurrency": runner.concurrency, "jobs": [job.name for job in agent.settings.jobs],
                              "invalid_jobs": [{"name": bad.name, "error": bad.message}
                                               for bad in agent.settings.invalid_jobs]}), flush=True)
        else:
            print(f"agent running on {agent.target.display} (schema v{after}); {where}; "
                  f"jobs: {jobs}; Ctrl-C stops", file=sys.stderr)
            for bad in agent.settings.invalid_jobs:
                print(f"warning: job {bad.name} is invalid and will not run: {bad.message}", file=sys.stderr)
        runner.run()
    except KeyboardInterrupt:
        runner.stop()
    if not args.json:
        print("agent stopped", file=sys.stderr)
    return EXIT_OK


def cmd_jobs(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    # What the agent last synced (its tick syncs the settings): never this machine's settings,
    # which would mark the production jobs removed when run from an operator's laptop.
    rows = jobs_view(store, agent.clock())
    if args.json:
        _print_json(rows)
        return EXIT_OK
    table = []
    for row in rows:
        last = f"{row['last_status']} #{row['last_run_id']}" if row["last_run_id"] else "-"
        schedule = row["schedule"] or ("on demand" if row["valid"] else "-")
        if after_words(row):
            schedule += f", {after_words(row)}"
        state = row["state"]
        if row.get("paused") and row.get("paused_until"):
            state = f"paused until {_time(row['paused_until'])}"
        table.append([row["job_name"], state, row["source"], schedule, row["timezone"],
                      _time(row["next_due_at"]), row["status"], last, _last_targets(row), row["config_error"] or ""])
    _print_table(["JOB", "STATE", "DEFINED IN", "SCHEDULE", "TIMEZONE", "NEXT DUE (UTC)", "NOW", "LAST RUN",
                  "LAST TARGETS", "ERROR"], table)
    return EXIT_OK


def _last_targets(row: dict[str, Any]) -> str:
    """The fleet of a job's last run: "T, F failed" ("-" when it had no targets)."""
    total = row.get("last_targets_total")
    if not total:
        return "-"
    return f"{total}, {row.get('last_targets_failed') or 0} failed"


def cmd_history(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    view = history_view(store, args.job, args.limit, with_output=args.json or args.output)
    runs, events = view["runs"], view["job_events"]
    by_run = {run["run_id"]: run["attempts"] for run in runs}
    if args.json:
        _print_json(view)
        return EXIT_OK
    table = []
    for run in runs:
        error = run["last_error"] or run["note"] or ""
        job = run["job_name"] or (f"(target of run {run['parent_run_id']})" if run.get("parent_run_id") else "(task)")
        kind = run["kind"] if run.get("followed_run_id") is None else f"after #{run['followed_run_id']}"
        table.append([run["run_id"], job, kind, _time(run["scheduled_for"]),
                      run["status"], f"{run['attempt']}/{run['max_attempts']}", _time(run["finished_at"]),
                      error[:120]])
    _print_table(["RUN", "JOB", "KIND", "SCHEDULED (UTC)", "STATUS", "ATTEMPTS", "FINISHED", "ERROR / NOTE"], table)
    _print_fleets(runs)
    if args.output:
        _print_attempt_output(runs, by_run)
    if events:
        print()
        _print_table(["EVENT", "JOB", "AT (UTC)", "KIND", "DETAIL"],
                     [[e["event_id"], e["job_name"], _time(e["event_at"]), e["kind"], (e["detail"] or "")[:160]]
                      for e in events])
    return EXIT_OK


def _print_fleets(runs: list[dict[str, Any]]) -> None:
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
                          _time(execution["finished_at"]), (execution["last_error"] or "")[:200]])
            previous = label
        _print_table(["  TARGET", "STEP", "EXECUTION", "STATUS", "ATTEMPTS", "FINISHED", "ERROR"], table)


def _print_attempt_output(runs: list[dict[str, Any]], by_run: dict[int, list[dict[str, Any]]]) -> None:
    """history --output: every attempt (of every step) with its outcome and what the server said."""
    for run in runs:
        failed = f", failed at step {run['failed_step']}" if run.get("failed_step") and run["status"] == RunStatus.FAILED else ""
        print(f"\nrun {run['run_id']} ({run['job_name'] or 'task'}) {run['status']}{failed}")
        for attempt in by_run.get(run["run_id"], []):
            step = f"step {attempt['step']} " if attempt.get("step") else ""
            where = f" in {attempt['target_database']}" if attempt.get("target_database") else ""
            error = f": {attempt['error_message']}" if attempt.get("error_message") else ""
            print(f"  attempt {attempt['attempt']} {step}{attempt['outcome']}{where} "
                  f"({_time(attempt['started_at'])} - {_time(attempt['finished_at'])}){error}")
            for line in (attempt.get("output") or "").splitlines():
                print(f"    | {line}")


def cmd_stuck(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    rows = stuck_view(store, agent.clock(), args.older_than, args.limit)
    if args.json:
        _print_json(rows)
    elif rows:
        _print_table(["RUN", "JOB", "STATUS", "SCHEDULED (UTC)", "LEASE EXPIRED", "TOKEN"],
                     [[r["run_id"], r["job_name"] or "(task)", r["status"], _time(r["scheduled_for"]),
                       _time(r["lease_expires_at"]), r["token"]] for r in rows])
        if len(rows) == args.limit:
            print(f"(the first {args.limit}; --limit shows more)", file=sys.stderr)
    else:
        print("no stuck runs")
    return EXIT_OK


def cmd_poison(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    if args.poison_command == "list":
        rows = poison_view(store, args.limit)
        if args.json:
            _print_json(rows)
        elif rows:
            _print_table(["ID", "RUN", "DEQUEUES", "POISONED (UTC)", "REQUEUED", "REASON"],
                         [[r["poison_id"], r["run_id"] or "-", r["dequeue_count"], _time(r["poisoned_at"]),
                           _time(r["requeued_at"]), r["reason"][:140]] for r in rows])
        else:
            print("no poison messages")
        return EXIT_OK
    requeued = requeue(agent, args.poison_id)
    if args.json:
        _print_json({"poison_id": requeued.poison_id, "run_id": requeued.run_id, "requeued": True,
                     "dispatched": requeued.dispatched})
    else:
        print(f"run {requeued.run_id} requeued (one more attempt){_dispatched_text(requeued.dispatched)}")
    return EXIT_OK


def cmd_run_now(agent, args) -> int:
    agent.store().require_schema()
    # The job as the agent last synced it (see cmd_jobs): this machine's settings are not read.
    run = run_now(agent, args.name)
    if run.skipped:
        if args.json:
            _print_json({"run_id": run.run_id, "job_name": run.job_name, "status": run.status, "note": run.note,
                         "dispatched": None})
        else:
            print(f"run {run.run_id} of {run.job_name} skipped: {run.note}")
        return EXIT_OK
    if args.json:
        _print_json({"run_id": run.run_id, "job_name": run.job_name, "status": run.status, "note": run.note,
                     "dispatched": run.dispatched})
    else:
        print(f"run {run.run_id} of {run.job_name} created{_dispatched_text(run.dispatched)}")
    return EXIT_OK


def _operator_name() -> str:
    """Who pauses or resumes from this command line: the operating system's user."""

    try:
        return f"{getpass.getuser()} (sql-agent)"
    except Exception:      # no user name in this environment (a container without one)
        return "sql-agent"


def cmd_pause(agent, args) -> int:
    store = agent.store()
    store.require_schema()
    pause = pause_job(store, args.name, now=agent.clock(), until=args.until, paused_by=_operator_name(),
                      reason=args.reason, telemetry=agent.telemetry)
    if args.json:
        _print_json(pause.as_dict())
        return EXIT_OK
    until = f"until {_time(pause.paused_until)}" if pause.paused_until else "until resumed"
    skipped = f"; {pause.runs_skipped} slot(s) it had claimed recorded skipped" if pause.runs_skipped else ""
    print(f"job {args.name} paused since {_time(pause.paused_at)}, {until}{skipped}")
    return EXIT_OK


def cmd_resume(agent, args) -> int:
    store = agent.store()
    store.require_schema()
    resumed = resume_job(store, args.name, now=agent.clock(), resumed_by=_operator_name(), telemetry=agent.telemetry)
    if args.json:
        _print_json(resumed.as_dict())
        return EXIT_OK
    print(f"job {args.name} resumed (paused since {_time(resumed.paused_at)}); its misfire policy decides "
          "the slots it missed")
    return EXIT_OK


def cmd_submit(agent, args) -> int:
    task = submit(agent, args.sql, order=args.order, max_attempts=args.max_attempts,
                  timeout_seconds=args.timeout_seconds)
    if args.json:
        _print_json({"run_id": task.run_id, "kind": "task", "order": task.order, "submitted": True,
                     "dispatched": task.dispatched})
        return EXIT_OK
    order = f" (order {task.order})" if task.order is not None else ""
    print(f"task run {task.run_id} submitted{order}{_dispatched_text(task.dispatched)}")
    return EXIT_OK


def cmd_cancel(agent, args) -> int:
    agent.store().require_schema()
    cancelled = cancel(agent, args.run_id)
    if args.json:
        _print_json({"run_id": cancelled.run_id, "status": RunStatus.CANCELLED})
    else:
        print(f"run {cancelled.run_id} cancelled")
    return EXIT_OK


def cmd_monitor(agent, args) -> int:

    environ = merged_environment(args.settings)
    monitor_settings(environ)            # a bad AGENT_MONITOR_* value: one line, exit 2
    agent.store().require_schema()
    try:
        server = make_server(agent, args.port, environ)
    except OSError as exc:
        raise UsageError(f"--port {args.port}: cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); "
                         "pick another port, or 0 for any free one", setting="--port", value=args.port,
                         expected="a free TCP port on 127.0.0.1, or 0 for any free one")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    host, port = server.server_address[:2]
    try:        # announced inside the try: a Ctrl-C right after it stops the server as usual
        if args.json:       # the one document, at start: where it listens (with --port 0, the port picked)
            print(json.dumps({"monitor": f"http://{host}:{port}/", "host": host, "port": port}), flush=True)
        else:
            print(f"monitor: http://{host}:{port}/ (read-only; Ctrl-C stops)", file=sys.stderr, flush=True)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    if not args.json:
        print("monitor stopped", file=sys.stderr)
    return EXIT_OK


def cmd_stop(agent, args) -> int:
    agent.store().require_schema()
    stopped = stop(agent, args.name)
    ids = stopped.cancelled_run_ids
    if args.json:
        _print_json({"job_name": stopped.job_name, "cancelled_run_ids": list(ids)})
        return EXIT_OK
    if not ids:
        print(f"job {stopped.job_name}: no run in flight")
        return EXIT_OK
    # A running step notices at its worker's next lease renewal (every LEASE_SECONDS / 3).
    print(f"job {stopped.job_name}: {len(ids)} run(s) cancelled ({', '.join(map(str, ids))}); a running step stops "
          "within a third of its lease")
    return EXIT_OK


def cmd_doctor(agent, args) -> int:

    report = run_doctor(agent, processes=args.processes)
    if args.json:
        failed = report.failed
        _print_json({"target": report.target, "ok": report.ok, "failed": failed.name if failed else None,
                     "checks": [{"name": check.name, "ok": check.ok, "detail": check.detail, "fix": check.fix or None,
                                 "lines": list(check.lines)} for check in report.checks],
                     "warnings": report.warnings})
    else:
        print(report.render())
    return EXIT_OK if report.ok else EXIT_FAILURE


def cmd_grant_sql(agent, args) -> int:

    if args.operator is not None:
        if args.job_database or args.execute_schema or args.job_principal or args.targets:
            raise UsageError("grant-sql --operator PRINCIPAL takes no --job-database, --execute-schema, "
                             "--job-principal or --targets: run the app's grants and the operator's membership as "
                             "two commands")
        return _grant_operator(agent, args)
    if not args.app_name:
        raise UsageError("grant-sql: --app-name NAME is required (or --operator PRINCIPAL for the T-SQL interface's role)")
    if args.targets is not None:
        if args.job_database is not None:
            raise UsageError(f"grant-sql --targets {args.targets} takes no --job-database (the job's targets are "
                             "the databases): run the JOB__<name>__DATABASE grants as a command of their own")
        return _grant_targets(agent, args)

    databases = args.job_database
    if databases is None:
        databases = sorted({job.database for job in agent.settings.jobs if job.database})
    principal = args.job_principal or agent.settings.agent.job_principal
    scripts = grant_scripts(args.app_name, job_databases=databases, execute_schemas=args.execute_schema,
                            job_principal=principal)
    if not args.apply:
        if args.json:
            _print_json(_scripts_document(scripts, render(scripts), applied_to=None))
        else:
            print(render(scripts), end="")
        return EXIT_OK
    target = agent.target
    if target.dialect != "mssql":
        raise UsageError(f"grant-sql --apply needs an Azure SQL / SQL Server control database "
                         f"(AGENT_SQL_SERVER and AGENT_SQL_DATABASE, or --db with a SQL Server ODBC driver); "
                         f"the control database is {target.display}", setting="--db", value=target.display,
                         expected="an Azure SQL / SQL Server control database")
    applied = _apply_scripts(target, scripts, args)
    if args.json:
        _print_json(_scripts_document(scripts, render(scripts), applied_to=applied))
    return EXIT_OK


def _scripts_document(scripts, sql: str, *, applied_to: list[str] | None, warnings: Sequence[str] = ()) -> dict:
    """grant-sql --json: the scripts (each database's statements), the whole text as printed
    without --json, where they were applied (null: printed only) and the warnings."""
    return {"scripts": [{"database": script.database, "server": getattr(script, "server", None),
                         "comment": script.comment, "statements": list(script.statements)} for script in scripts],
            "sql": sql, "applied": applied_to is not None, "applied_to": applied_to or [],
            "warnings": list(warnings)}


def _apply_scripts(target, scripts, args) -> list[str]:
    """grant-sql --apply: each script in its own transaction, in its database (on its server);
    without --json, each one as it is applied."""
    def show(where: str, script) -> None:
        print(f"applied to {where}: " + " ".join(script.statements))

    return apply_grant_scripts(target, scripts, on_applied=None if args.json else show)


def _grant_targets(agent, args) -> int:
    """grant-sql --targets JOB: the job's fleet targets resolved now (one listing per server or
    pool), then per server the script for its master (when its databases are listed) and one
    per target database; printed, or with --apply run on each. PostgreSQL: CONNECT on each
    target database, one script per server."""

    target = agent.target
    steps = job_fleet(agent, args.targets)         # UsageError: unknown job, no fleet step, SQLite, pool: on PG
    if target.dialect == "postgres" and args.execute_schema:
        raise UsageError(f"grant-sql --targets {args.targets} --execute-schema: on PostgreSQL the command grants "
                         "CONNECT on each target database only; grant what the jobs use inside each database "
                         "yourself (GRANT USAGE ON SCHEMA ..., GRANT EXECUTE ON ALL ROUTINES IN SCHEMA ...)")
    resolution = resolve_fleet(steps, dialect=target.dialect, control_store=agent.store,
                               target_store=agent.target_store)
    pairs, warnings = [], []
    for server, database in [(t.server, t.database) for t in resolution.targets()]:
        problem = name_problem(database)
        if problem:     # a listed name no script can hold: named and left out, the others go on
            where = f"server {server}" if server else "the agent's server"
            _warn(args, warnings, f"job {args.targets!r}: database {database!r} on {where} is left out: expected "
                                  f"{problem}")
        else:
            pairs.append((server, database))
    if target.dialect == "postgres":
        scripts = fleet_postgres_scripts(args.app_name, pairs, job_name=args.targets)
    else:
        principal = args.job_principal or agent.settings.agent.job_principal
        scripts = fleet_grant_scripts(args.app_name, pairs, resolution.listed, execute_schemas=args.execute_schema,
                                      job_principal=principal, job_name=args.targets)
    if not pairs:
        _warn(args, warnings, f"job {args.targets!r}: its targets resolve to no database now")
    text = render_fleet(scripts, separator="GO\n" if target.dialect == "mssql" else "\n")
    if not args.apply:
        if args.json:
            _print_json(_scripts_document(scripts, text, applied_to=None, warnings=warnings))
        else:
            print(text, end="")
        return EXIT_OK
    applied = _apply_scripts(target, scripts, args)
    if args.json:
        _print_json(_scripts_document(scripts, text, applied_to=applied, warnings=warnings))
    return EXIT_OK


def _grant_operator(agent, args) -> int:
    """grant-sql --operator: the membership in agent_operator, printed (T-SQL, or PostgreSQL's GRANT
    when the control database is PostgreSQL) or, with --apply, run on the control database."""

    target = agent.target
    if target.dialect == "sqlite" and args.apply:
        raise UsageError(f"grant-sql --operator --apply: the control database is {target.display}; SQLite has no "
                         "roles or procedures (the command line is its way in). Apply it to an Azure SQL / SQL Server "
                         "or PostgreSQL control database (AGENT_SQL_SERVER, or --db with an ODBC connection string)",
                         setting="--db", value=target.display,
                         expected="an Azure SQL / SQL Server or PostgreSQL control database")
    # Printed for SQLite too: the T-SQL to run once the control database is Azure SQL.
    script = operator_sql(args.operator, dialect=target.dialect, app=args.app_name)
    warnings: list[str] = []
    _warn(args, warnings, OPERATOR_WARNING)

    def document(applied: bool) -> dict:
        return {"operator": args.operator, "app_name": args.app_name, "dialect": target.dialect, "sql": script,
                "applied": applied, "applied_to": ["the control database"] if applied else [], "warnings": warnings}

    if not args.apply:
        if args.json:
            _print_json(document(False))
        else:
            print(script, end="")
        return EXIT_OK
    apply_operator_grant(target, script)
    if args.json:
        _print_json(document(True))
    else:
        print(f"applied to the control database: {args.operator} is a member of agent_operator")
    return EXIT_OK


def _dispatched_text(dispatched: int | None) -> str:
    return "; the local runner starts it" if dispatched is None else f"; {dispatched} run(s) dispatched"


def cmd_import_sqlagent(agent, args) -> int:
    """SSMS's job scripts -> JOB__<name>__* settings (JSON on stdout); what could not be carried
    over is listed per job and makes the exit code 1. --apply: agent.add_scheduled_job for the
    one-step jobs; the others stay in the printed settings and are listed."""

    timezone = args.timezone
    warnings: list[str] = []
    if timezone is None:
        timezone = "UTC"
        _warn(args, warnings, "no --timezone: the schedules are taken as UTC; SQL Server Agent runs in the server's "
                              "local time (give --timezone Europe/Paris, America/New_York, ...)")
    texts = []
    for path in args.files:
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise UsageError(f"import-sqlagent: cannot read {path!r}: {exc.strerror}", setting="FILE.sql", value=path,
                             expected="a readable T-SQL script") from None
        # SSMS saves scripts as UTF-16 (with a byte order mark) or UTF-8.
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = raw.decode("utf-16")
        else:
            text = raw.decode("utf-8-sig", errors="replace")
        texts.append((path, text))
    try:
        converted = convert_script(texts, timezone)
    except ScriptError as exc:
        raise UsageError(f"import-sqlagent: {exc}") from None
    except ValueError as exc:       # the time zone
        raise UsageError(f"import-sqlagent --timezone {timezone!r}: {exc}; expected an IANA time zone name",
                         setting="--timezone", value=timezone, expected="an IANA time zone name") from None
    result = report(converted, timezone)
    incomplete = not result["complete"]
    if args.apply:
        calls, refused = apply_calls(converted)
        result["applied"] = [asdict(added) for added in add_scheduled_jobs(agent.target, calls)]
        result["not_applied"] = refused
        incomplete = incomplete or bool(refused)
    if args.json:       # the same document, the warnings in it; each job's not_carried lists what was left
        result["warnings"] = warnings
    print(json.dumps(result, indent=2, ensure_ascii=False))
    if not args.json:
        for item in result["jobs"]:
            for missing in item["not_carried"]:
                print(f"not carried: {item['sql_agent_name']}: {missing['what']}: {missing['reason']}",
                      file=sys.stderr)
    return EXIT_FAILURE if incomplete else EXIT_OK


def cmd_completion(agent, args) -> int:
    """The shell's completion script, made by shtab from this parser (commands, sub-commands,
    options and choices)."""
    try:
        import shtab
    except ImportError:
        raise UsageError("completion needs the shtab package (requirements-cli.txt; pip install . installs it)",
                         setting="completion", expected="shtab installed") from None
    script = shtab.complete(build_parser(), shell=args.shell)
    if args.json:
        _print_json({"shell": args.shell, "script": script})
    else:
        print(script, end="" if script.endswith("\n") else "\n")
    return EXIT_OK


COMMANDS = {
    "init-db": cmd_init_db,
    "tick": cmd_tick,
    "work": cmd_work,
    "run": cmd_run,
    "jobs": cmd_jobs,
    "history": cmd_history,
    "stuck": cmd_stuck,
    "poison": cmd_poison,
    "run-now": cmd_run_now,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "submit": cmd_submit,
    "cancel": cmd_cancel,
    "monitor": cmd_monitor,
    "stop": cmd_stop,
    "doctor": cmd_doctor,
    "grant-sql": cmd_grant_sql,
    "import-sqlagent": cmd_import_sqlagent,
    "completion": cmd_completion,
}


# ---------------------------------------------------------------- output


def _time(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def _print_json(value: Any) -> None:

    print(to_json(value))


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
