"""One clock: the control database's.

Every time the engine stores or compares (leases and their expiry, claims, dispatch, misfire)
is the control database's time — PostgreSQL ``clock_timestamp()``, SQL Server
``SYSUTCDATETIME()``, SQLite's clock in the process that owns the file — never this instance's
wall clock. Reading the database for every statement would cost a round trip each, so the
clock reads it once (one statement, ``database_time``), notes ``time.monotonic()`` at the end
of that round trip, and from then on answers that reading plus the monotonic time elapsed,
reading the database again at least every ``resync_seconds`` (and at every tick, which reads
it anyway). It lags the database's clock by at most one round trip (never runs ahead of it),
plus the monotonic clock's drift over ``resync_seconds`` (parts per million): milliseconds. An instance whose wall clock is an
hour behind, or jumps back while it runs, still stores and compares the database's time, and
its timers (monotonic) keep firing.

The instance's wall clock is read only to report how far it is off (``instance_skew``).

An explicit clock given to :class:`shared.engine.agent.Agent` (tests, simulations) replaces this one:
that is the test hook. An operator's ``tick --now`` is accepted only within
AGENT_MAX_CLOCK_SKEW_SECONDS of this clock.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

log = logging.getLogger(__name__)
UTC = timezone.utc
# How old a reading of the database's clock may grow before the next call reads it again.
RESYNC_SECONDS = 60.0


def as_utc(value: Any) -> datetime:
    """A ``database_time`` answer (SQLite answers text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"the database's clock answered {value!r}, not a date and time")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def wall_now() -> datetime:
    """This instance's wall clock (reported, never stored or compared)."""
    return datetime.now(UTC)


class DatabaseClock:
    """The control database's time, read at most every ``resync_seconds`` and carried forward
    by ``time.monotonic()`` in between. Thread-safe; one per process."""

    def __init__(self, new_store: Callable[[], Any], *, resync_seconds: float = RESYNC_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._new_store = new_store
        self._store: Any = None
        self._monotonic = monotonic
        self.resync_seconds = resync_seconds
        self._lock = threading.Lock()
        self._anchor: tuple[datetime, float] | None = None   # (database time, monotonic then)
        self.reads = 0
        # The instance's wall clock minus the database's, at the last reading (seconds).
        self.instance_skew: float | None = None

    def __call__(self) -> datetime:
        anchor = self._anchor
        if anchor is None or self._monotonic() - anchor[1] >= self.resync_seconds:
            anchor = self.sync()
        database, at = anchor
        return database + timedelta(seconds=self._monotonic() - at)

    def sync(self) -> tuple[datetime, float]:
        """Read the database's clock now (one statement on the clock's own connection). If the
        database cannot be reached and an earlier reading exists, that reading carries on (the
        work that needs the time needs the database too, and will say why it failed)."""
        with self._lock:
            anchor = self._anchor
            if anchor is not None and self._monotonic() - anchor[1] < min(1.0, self.resync_seconds):
                return anchor   # another thread read it a moment ago
            try:
                if self._store is None:
                    self._store = self._new_store()
                self._store.connection   # connected first: the round trip timed is the statement's alone
                value = self._store.execute("database_time").scalar()
                after = self._monotonic()
            except Exception:
                if self._anchor is not None:
                    log.warning("could not read the database's clock; carrying the last reading forward",
                                exc_info=True)
                    return self._anchor
                raise
            finally:
                # The clock holds no connection between readings (one a minute at most).
                if self._store is not None:
                    self._store.close()
                    self._store = None
            # Marked at the end of the round trip: the clock may lag the database's by that round
            # trip, never run ahead of it (a slot is never started before its time).
            return self._set(as_utc(value), after)

    def observe(self, database: datetime, at: float) -> None:
        """A reading of the database's clock made elsewhere (the tick reads it anyway)."""
        with self._lock:
            self._set(as_utc(database), at)

    def _set(self, database: datetime, at: float) -> tuple[datetime, float]:
        self._anchor = (database, at)
        self.reads += 1
        self.instance_skew = (wall_now() - database).total_seconds() - (self._monotonic() - at)
        return self._anchor

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def seconds_until(self, moment: datetime) -> float:
        """How long to wait (on the monotonic clock) until the database's clock shows ``moment``."""
        return (moment - self()).total_seconds()
