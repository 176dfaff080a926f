"""The command line's parser: every command, its arguments and their checks (a bad value is a usage
error naming the argument, the value and what is expected), --version, --json."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from datetime import date, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from shared import __version__
from shared.cli.output import EXIT_OK, EXIT_USAGE, UTC, ErrorStyle, print_error, print_json
from shared.values import BIGINT_MAX, INT_MAX, MAX_STUCK_AGE_SECONDS

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


def _text(value: object) -> str:
    """A parsed option value as a person reads it (a date as ISO 8601, not Python's repr)."""
    return value.isoformat() if isinstance(value, (datetime, date)) else str(value)


def _as_given(value: object) -> str:
    return _text(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(_text(value))


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value refuses a second (`--limit 5 --limit 10`): which one was
    meant is the caller's to say, not ours to guess (options that may repeat say append)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.nargs is None and isinstance(values, list):
            # `--limit=--`: argparse drops a "--" value and hands on no value at all.
            expected = getattr(self.type, "expected", "a value")
            cause = _ArgumentValueError("--", expected, f"'--' is not {expected}")
            raise argparse.ArgumentError(self, str(cause)) from cause
        _refuse_undecodable(self, values)
        given = namespace.__dict__.setdefault(_GIVEN, {})
        if self.dest in given and option_string is not None:
            cause = _ArgumentValueError(_text(values), "the option given once",
                                        f"given more than once ({_as_given(given[self.dest])}, then "
                                        f"{_as_given(values)}): give it once")
            raise argparse.ArgumentError(self, str(cause)) from cause
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class _AppendText(argparse._AppendAction):
    """A repeatable option (--job-database, --execute-schema), its values UTF-8 text."""

    def __call__(self, parser, namespace, values, option_string=None):
        _refuse_undecodable(self, values)
        super().__call__(parser, namespace, values, option_string)


def _refuse_undecodable(action: argparse.Action, values: Any) -> None:
    """Bytes that are not UTF-8 on the command line (Python keeps them as lone surrogates): no
    name, SQL or text the database stores can hold them. File paths keep theirs."""
    for value in values if isinstance(values, list) else [values]:
        if isinstance(value, str) and action.dest not in _PATHS and _UNDECODABLE.search(value):
            shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            cause = _ArgumentValueError(shown, "UTF-8 text",
                                        f"'{shown}' is not UTF-8 text (a byte no character is made of)")
            raise argparse.ArgumentError(action, str(cause)) from cause


# Where _StoreOnce notes what it saw while a command line is parsed (removed before it returns).
_GIVEN = "_options_given"
# What Python makes of command-line bytes that are not UTF-8 (PEP 383), refused except in file
# paths, whose bytes are the file system's.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
_PATHS = frozenset({"settings", "db", "files"})


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line: `error: ...` on stderr, or under --json one JSON
    object naming the argument, the value and what is expected (exit 2 either way)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.register("action", "append", _AppendText)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, rest = super().parse_known_args(args, namespace)
        namespace.__dict__.pop(_GIVEN, None)
        return namespace, rest

    def error(self, message: str):  # type: ignore[override]
        details: dict[str, Any] = {}
        current = sys.exc_info()[1]
        if isinstance(current, argparse.ArgumentError):
            details["setting"] = current.argument_name
            cause = current.__cause__ or current.__context__
            if isinstance(cause, _ArgumentValueError):
                details.update(value=cause.value, expected=cause.expected)
        else:
            required = re.match(r"the following arguments are required: (.*)", message)
            if required:
                details["setting"] = required.group(1)
        invalid = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if invalid:
            details.update(value=invalid.group(1), expected=f"one of {invalid.group(2)}")
        if ErrorStyle.json:
            print_error(message, "usage", **details)
        else:       # one line, as every other error (the usage is one --help away)
            print_error(f"{self.prog}: {message} (see {self.prog} --help)", "usage")
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
    work.add_argument("--concurrency", type=CONCURRENCY, help="workers in parallel (default AGENT_MAX_CONCURRENCY)")
    work.add_argument("--visibility-timeout", type=VISIBILITY_SECONDS, metavar="SECONDS",
                      help="redelivery delay after a failure (default: host.json visibilityTimeout)")
    work.add_argument("--max-seconds", type=RUN_SECONDS, help="with --until-idle: stop after this long")

    run = commands.add_parser("run", help="run the agent locally: tick on schedule and work the queue (Ctrl-C stops)")
    run.add_argument("--concurrency", type=CONCURRENCY, help="worker threads (default AGENT_MAX_CONCURRENCY)")

    commands.add_parser("jobs", help="the jobs as the agent last synced them: state, next slot and last run")

    upcoming = commands.add_parser("next", help="a job's next slots (its schedule's calendar tokens and clauses "
                                   "applied), in UTC and in the job's time zone")
    upcoming.add_argument("name", metavar="JOB")
    upcoming.add_argument("--count", type=SLOT_COUNT, default=10, help="how many slots (default 10, at most 1000)")
    upcoming.add_argument("--from", dest="start", type=_iso_datetime, metavar="TIME",
                          help="slots after this ISO-8601 time (default: now, the database's clock)")

    history = commands.add_parser("history", help="runs, newest first, with attempts and job events")
    history.add_argument("--job", help="only this job")
    history.add_argument("--limit", type=ROW_LIMIT, default=50)
    history.add_argument("--output", action="store_true",
                         help="each attempt (each step's) with what the server said: messages and rows affected")

    audit = commands.add_parser("audit", help="the audit trail, newest first: who did what (from the command line "
                                              "and the T-SQL procedures), from where, when, with which arguments, "
                                              "done or refused")
    audit.add_argument("--job", help="only this job's actions")
    audit.add_argument("--since", type=_iso_datetime, metavar="TIME",
                       help="only actions at or after this time (ISO-8601; UTC when no offset is given)")
    audit.add_argument("--limit", type=ROW_LIMIT, default=50)

    alerts = commands.add_parser("alerts", help="the condition alerts (ALERT__<name>__*, agent.add_alert): what each "
                                                "watches, its state and responses, and the latest responses")
    alerts.add_argument("--limit", type=ROW_LIMIT, default=20, help="the latest responses shown (default 20)")

    stuck = commands.add_parser("stuck", help="reconciliation: runs past their lease or waiting too long")
    stuck.add_argument("--older-than", type=AGE_SECONDS, default=600, metavar="SECONDS",
                       help="pending runs runnable for longer than this count as stuck (default 600)")
    stuck.add_argument("--limit", type=ROW_LIMIT, default=500, help="at most this many runs (default 500)")

    poison = commands.add_parser("poison", help="poison messages")
    poison_commands = poison.add_subparsers(dest="poison_command", metavar="ACTION", required=True)
    poison_list = poison_commands.add_parser("list", help="poison messages, newest first")
    poison_list.add_argument("--limit", type=ROW_LIMIT, default=50)
    requeue = poison_commands.add_parser("requeue", help="give the poisoned run one more attempt")
    requeue.add_argument("poison_id", type=ROW_ID, metavar="ID")

    run_now = commands.add_parser("run-now", help="run a job now, as the agent last synced it (its overlap policy applies)")
    run_now.add_argument("name", metavar="NAME")
    run_now.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                         help="a value of a parameter the job declares (repeatable; JOB__<name>__PARAMS__<k>__*); "
                              "the job's SQL reads it bound, never pasted into its text")

    backfill = commands.add_parser("backfill", help="run the slots of a past window as recorded runs, oldest first "
                                   "(a slot that already ran is not run twice; at most 1000 slots)")
    backfill.add_argument("name", metavar="JOB")
    backfill.add_argument("--from", dest="start", type=_iso_datetime, metavar="TIME", required=True,
                          help="the window's start, included (ISO-8601; UTC when no offset is given)")
    backfill.add_argument("--to", dest="end", type=_iso_datetime, metavar="TIME", required=True,
                          help="the window's end, included, at or before now (ISO-8601; UTC when no offset is given)")

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
    submit.add_argument("--order", type=TASK_ORDER, help="starts only after every task with a lower order finished")
    submit.add_argument("--max-attempts", type=MAX_ATTEMPTS, default=1)
    submit.add_argument("--timeout-seconds", type=TIMEOUT_SECONDS, default=1800)

    cancel = commands.add_parser("cancel", help="cancel a run that has not finished (a running one is stopped)")
    cancel.add_argument("run_id", type=ROW_ID, metavar="RUN_ID")

    monitor = commands.add_parser("monitor", help="serve the Job Activity Monitor on 127.0.0.1 "
                                                  "(Ctrl-C stops); see docs/monitor.md")
    monitor.add_argument("--port", type=PORT, default=8080,
                         help="TCP port on 127.0.0.1 (default 8080; 0 picks a free one)")
    monitor.add_argument("--operator", action="store_true",
                         help="show the operator's buttons (start, stop, pause, resume, cancel, requeue) and take "
                              "the actions, audited as this host's user; without it the monitor is read-only")

    stop = commands.add_parser("stop", help="stop a job (SQL Agent's sp_stop_job): cancel its runs in flight, the "
                                            "running step included; its future slots stay")
    stop.add_argument("name", metavar="JOB")

    doctor = commands.add_parser("doctor", help="check driver, connectivity, authentication, schema, session, "
                                                "permissions and queue")
    doctor.add_argument("--processes", type=PROCESSES, default=1,
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
    grant.add_argument("--agent-login", metavar="NAME",
                       help="instead: the agent's own login (PostgreSQL) or database user (Azure SQL) with the rights "
                            "it needs on the control database and nothing else (no superuser, db_owner or CREATEROLE; "
                            "docs/deploying.md says what it can do); --apply runs it as the --db login, an admin")
    grant.add_argument("--targets", metavar="JOB",
                       help="instead: the scripts for the fleet targets of JOB (resolved now: one per target "
                            "database, one per master that lists databases), grouped by server")
    grant.add_argument("--apply", action="store_true",
                       help="run it on the control database (and on each job database) instead of printing it "
                            "(with --targets: on each target and master)")
    importer = commands.add_parser("import-sqlagent", help="SQL Server Agent jobs from the T-SQL that creates them (SSMS's "
                                                           "Script Job as -> CREATE To, or any script) as "
                                                           "JOB__<name>__* and ALERT__<name>__* app settings (JSON), "
                                                           "or --apply: agent.add_scheduled_job and agent.add_alert "
                                                           "on the control database")
    importer.add_argument("files", nargs="+", metavar="FILE.sql", help="T-SQL scripts (one or many jobs each)")
    importer.add_argument("--timezone", metavar="TZ",
                          help="IANA time zone of the SQL Server the jobs ran on (SQL Agent runs in server local "
                               "time); default UTC, with a warning")
    importer.add_argument("--apply", action="store_true",
                          help="define the scheduled jobs with agent.add_scheduled_job (and their steps with "
                               "agent.set_job_steps, in the same transaction), then the alerts with agent.add_alert, "
                               "on the control database (--db); on-demand jobs, and alerts that start them, are "
                               "printed as settings and listed under not_applied")
    importer.add_argument("--encoding", metavar="NAME",
                          help="the scripts' encoding (utf-8, utf-16, cp1252, ...); default: a byte order mark, else "
                               "UTF-16/UTF-32 told by its NUL bytes, else UTF-8, else Windows-1252 with a warning")
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
    expected = "an ISO-8601 date and time (e.g. 2026-01-31T02:00:00Z)"
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        # An offset can carry a time at either end of the calendar past it (0001-01-01T00:00+01:00).
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except ValueError:
        raise _ArgumentValueError(text, expected, f"{text!r} is not {expected}") from None
    except OverflowError:
        raise _ArgumentValueError(text, f"{expected} between years 1 and 9999 in UTC",
                                  f"{text!r} is out of range: expected {expected} between years 1 and 9999 "
                                  "in UTC") from None


# A whole number as people write one (ASCII digits, a minus sign), and a number of seconds with an
# optional fraction: no sign, exponent, hexadecimal, underscores, spaces, NaN, infinity or other
# scripts' digits, which Python's int() and float() would take, each meaning something else or nothing.
_WHOLE = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


@dataclass(frozen=True)
class Number:
    """An argparse type: a number from ``low`` to ``high`` (above ``low`` when ``above_low``),
    whole or with a fraction (seconds). Anything else is a usage error naming the value and the
    range, under --json with `value` and `expected`. Every numeric argument of every command
    uses it (tests/integration/test_cli_numbers.py finds them in the parser)."""

    low: int
    high: int
    whole: bool = True
    above_low: bool = False
    unit: str = ""

    @property
    def expected(self) -> str:
        what = "a whole number" if self.whole else "a number"
        unit = f" of {self.unit}" if self.unit else ""
        if self.above_low:
            return f"{what}{unit} above {self.low}, at most {self.high}"
        return f"{what}{unit} from {self.low} to {self.high}"

    def __call__(self, text: str) -> int | float:
        grammar = _WHOLE if self.whole else _DECIMAL
        if not grammar.fullmatch(text):
            raise _ArgumentValueError(text, self.expected, f"{text!r} is not {self.expected}")
        value: int | float = int(text) if self.whole else float(text)
        if value < self.low or value > self.high or (self.above_low and value == self.low):
            raise _ArgumentValueError(text, self.expected, f"{text!r} is out of range: expected {self.expected}")
        return value

    def __repr__(self) -> str:       # argparse names the type in some messages
        return "Number"


ROW_ID = Number(1, BIGINT_MAX)       # a run's or a poison message's id
ROW_LIMIT = Number(1, INT_MAX)
# What the app settings allow for the same things (AGENT_MAX_CONCURRENCY, a job's MAX_ATTEMPTS
# and TIMEOUT_SECONDS), so that the command line takes what the settings take.
CONCURRENCY = Number(1, 10000)
MAX_ATTEMPTS = Number(1, 100)
TIMEOUT_SECONDS = Number(1, 7 * 86400, unit="seconds")
TASK_ORDER = Number(0, INT_MAX)
AGE_SECONDS = Number(1, MAX_STUCK_AGE_SECONDS, unit="seconds")     # as the monitor's older_than
# The longest a storage queue message may stay invisible (Azure Storage: 7 days).
VISIBILITY_SECONDS = Number(0, 7 * 86400, whole=False, unit="seconds")
RUN_SECONDS = Number(0, INT_MAX, whole=False, above_low=True, unit="seconds")
PORT = Number(0, 65535)
PROCESSES = Number(1, 10000)
SLOT_COUNT = Number(1, 1000)        # next --count: shared.engine.views.MAX_NEXT_COUNT
