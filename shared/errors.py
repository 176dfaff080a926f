"""Every exception the engine raises on purpose, in one place."""

from __future__ import annotations

from typing import Any


class AgentError(Exception):
    """Base class: an error the agent explains in one line (the CLI prints it, no traceback)."""


class ConfigError(AgentError):
    """A setting or command argument is invalid. The message names the setting, the value and
    what is expected."""

    def __init__(self, setting: str, value: object, expected: str) -> None:
        self.setting = setting
        self.value = value
        self.expected = expected
        shown = "<missing>" if value is None else repr(value)
        super().__init__(f"{setting}={shown}: expected {expected}")


class _Located:
    """An error that may name the argument (setting), the value given and what is expected:
    the command line's --json errors carry them."""

    def __init__(self, message: str, *, setting: str | None = None, value: object = None,
                 expected: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.value = value
        self.expected = expected


class UsageError(_Located, AgentError):
    """A command was called with arguments that do not fit (exit code 2)."""


class SchemaError(AgentError):
    """The control database has no schema, or one newer than this code knows."""


class QueueError(AgentError):
    """The queue service could not be reached or refused an operation."""


class MessageError(AgentError):
    """A queue message is malformed: it goes to the poison table at once, never retried."""


class TransientJobError(AgentError):
    """A job failed with a transient error. Raised out of the queue trigger so the queue
    redelivers the message (after the host's visibility timeout)."""

    def __init__(self, run_id: int, message: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id}: transient error, the queue will redeliver: {message}")


class NotFoundError(_Located, AgentError):
    """A job, run or poison message named on the command line does not exist."""


class OwnerError(AgentError):
    """The principal a job runs as (its owner, who defined it from T-SQL, or
    AGENT_JOB_PRINCIPAL) cannot run it: dropped, or no longer reachable by the agent. The
    message names the principal; the run fails (permanent, never retried into poison)."""


class LeaseLost(AgentError):
    """The run's token moved on while this worker held it: fenced off (the caller rolls back)."""


class PageError(AgentError):
    """A request the monitor answers with an error page (status and one-line message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotificationError(AgentError):
    """A webhook POST failed (refused, timed out, or answered with an error status)."""


class ScriptError(AgentError, ValueError):
    """A SQL Server Agent script that cannot be read (a syntax the tokenizer refuses, a procedure
    call cut short)."""


class ConnectError(AgentError):
    """Connecting to a database failed; ``cause`` is the driver's exception (for the classifier).
    ``control_database`` is False for a job's own DATABASE (where "cannot open database" is a
    configuration error, not a transient one)."""

    def __init__(self, message: str, cause: BaseException, *, control_database: bool = True) -> None:
        super().__init__(message)
        self.cause = cause
        self.control_database = control_database


class PoolTimeout(AgentError):
    pass


class TransactionControlRefused(AgentError):
    """A job's SQL tried to end (or take over) the agent's transaction."""


class QueueSendError(QueueError):
    """Sending a batch stopped part way. Bodies go out one by one in order, so exactly the
    first `sent` of `total` are on the queue; the dispatcher puts the rest back to pending."""

    def __init__(self, message: str, *, sent: int, total: int) -> None:
        super().__init__(message)
        self.sent = sent
        self.total = total


class PartialDispatchError(QueueError):
    """The queue refused some of a dispatch: ``dispatched`` holds the runs whose messages went out."""

    def __init__(self, message: str, dispatched: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.dispatched = dispatched


class ClockSkewError(AgentError):
    """The tick's time is further from the database's clock than AGENT_MAX_CLOCK_SKEW_SECONDS."""
