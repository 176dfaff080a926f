"""Typed values of a run's life: its status (agent.runs.status), the outcome of one execution
(what the executor returns for a delivery or a claimed run) and the error of a failed attempt.

The enums subclass ``str`` (Python 3.10 has no ``enum.StrEnum``): a member equals, hashes,
binds as a query parameter and serialises to JSON as its value, so the database, the SQL files,
the JSON output and the telemetry keep the very same strings; ``str()`` and f-strings give the
bare value too, as log lines and messages always printed it.

Part of the job model: imports nothing from the database, the queue, Azure or telemetry
(pyproject.toml's import contracts keep it so).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RunStatus(str, Enum):
    """agent.runs.status, as every dialect's schema allows it."""

    PENDING = "pending"        # waiting for its time (or a retry, or a start slot)
    QUEUED = "queued"          # dispatched: its message is on the queue
    RUNNING = "running"        # a worker holds its lease
    WAITING = "waiting"        # a fleet step: its target executions run, the run waits for them
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    POISONED = "poisoned"
    SKIPPED = "skipped"        # overlap skip, misfire
    CANCELLED = "cancelled"

    __str__ = str.__str__


class Outcome(str, Enum):
    """What one execution (a queue delivery, or a run claimed in direct mode) came to."""

    SUCCEEDED = "succeeded"
    RETRY_SCHEDULED = "retry_scheduled"   # failed; another attempt later (MAX_ATTEMPTS not spent)
    FAILED = "failed"
    POISONED = "poisoned"                 # taken out of circulation (the message, and the run when current)
    TRANSIENT = "transient"               # a transient error in direct mode: retried later, no attempt spent
    STALE = "stale"                       # a message whose token the run has moved past
    DUPLICATE = "duplicate"               # a second delivery of the current token
    LEASE_LOST = "lease_lost"             # fenced: the lease was taken over or the run cancelled
    EARLY = "early"                       # came before its slot: re-sent for the rest of the wait
    HELD = "held"                         # may not start yet: back to pending
    SKIPPED = "skipped"                   # overlap skip, misfire
    DOORBELL = "doorbell"                 # planned and dispatched, ran nothing
    FANNED_OUT = "fanned_out"             # a fleet step: its target executions were created

    __str__ = str.__str__


# The outcomes that end a run one way or the other (the notifier then has news to deliver).
RUN_ENDING_OUTCOMES = frozenset({Outcome.SUCCEEDED, Outcome.FAILED, Outcome.POISONED})


@dataclass(frozen=True)
class AttemptError:
    """Why an attempt failed. ``kind``: "transient" (no attempt spent: redelivered or retried)
    or "permanent" as shared.control.sqlerrors classifies errors, or "timeout" (the job's
    TIMEOUT_SECONDS ran out); ``number`` and ``sqlstate``: the driver's, when there are any."""

    kind: str
    number: int | None
    sqlstate: str | None
    message: str

    @property
    def transient(self) -> bool:
        return self.kind == "transient"

    @property
    def timed_out(self) -> bool:
        return self.kind == "timeout"

    @property
    def attempt_outcome(self) -> str:
        """The attempt's outcome as agent.attempts records a spent attempt."""
        return "timeout" if self.timed_out else "failed"
