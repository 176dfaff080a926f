"""The audit trail (issue 32 item 4): who did what, from where, when, with which arguments, and
whether it was done or refused — one row of agent.audit per operator action.

An operator action (shared/engine/operations.py) runs inside :func:`audited`: the row is written
by :meth:`Audit.transaction` as the last statement of the action's own transaction, so the row
and the change commit together or not at all. When the action is refused (a bad argument, an
unknown job, a run in the wrong state, a permission or driver error) its transaction rolled back,
and :func:`audited` writes one row 'refused' with the error, in a small transaction of its own:
never a second row for one action. A connection lost at the COMMIT itself (the action may or may
not have committed) is settled by asking afterwards whether the row 'done' committed: one row
either way, 'done', or 'refused' saying the commit was lost and did not happen (see
:meth:`Audit.transaction`). The agent's T-SQL/PL/pgSQL procedures write their own rows
(source 'tsql', migration 0017). The monitor's actions (issue 32 item 5) will come through here
with source 'monitor' and the signed-in principal.

The hot path (claims, starts and ends of runs) writes no row.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from shared.control.store import Store

log = logging.getLogger(__name__)

# agent.audit.arguments: the JSON document is kept under this many characters (a longer one has
# its longest strings cut until it fits, so it stays one valid document).
MAX_ARGUMENTS_LENGTH = 4000
MAX_DETAIL_LENGTH = 2000


class AuditAction(str, Enum):
    """What an operator did (agent.audit.action)."""
    SUBMIT = "submit"                      # sql-agent submit, agent.exec_async
    RUN_NOW = "run-now"                    # sql-agent run-now, agent.start_job
    BACKFILL = "backfill"                  # sql-agent backfill
    STOP = "stop"                          # sql-agent stop, agent.stop_job
    CANCEL = "cancel"                      # sql-agent cancel, agent.cancel_run
    PAUSE = "pause"                        # sql-agent pause, agent.pause_job
    RESUME = "resume"                      # sql-agent resume, agent.resume_job
    REQUEUE = "requeue"                    # sql-agent poison requeue, agent.requeue_poison
    DEFINE = "define"                      # agent.add_scheduled_job
    REMOVE = "remove"                      # agent.remove_scheduled_job
    ENABLE = "enable"                      # agent.enable_job @enabled = 1
    DISABLE = "disable"                    # agent.enable_job @enabled = 0
    DEFINE_CALENDAR = "define-calendar"    # agent.add_calendar
    REMOVE_CALENDAR = "remove-calendar"    # agent.remove_calendar
    SET_CALENDARS = "set-calendars"        # agent.set_job_calendars
    SET_PARAMS = "set-params"              # agent.set_job_params
    IMPORT = "import"                      # sql-agent import-sqlagent --apply
    GRANT = "grant"                        # sql-agent grant-sql --apply (and --operator --apply)
    DEFINE_ALERT = "define-alert"          # agent.add_alert
    REMOVE_ALERT = "remove-alert"          # agent.remove_alert


class AuditSource(str, Enum):
    """Where the action came from (agent.audit.source)."""
    CLI = "cli"
    TSQL = "tsql"
    MONITOR = "monitor"
    ALERT = "alert"        # a condition alert's RESPONSE_JOB (shared/engine/condition_alerts.py)


class AuditOutcome(str, Enum):
    DONE = "done"
    REFUSED = "refused"


@dataclass(frozen=True)
class Actor:
    """Who acts, from where. ``principal``: None asks the database (the connection's login:
    session_user on PostgreSQL, ORIGINAL_LOGIN() on SQL Server; on SQLite, which has none, the
    operating system's user); the monitor names its signed-in Entra principal."""
    source: AuditSource
    client: str
    os_user: str
    principal: str | None = None


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:       # no user name in this environment (a container without one)
        return "(unknown user)"


def command_line_actor() -> Actor:
    """The command line: the operating system's user on this host, this process."""
    user = _os_user()
    return Actor(source=AuditSource.CLI, client=f"{user}@{socket.gethostname()} (sql-agent, pid {os.getpid()})",
                 os_user=user)


def bounded_arguments(arguments: dict[str, Any]) -> str:
    """The arguments as one JSON document of at most MAX_ARGUMENTS_LENGTH characters: the longest
    string values are cut (marked with "…") until it fits; always valid JSON."""
    values = {key: (value.isoformat() if isinstance(value, datetime) else value)
              for key, value in arguments.items() if value is not None}
    text = json.dumps(values, ensure_ascii=False, default=str)
    while len(text) > MAX_ARGUMENTS_LENGTH:
        strings = [(len(v), k) for k, v in values.items() if isinstance(v, str) and len(v) > 16]
        if not strings:
            return json.dumps({"truncated": True})
        _, longest = max(strings)
        excess = len(text) - MAX_ARGUMENTS_LENGTH
        keep = max(16, len(values[longest]) - excess - 16)
        values[longest] = values[longest][:keep] + "…"
        text = json.dumps(values, ensure_ascii=False, default=str)
    return text


@dataclass
class Audit:
    """One operator action being audited: what :func:`audited` yields."""
    store: Store
    actor: Actor
    action: AuditAction
    now: datetime
    arguments: dict[str, Any]
    job_name: str | None = None
    run_id: int | None = None
    detail: str | None = None
    recorded: bool = field(default=False, init=False)
    _written: bool = field(default=False, init=False)
    audit_id: int | None = field(default=None, init=False)     # the row 'done' as written (not yet committed)
    # The commit was lost with the connection: what was found afterwards (the refused row says it),
    # or None while nothing is known.
    lost_commit: str | None = field(default=None, init=False)
    commit_unknown: bool = field(default=False, init=False)

    def params(self, outcome: AuditOutcome, detail: str | None) -> dict[str, Any]:
        return {"now": self.now, "principal": self.actor.principal, "fallback_principal": self.actor.os_user,
                "client": self.actor.client, "source": self.actor.source.value, "action": self.action.value,
                "job_name": self.job_name, "run_id": self.run_id, "arguments": bounded_arguments(self.arguments),
                "audit_outcome": outcome.value, "detail": (detail or None) and detail[:MAX_DETAIL_LENGTH]}

    def write(self) -> None:
        """Inside the action's transaction, as its last statement: the row 'done'."""
        if self._written:
            raise AssertionError(f"audit row of {self.action.value} written twice")
        result = self.store.execute("insert_audit", **self.params(AuditOutcome.DONE, self.detail))
        row = result.one() if getattr(result, "returns_rows", False) else None
        self.audit_id = int(row["audit_id"]) if row and row.get("audit_id") is not None else None
        self._written = True

    def rewind(self) -> None:
        """The transaction that held the row rolled back and the action tries again."""
        self._written = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Store]:
        """The action's transaction, its audit row written at its end (when the body did not
        raise); ``recorded`` once it committed.

        When the COMMIT itself fails (the connection lost while the server commits: it may have
        committed or not), the database is asked afterwards, on a new connection, whether the
        row 'done' is there: then the action committed and goes on as done (one row, 'done');
        else it did not, and :func:`audited` writes its one row 'refused' saying so. When that
        cannot be asked either, nothing more is written (a row 'refused' could contradict a row
        'done' that committed): the error is raised, and logged as of unknown outcome."""
        at_commit = False
        try:
            with self.store.transaction():
                yield self.store
                self.write()
                at_commit = True
        except BaseException as exc:
            if not at_commit or not _connection_lost(exc) or not self._committed_after_all(exc):
                raise
        self.recorded = True

    def _committed_after_all(self, exc: BaseException) -> bool:
        """The COMMIT raised ``exc``: whether the transaction committed all the same (its row is there)."""
        lost = _error_text(exc)
        if self.audit_id is None:
            found = None
        else:
            try:
                found = self.store.execute("audit_row_committed", audit_id=self.audit_id, action=self.action.value,
                                           now=self.now).one()
            except Exception as failure:     # the database is still out of reach: nobody can tell
                self.commit_unknown = True
                log.error("audit: %s: the connection was lost at its commit (%s) and whether it committed could not "
                          "be checked (%s): outcome unknown, no row written; see agent.audit for a row 'done' of "
                          "%s at %s", self.action.value, lost, _error_text(failure), self.action.value,
                          self.now.isoformat())
                return False
        if found is not None:
            log.warning("audit: %s: the connection was lost at its commit (%s); checked afterwards: it committed "
                        "(audit row %s 'done')", self.action.value, lost, self.audit_id)
            return True
        self.lost_commit = (f"unknown at first: the connection was lost at its commit ({lost}); checked afterwards "
                            "on a new connection: it did not commit (its row 'done' is not there)")
        return False

    def done(self) -> None:
        """The action committed without a transaction of its own (a procedure call on another
        connection, grants on other databases): its row alone, now. When writing it fails, the
        action stays done all the same: no row 'refused' contradicts it (the failure is raised,
        and logged as a row 'done' that may be missing)."""
        try:
            self.write()
        except BaseException as exc:
            self.commit_unknown = True
            log.error("audit: %s was done, but its row 'done' could not be written (%s): it may be missing from "
                      "agent.audit", self.action.value, _error_text(exc))
            raise
        self.recorded = True


@contextlib.contextmanager
def audited(store: Store, actor: Actor | None, action: AuditAction, *, now: datetime,
            arguments: dict[str, Any], job_name: str | None = None, run_id: int | None = None) -> Iterator[Audit]:
    """Run one operator action: one row 'done' (written by the action through
    :meth:`Audit.transaction` or :meth:`Audit.done`) or, when it raised before its row
    committed, one row 'refused' with the error, in a transaction of its own after the
    rollback. The error itself is raised unchanged; a refused row that cannot be written (the
    database is gone) is logged, never hides it."""
    audit = Audit(store=store, actor=actor or command_line_actor(), action=action, now=now, arguments=arguments,
                  job_name=job_name, run_id=run_id)
    try:
        yield audit
    except (Exception, KeyboardInterrupt) as exc:     # Ctrl-C before the commit: refused, "interrupted"
        if audit.recorded or getattr(exc, AUDITED_MARK, False):
            raise
        if audit.commit_unknown:        # logged: a row 'refused' could contradict a 'done' that committed
            with contextlib.suppress(Exception):
                setattr(exc, AUDITED_MARK, True)
            raise
        try:
            store.execute("insert_audit", **audit.params(AuditOutcome.REFUSED, audit.lost_commit or _error_text(exc)))
            with contextlib.suppress(Exception):    # a front end's own check (record_refusal) knows
                setattr(exc, AUDITED_MARK, True)
        except Exception as failure:   # never hide the action's own error
            log.warning("audit: the refused %s could not be recorded: %s", action.value, failure)
        raise
    if not audit.recorded:
        raise AssertionError(f"operator action {action.value} ended without its audit row")


# Set on an exception whose refusal is recorded already: one row per action, however many layers
# the error passes on its way out.
AUDITED_MARK = "_sql_agent_audited"


def record_refusal(store: Store | None, actor: Actor | None, action: AuditAction, *, clock: Callable[[], datetime],
                   arguments: dict[str, Any], error: BaseException, job_name: str | None = None) -> None:
    """A front end refused an action before it reached its operation (grant-sql --apply on a
    database that cannot take it, an unreadable import-sqlagent --apply script): its one row
    'refused', unless the operation recorded it already, or there is no audit table (then
    ``clock``, the database's, is not even asked)."""
    if getattr(error, AUDITED_MARK, False) or store is None:
        return
    with contextlib.suppress(Exception):
        if not audit_trail_exists(store):
            return
        with audited(store, actor, action, now=clock(), arguments=arguments, job_name=job_name):
            raise error
    with contextlib.suppress(Exception):
        setattr(error, AUDITED_MARK, True)


def audit_trail_exists(store: Store) -> bool:
    """Whether the control database has the audit table (its migration applied): grant-sql may run
    before init-db, when there is nothing to write the row to."""
    from shared.control.queries import load_migrations

    target = getattr(store, "target", None)
    if store.dialect == "sqlite" and target is not None and target.location != ":memory:" \
            and not os.path.exists(target.location):
        return False            # asking would create the file: a refused command leaves no database behind
    try:
        version = next(m.version for m in load_migrations(store.dialect) if m.description == "audit")
        return store.schema_version() >= version
    except Exception:       # no schema at all
        return False


@contextlib.contextmanager
def audited_if_installed(store: Store | None, actor: Actor | None, action: AuditAction, *, now: datetime,
                         arguments: dict[str, Any]) -> Iterator[Audit | None]:
    """:func:`audited` when the control database has the audit table; else (grant-sql before
    init-db, or no store) the action runs unaudited and None is yielded."""
    if store is None or not audit_trail_exists(store):
        yield None
        return
    with audited(store, actor, action, now=now, arguments=arguments) as audit:
        yield audit


def _connection_lost(exc: BaseException) -> bool:
    """A failure after which the connection is gone (the store reconnects): at a COMMIT, the
    transaction may have committed or not. Any other failure of a COMMIT (a serialization
    failure, a deferred constraint) rolled it back."""
    from shared.control.sqlerrors import classify

    info = classify(exc)
    return bool(info.sqlstate and info.sqlstate.startswith(("08", "57P"))) or info.connection_lost


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted before it committed (Ctrl-C)"
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())[:MAX_DETAIL_LENGTH]
