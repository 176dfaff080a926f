"""The command line's parser: every command, its arguments and their checks (a bad value is a usage
error naming the argument, the value and what is expected), --version, --json."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from shared import __version__
from shared.cli.output import EXIT_OK, EXIT_USAGE, UTC, ErrorStyle, print_error, print_json

PROG = "sql-agent"


DISTRIBUTION = "sql-agent-azure"     # pyproject.toml's project name


COMPLETION_SHELLS = ("bash", "zsh", "tcsh")


def version() -> str:
    """The installed distribution's version when this very code is the installed one, else the
    constant in shared/__init__.py (a clone; pyproject.toml reads the same constant)."""


    try:
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


    def error(self, message: str):  # type: ignore[override]
        if not ErrorStyle.json:
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
        print_error(message, "usage", **details)
        self.exit(EXIT_USAGE)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        if ErrorStyle.json:       # --json anywhere on the line
            print_json({"name": DISTRIBUTION, "version": version(), "python": "%d.%d.%d" % sys.version_info[:3]})
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
    work.add_argument("--concurrency", type=positive_int, help="workers in parallel (default AGENT_MAX_CONCURRENCY)")
    work.add_argument("--visibility-timeout", type=non_negative_float, metavar="SECONDS",
                      help="redelivery delay after a failure (default: host.json visibilityTimeout)")
    work.add_argument("--max-seconds", type=non_negative_float, help="with --until-idle: stop after this long")

    run = commands.add_parser("run", help="run the agent locally: tick on schedule and work the queue (Ctrl-C stops)")
    run.add_argument("--concurrency", type=positive_int, help="worker threads (default AGENT_MAX_CONCURRENCY)")

    commands.add_parser("jobs", help="the jobs as the agent last synced them: state, next slot and last run")

    upcoming = commands.add_parser("next", help="a job's next slots (its schedule's calendar tokens and clauses "
                                   "applied), in UTC and in the job's time zone")
    upcoming.add_argument("name", metavar="JOB")
    upcoming.add_argument("--count", type=positive_int, default=10, help="how many slots (default 10, at most 1000)")
    upcoming.add_argument("--from", dest="start", type=_iso_datetime, metavar="TIME",
                          help="slots after this ISO-8601 time (default: now, the database's clock)")

    history = commands.add_parser("history", help="runs, newest first, with attempts and job events")
    history.add_argument("--job", help="only this job")
    history.add_argument("--limit", type=positive_int, default=50)
    history.add_argument("--output", action="store_true",
                         help="each attempt (each step's) with what the server said: messages and rows affected")

    stuck = commands.add_parser("stuck", help="reconciliation: runs past their lease or waiting too long")
    stuck.add_argument("--older-than", type=positive_int, default=600, metavar="SECONDS",
                       help="pending runs runnable for longer than this count as stuck (default 600)")
    stuck.add_argument("--limit", type=positive_int, default=500, help="at most this many runs (default 500)")

    poison = commands.add_parser("poison", help="poison messages")
    poison_commands = poison.add_subparsers(dest="poison_command", metavar="ACTION", required=True)
    poison_list = poison_commands.add_parser("list", help="poison messages, newest first")
    poison_list.add_argument("--limit", type=positive_int, default=50)
    requeue = poison_commands.add_parser("requeue", help="give the poisoned run one more attempt")
    requeue.add_argument("poison_id", type=positive_int, metavar="ID")

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
    submit.add_argument("--order", type=non_negative_int, help="starts only after every task with a lower order finished")
    submit.add_argument("--max-attempts", type=positive_int, default=1)
    submit.add_argument("--timeout-seconds", type=positive_int, default=1800)

    cancel = commands.add_parser("cancel", help="cancel a run that has not finished (a running one is stopped)")
    cancel.add_argument("run_id", type=positive_int, metavar="RUN_ID")

    monitor = commands.add_parser("monitor", help="serve the read-only Job Activity Monitor on 127.0.0.1 "
                                                  "(Ctrl-C stops); see docs/monitor.md")
    monitor.add_argument("--port", type=non_negative_int, default=8080,
                         help="TCP port on 127.0.0.1 (default 8080; 0 picks a free one)")

    stop = commands.add_parser("stop", help="stop a job (SQL Agent's sp_stop_job): cancel its runs in flight, the "
                                            "running step included; its future slots stay")
    stop.add_argument("name", metavar="JOB")

    doctor = commands.add_parser("doctor", help="check driver, connectivity, authentication, schema, session, "
                                                "permissions and queue")
    doctor.add_argument("--processes", type=positive_int, default=1,
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


positive_int = _number_at_least(int, 1, "a whole number")


non_negative_int = _number_at_least(int, 0, "a whole number")


non_negative_float = _number_at_least(float, 0, "a number")
