"""One classifier for database errors: transient (worth retrying) or permanent.

Used everywhere a decision depends on it: the executor (a transient job error re-raises so the
queue redelivers; a permanent one fails the run at once, without burning redeliveries) and the
retries around connect, heartbeat and fenced completion writes (:func:`retry_transient`).

It understands three sources without importing any of them (pyodbc stays a lazy import):

* pyodbc errors, ``args == (sqlstate, message)``. The message is pyodbc's rendering of every
  ODBC diagnostic record: ``[SQLSTATE] <driver prefixes><text> (<native error>) (<ODBC call>)``,
  further records appended as ``; [SQLSTATE] <driver prefixes><text> (<native error>)``.
  With the Microsoft ODBC driver (and FreeTDS) the native error *is* the SQL Server error
  number (40613, 1205, 208, ...). With psqlodbc it is a driver-internal code ("(1)", "(7)",
  "(101)"), so numbers are only trusted from Microsoft/FreeTDS records or from records that
  do not look like PostgreSQL or driver-manager output.
* sqlite3 errors: "database is locked" / "database table is locked" are transient.
* Python's own network errors (ConnectionError, TimeoutError, other socket-level OSError) and
  the Azure SDK's request errors (reaching Entra ID / storage) are transient.

Anything not known to be transient is permanent: an unknown error must not burn the queue's
redeliveries pretending it could go away.
"""

from __future__ import annotations

import logging
import random
import re
import sqlite3
import sys
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

__all__ = [
    "SqlErrorInfo",
    "describe",
    "retry_connect",
    "MIN_RETRY_DELAY_SECONDS",
    "OdbcRecord",
    "classify",
    "diagnostic_records",
    "is_transient",
    "is_lock_conflict",
    "retry_transient",
    "TRANSIENT_SQLSERVER_NUMBERS",
    "PERMANENT_SQLSERVER_NUMBERS",
]

T = TypeVar("T")
_log = logging.getLogger(__name__)

TRANSIENT = "transient"
PERMANENT = "permanent"

# SQL Server / Azure SQL Database error numbers that go away on their own: reconfiguration and
# failover (40197, 40613, 4060 during a move), throttling (40501, 10928, 10929, 4922x/4991x),
# dropped sockets (10053, 10054, 10060, 64, 233, 20), lock contention (1204, 1205 deadlock
# victim, 1222 lock request timeout). The list Microsoft's retry guidance and SqlClient's
# default retry provider use.
TRANSIENT_SQLSERVER_NUMBERS: frozenset[int] = frozenset({
    4060, 4221, 40143, 40197, 40501, 40540, 40613, 49918, 49919, 49920,
    10928, 10929, 10936, 10053, 10054, 10060, 233, 997, 1204, 1205, 1222, 64, 20,
})

# Known permanent: syntax (102, 156), permission (229, 230, 262, 297, 300), missing object
# (208 object, 207 column, 2812 procedure), constraint (2627 primary key/unique constraint,
# 2601 unique index), conversion/data (245, 8114). Everything unknown is permanent as well;
# the list exists so a known permanent number wins over a connection-class SQLSTATE.
PERMANENT_SQLSERVER_NUMBERS: frozenset[int] = frozenset({
    102, 156, 229, 230, 262, 297, 300, 208, 207, 2812, 2627, 2601, 245, 8114,
})

# SQLSTATEs that are transient whatever the server: HYT00/HYT01 timeouts (a login timeout is
# what a paused serverless database gives while it resumes), 40001 serialization failure /
# SQL Server deadlock victim, and PostgreSQL's 40P01 deadlock, 57P01 admin shutdown,
# 57P02 crash shutdown, 57P03 cannot connect now, 55P03 lock not available (lock_timeout, like
# SQL Server's 1222). Classes 08 (connection) and 53
# (insufficient resources) are matched by prefix below.
_TRANSIENT_SQLSTATES = frozenset({"HYT00", "HYT01", "40001", "40P01", "55P03", "57P01", "57P02", "57P03"})
_TRANSIENT_SQLSTATE_CLASSES = ("08", "53")

# psqlodbc reports every failed connection as 08001, including ones that retrying cannot fix.
# These server texts (PostgreSQL's own FATAL messages) mean a configuration error.
_PG_PERMANENT_CONNECT_TEXTS = (
    re.compile(r'database "[^"]*" does not exist'),
    re.compile(r'role "[^"]*" does not exist'),
    re.compile(r"password authentication failed"),
    re.compile(r"no pg_hba\.conf entry"),
    re.compile(r"permission denied for database"),
)

# After these the session is gone: transport errors, and Azure SQL reconfiguration / failover
# errors, which close the connection (Microsoft's guidance: reconnect, then retry).
_CONNECTION_LOST_NUMBERS = frozenset({10053, 10054, 10060, 64, 233, 20, 40197, 40613, 40143, 40540})
# 57P01/57P02/57P03: PostgreSQL terminated or refused the session.
_CONNECTION_LOST_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
_CONNECTION_LOST_TEXT = re.compile(
    r"communication link failure|connection has been lost|connection lost|connection is closed"
    r"|server closed the connection|terminating connection|connection reset|broken pipe"
    # FreeTDS's own words for a session the server ended (KILL, a restart), with SQLSTATE HY000
    # as often as 08S01.
    r"|unexpected eof from the server|read from the server failed|write to the server failed",
    re.IGNORECASE,
)

# Babelfish for PostgreSQL answers a PostgreSQL error it has no SQL Server number for with 33557097
# (SQLSTATE 42000 through FreeTDS) and PostgreSQL's own text. These texts are the transient ones:
# a lock timeout (SQL Server's 1222) and a serialization failure or a lock not available (1205).
BABELFISH_UNMAPPED_NUMBER = 33557097
_BABELFISH_TRANSIENT_TEXT = re.compile(
    r"canceling statement due to lock timeout|could not serialize access|could not obtain lock", re.IGNORECASE)

_FREETDS_LOST_TEXT = re.compile(
    r"unexpected eof from the server|read from the server failed|write to the server failed", re.IGNORECASE)

_SQLSTATE_RE = re.compile(r"^[0-9A-Z]{5}\Z")
# pyodbc joins diagnostic records with "; [SQLSTATE] ".
_RECORD_SPLIT_RE = re.compile(r";\s(?=\[[0-9A-Z]{5}\]\s)")
_RECORD_STATE_RE = re.compile(r"^\[([0-9A-Z]{5})\]\s*")
# Trailing "(native)" optionally followed by "(SQLDriverConnect)"-style ODBC function name.
_TRAILER_RE = re.compile(r"\s*\((-?\d+)\)(?:\s*\((SQL\w+)\))?\s*$")
_FUNCTION_ONLY_RE = re.compile(r"\s*\((SQL\w+)\)\s*$")
# Leading driver-manager and driver prefixes: [unixODBC][Microsoft][ODBC Driver 18 for SQL Server][SQL Server]
_PREFIX_RE = re.compile(r"^(?:\[[^\[\]]*\])+\s*")
_MICROSOFT_MARKERS = ("[SQL Server]", "[ODBC Driver", "[Microsoft]", "[FreeTDS]")
_DRIVER_MANAGER_MARKERS = ("[unixODBC]", "[Driver Manager]", "[iODBC]")
# What psqlodbc's messages look like (its native codes are not SQL Server error numbers).
_POSTGRES_MARKERS = re.compile(
    r"^(?:ERROR|FATAL|PANIC|WARNING):|Error while executing the query|connection to server"
    r"|could not connect to server|The connection has been lost|connection lost|\nDETAIL:"
)
_PSQLODBC_NOISE_RE = re.compile(r";?\s*Error while executing the query\s*$")
_SEVERITY_RE = re.compile(r"^(?:ERROR|FATAL):\s*")
_SPACES_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class SqlErrorInfo:
    """What :func:`classify` found out about one exception."""

    kind: str  # "transient" | "permanent"
    number: int | None  # SQL Server error number found in the message (e.g. 40613), else None
    sqlstate: str | None  # e.g. "08S01", "42P01", "HYT00"
    message: str  # one line, without driver prefixes and the "(208) (SQLExecDirectW)" trailer
    # The connection that raised it is no use any more (reconnect before the next statement).
    connection_lost: bool = False

    @property
    def transient(self) -> bool:
        return self.kind == TRANSIENT


@dataclass(frozen=True)
class OdbcRecord:
    """One diagnostic record out of a pyodbc message."""

    sqlstate: str | None
    native: int | None
    text: str  # cleaned, one line
    trusted: bool  # native is a SQL Server error number


def classify(exc: BaseException) -> SqlErrorInfo:
    """Decide whether ``exc`` is worth retrying. Never raises.

    A wrapper the classifier does not know (e.g. an AgentError raised ``from`` a driver error,
    or one carrying the driver error as ``.cause``) is classified by what it wraps, keeping the
    wrapper's own text as the message. A ConfigError is never unwrapped: bad settings stay
    permanent whatever the underlying error was.
    """
    return _classify(exc, depth=0)


def _classify(exc: BaseException, depth: int) -> SqlErrorInfo:
    if getattr(exc, "control_database", True) is False:
        # 4060 "cannot open database" is transient for the control database (Azure SQL answers
        # it during a move) but, for a job's DATABASE, most often a mistyped name: permanent,
        # so it does not burn the queue's redeliveries.
        inner = getattr(exc, "cause", None)
        if isinstance(inner, BaseException):
            wrapped = _classify(inner, depth + 1)
            text = _SPACES_RE.sub(" ", str(exc)).strip() or wrapped.message
            if wrapped.number == 4060:
                return SqlErrorInfo(PERMANENT, wrapped.number, wrapped.sqlstate, text, wrapped.connection_lost)
            return SqlErrorInfo(wrapped.kind, wrapped.number, wrapped.sqlstate, text, wrapped.connection_lost)
    if isinstance(exc, sqlite3.Error):
        return _classify_sqlite(exc)
    odbc = _odbc_args(exc)
    if odbc is not None:
        return _classify_odbc(*odbc)
    info = _classify_python(exc)
    if info.kind == PERMANENT and depth < 5 and not _is_config_error(exc):
        inner = getattr(exc, "cause", None)
        if not isinstance(inner, BaseException):
            inner = exc.__cause__
        if inner is not None and inner is not exc:
            wrapped = _classify(inner, depth + 1)
            text = _SPACES_RE.sub(" ", str(exc)).strip() or wrapped.message
            return SqlErrorInfo(wrapped.kind, wrapped.number, wrapped.sqlstate, text, wrapped.connection_lost)
    return info


def _is_config_error(exc: BaseException) -> bool:
    return any(cls.__name__ == "ConfigError" for cls in type(exc).__mro__)


def diagnostic_records(exc: BaseException) -> list[OdbcRecord]:
    """Every ODBC diagnostic record in ``exc`` (or in the driver error it wraps), in order;
    empty when no pyodbc-shaped error is found."""
    current: BaseException | None = exc
    for _ in range(6):
        if current is None:
            break
        odbc = _odbc_args(current)
        if odbc is not None:
            return _parse_odbc(*odbc)
        inner = getattr(current, "cause", None)
        current = inner if isinstance(inner, BaseException) else current.__cause__
    return []


# Errors that ask for a longer wait than a backoff's first steps: a paused serverless database
# resuming answers 40613 for up to about a minute; throttling (40501, 10928, 10929) asks for
# 10 s or more; a failover (40197) takes seconds. Every retry after one of these waits at least
# this long (Microsoft's retry guidance for Azure SQL Database).
MIN_RETRY_DELAY_SECONDS: dict[int, float] = {40613: 10.0, 40501: 10.0, 10928: 10.0, 10929: 10.0, 10936: 10.0, 40197: 5.0,
                                             40540: 5.0, 40143: 5.0, 49918: 10.0, 49919: 10.0, 49920: 10.0}
# How long connecting keeps trying by default (AGENT_CONNECT_RETRY_SECONDS): longer than a
# serverless database takes to resume.
DEFAULT_CONNECT_BUDGET_SECONDS = 90.0


def retry_connect(
    operation: Callable[[], T],
    *,
    what: str,
    budget_seconds: float = DEFAULT_CONNECT_BUDGET_SECONDS,
    classify_error: Callable[[BaseException], SqlErrorInfo] | None = None,
    base_delay: float = 0.5,
    max_delay: float = 15.0,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """Connect with retries for as long as ``budget_seconds``: a transient error waits (full
    jitter backoff, but never less than the error asks for, see MIN_RETRY_DELAY_SECONDS) and
    tries again; a permanent error, or the budget spent, raises the last error unchanged."""
    judge = classify_error or classify
    draw = (rng or random).uniform
    deadline = monotonic() + max(0.0, budget_seconds)
    attempt = 1
    while True:
        try:
            return operation()
        except Exception as exc:
            info = judge(exc)
            remaining = deadline - monotonic()
            if info.kind != TRANSIENT or remaining <= 0:
                if info.kind == TRANSIENT:
                    # INFO: the caller reports the error itself (an operator's command in one line).
                    _log.info("%s: giving up after %d attempts and %.0f s: %s", what, attempt,
                                 budget_seconds, describe(exc))
                raise
            floor = MIN_RETRY_DELAY_SECONDS.get(info.number or 0, 0.0)
            delay = max(floor, draw(0.0, min(max_delay, base_delay * (2 ** (attempt - 1)))))
            delay = min(delay, remaining)
            _log.info("%s: transient error (attempt %d), retrying in %.1f s (%.0f s left): %s",
                         what, attempt, delay, remaining, describe(exc))
            sleep(delay)
            attempt += 1


def describe(exc: BaseException) -> str:
    """One line for a log or an error report: the driver's message in words, with its SQLSTATE
    and error number when there are any; never pyodbc's raw ``('08001', '[08001] ...')`` tuple."""
    info = classify(exc)
    codes = ", ".join(part for part in (f"SQLSTATE {info.sqlstate}" if info.sqlstate else "",
                                        f"error {info.number}" if info.number is not None else "") if part)
    message = info.message or type(exc).__name__
    if not codes and not _odbc_args(exc) and type(exc).__name__ not in message and not isinstance(exc, sqlite3.Error):
        if not any(cls.__name__.endswith("Error") and cls.__module__.startswith("shared") for cls in type(exc).__mro__):
            message = f"{type(exc).__name__}: {message}"
    # A wrapper (ConnectError) may already carry its cause's codes in its message.
    return f"{message} ({codes})" if codes and f"({codes})" not in message else message


def is_unique_violation(exc: BaseException) -> bool:
    """True when ``exc`` is a unique key refusing a duplicate (SQLite, PostgreSQL 23505, SQL
    Server 2627/2601)."""
    if isinstance(exc, sqlite3.IntegrityError):
        return "UNIQUE constraint failed" in str(exc)
    info = classify(exc)
    return info.sqlstate == "23505" or info.number in (2627, 2601)


# Lock conflicts: a deadlock victim (PostgreSQL 40P01, SQL Server 1205), a serialization failure
# (40001), a lock wait that timed out (PostgreSQL 55P03, SQL Server 1222, 1204), SQLite busy.
_LOCK_CONFLICT_SQLSTATES = frozenset({"40P01", "40001", "55P03"})
_LOCK_CONFLICT_NUMBERS = frozenset({1204, 1205, 1222})


def is_lock_conflict(exc: BaseException) -> bool:
    """True when ``exc`` says the statement lost a race for locks (rolled back, nothing done):
    running it again in a new transaction is the remedy."""
    info = classify(exc)
    if info.kind != TRANSIENT:
        return False
    if info.sqlstate in _LOCK_CONFLICT_SQLSTATES or info.number in _LOCK_CONFLICT_NUMBERS:
        return True
    lowered = info.message.lower()
    return ("deadlock" in lowered or "database is locked" in lowered or "database table is locked" in lowered
            or "could not serialize" in lowered or "lock timeout" in lowered)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is known to go away on retry (see :func:`classify`)."""
    return classify(exc).kind == TRANSIENT


def retry_transient(
    operation: Callable[[], T],
    *,
    what: str,
    attempts: int = 5,
    base_delay: float = 0.5,
    max_delay: float = 15.0,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, SqlErrorInfo, float], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Run ``operation``; on a transient error wait and run it again, up to ``attempts`` calls.

    Backoff is exponential with full jitter: before retry ``n`` (1-based) it sleeps a uniform
    random time in ``[0, min(max_delay, base_delay * 2 ** (n - 1))]``, so many instances that
    failed together do not come back together. A permanent error is raised at once; when the
    attempts are used up the last error is raised unchanged (its type and traceback intact).

    Only for operations that are SAFE to repeat: connecting, a heartbeat, a completion write
    fenced by the run's token. A job's own SQL is never retried here within one delivery: a
    transient job error is re-raised so the queue redelivers the message, which re-checks the
    token and counts the attempt.

    ``on_retry(attempt, info, delay)`` is called before each sleep (attempt = the call that
    failed, 1-based). ``rng`` exists so tests can fix the jitter.
    """
    if attempts < 1:
        raise ValueError(f"retry_transient(what={what!r}): attempts={attempts!r}: expected an integer >= 1")
    if base_delay < 0 or max_delay < 0:
        raise ValueError(
            f"retry_transient(what={what!r}): base_delay={base_delay!r}, max_delay={max_delay!r}: "
            "expected delays >= 0 seconds"
        )
    draw = (rng or random).uniform
    attempt = 1
    while True:
        try:
            return operation()
        except Exception as exc:  # BaseException (KeyboardInterrupt, SystemExit) is never retried
            info = classify(exc)
            if info.kind != TRANSIENT or attempt >= attempts:
                if info.kind == TRANSIENT:
                    # INFO: the caller reports the error itself (an operator's command in one line).
                    _log.info("%s: giving up after %d attempts: %s", what, attempt, info.message)
                raise
            cap = min(max_delay, base_delay * (2 ** (attempt - 1)))
            delay = draw(0.0, cap)
            _log.warning(
                "%s: transient error (attempt %d of %d), retrying in %.2fs: %s",
                what, attempt, attempts, delay, info.message,
            )
            if on_retry is not None:
                on_retry(attempt, info, delay)
            sleep(delay)
            attempt += 1


# --- pyodbc -------------------------------------------------------------------------------------


def _odbc_args(exc: BaseException) -> tuple[str | None, str] | None:
    """(sqlstate, message) when ``exc`` looks like a pyodbc error, else None.

    Shape-based so pyodbc need not be imported; a pyodbc.Error with an unusual args shape is
    recognised through its class when pyodbc is already loaded.
    """
    args = exc.args
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str) and _SQLSTATE_RE.match(args[0]):
        return args[0], args[1]
    pyodbc = sys.modules.get("pyodbc")
    if pyodbc is not None and isinstance(exc, pyodbc.Error):
        text = " ".join(str(a) for a in args) if args else type(exc).__name__
        found = _RECORD_STATE_RE.match(text)
        return (found.group(1) if found else None), text
    return None


def _parse_odbc(sqlstate: str | None, message: str) -> list[OdbcRecord]:
    records: list[OdbcRecord] = []
    for raw in _RECORD_SPLIT_RE.split(message):
        state = sqlstate if not records else None
        found = _RECORD_STATE_RE.match(raw)
        if found:
            state = found.group(1)
            raw = raw[found.end():]
        native: int | None = None
        trailer = _TRAILER_RE.search(raw)
        if trailer:
            native = int(trailer.group(1))
            raw = raw[: trailer.start()]
        else:
            function_only = _FUNCTION_ONLY_RE.search(raw)
            if function_only:
                raw = raw[: function_only.start()]
        microsoft = any(marker in raw for marker in _MICROSOFT_MARKERS)
        driver_manager = any(marker in raw for marker in _DRIVER_MANAGER_MARKERS)
        body = _PREFIX_RE.sub("", raw)
        postgres = bool(_POSTGRES_MARKERS.search(body)) or (state is not None and "P" in state)
        trusted = microsoft or not (postgres or driver_manager)
        # psqlODBC appends ";\nError while executing the query" (or a bare ";"): remove that one
        # separator, never a ';' that ends the server's own message.
        noise = _PSQLODBC_NOISE_RE.search(body)
        text = body[: noise.start()] if noise else body
        text = _SEVERITY_RE.sub("", text.strip())
        text = _SPACES_RE.sub(" ", text).strip()
        if not noise and text.endswith(";"):
            text = text[:-1].strip()
        records.append(OdbcRecord(state, native, text, trusted))
    return records


def _sqlserver_numbers(records: list[OdbcRecord]) -> list[int]:
    # 0 is "no native error" (driver-side messages such as "Login timeout expired (0)").
    return [r.native for r in records if r.trusted and r.native is not None and r.native > 0]


def _one_line(records: list[OdbcRecord]) -> str:
    """The records' texts, each once, as one line ("A. B." or "A; B" when A has no full stop)."""
    line = ""
    seen: set[str] = set()
    for record in records:
        if not record.text or record.text in seen:
            continue
        seen.add(record.text)
        if line:
            line += " " if line.endswith((".", "!", "?", "。")) else "; "
        line += record.text
    return line


def _classify_odbc(sqlstate: str | None, message: str) -> SqlErrorInfo:
    records = _parse_odbc(sqlstate, message)
    numbers = _sqlserver_numbers(records)
    states = [r.sqlstate for r in records if r.sqlstate]
    first_state = sqlstate or (states[0] if states else None)
    text = _one_line(records) or message.strip()

    lost = (
        any(s.startswith("08") or s in _CONNECTION_LOST_SQLSTATES for s in states)
        or any(n in _CONNECTION_LOST_NUMBERS for n in numbers)
        or bool(_CONNECTION_LOST_TEXT.search(text))
    )
    transient_numbers = [n for n in numbers if n in TRANSIENT_SQLSERVER_NUMBERS]
    if transient_numbers:
        return SqlErrorInfo(TRANSIENT, transient_numbers[0], first_state, text, lost)
    number = numbers[0] if numbers else None
    if any(n in PERMANENT_SQLSERVER_NUMBERS for n in numbers):
        return SqlErrorInfo(PERMANENT, number, first_state, text, lost)
    if any(_transient_sqlstate(s) for s in states) and not _pg_permanent_connect(records):
        return SqlErrorInfo(TRANSIENT, number, first_state, text, lost)
    if BABELFISH_UNMAPPED_NUMBER in numbers and _BABELFISH_TRANSIENT_TEXT.search(text):
        return SqlErrorInfo(TRANSIENT, number, first_state, text, lost)
    if _FREETDS_LOST_TEXT.search(text):
        # The session is gone without a SQL Server error saying why: a network error.
        return SqlErrorInfo(TRANSIENT, number, first_state, text, lost)
    return SqlErrorInfo(PERMANENT, number, first_state, text, lost)


def _transient_sqlstate(state: str) -> bool:
    return state in _TRANSIENT_SQLSTATES or state.startswith(_TRANSIENT_SQLSTATE_CLASSES)


def _pg_permanent_connect(records: list[OdbcRecord]) -> bool:
    return any(
        not r.trusted and pattern.search(r.text)
        for r in records
        for pattern in _PG_PERMANENT_CONNECT_TEXTS
    )


# --- sqlite3 and plain Python -------------------------------------------------------------------


def _classify_sqlite(exc: sqlite3.Error) -> SqlErrorInfo:
    text = _SPACES_RE.sub(" ", str(exc)).strip() or type(exc).__name__
    name = getattr(exc, "sqlite_errorname", "") or ""
    lowered = text.lower()
    locked = (
        "database is locked" in lowered
        or "database table is locked" in lowered
        or name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    )
    return SqlErrorInfo(TRANSIENT if locked else PERMANENT, None, None, text)


# Local file-system errors are OSError too, but retrying a missing file does not help.
_PERMANENT_OSERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
# azure-core exceptions (by name, so azure.core is not imported): failing to reach Entra ID or
# a storage endpoint is transient; a rejected credential is not.
_AZURE_TRANSIENT = frozenset({"ServiceRequestError", "ServiceResponseError", "ServiceRequestTimeoutError",
                              "ServiceResponseTimeoutError", "IncompleteReadError"})
_AZURE_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _classify_python(exc: BaseException) -> SqlErrorInfo:
    detail = _SPACES_RE.sub(" ", str(exc)).strip()
    text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    if isinstance(exc, ConnectionError):
        return SqlErrorInfo(TRANSIENT, None, None, text, connection_lost=True)
    if isinstance(exc, TimeoutError):
        return SqlErrorInfo(TRANSIENT, None, None, text)
    if isinstance(exc, OSError) and not isinstance(exc, _PERMANENT_OSERRORS):
        return SqlErrorInfo(TRANSIENT, None, None, text)
    azure_names = {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.startswith("azure.core")}
    if azure_names & _AZURE_TRANSIENT:
        return SqlErrorInfo(TRANSIENT, None, None, text)
    if "HttpResponseError" in azure_names and getattr(exc, "status_code", None) in _AZURE_TRANSIENT_STATUS:
        return SqlErrorInfo(TRANSIENT, None, None, text)
    return SqlErrorInfo(PERMANENT, None, None, text)
