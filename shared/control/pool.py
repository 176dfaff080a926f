"""The process's connection budget: every connection this process opens to the control database
goes through one ConnectionPool, which never holds more than AGENT_MAX_CONNECTIONS at once.

* **Opened when there is work.** A Store takes a connection on its first statement and gives it
  back when it is closed (the local runner's workers give theirs back after each claim, run or
  look-ahead; a Functions invocation after each message or tick). An idle connection waits in
  the pool for the next taker and is closed after ``idle_seconds`` without one, by a reaper
  thread that runs only while idle connections exist: a quiet process holds none.
* **One budget, three shares.** ``lease`` (the supervisor renewing every lease the process
  holds) and ``clock`` (the database clock's reading, one statement a minute) have one
  connection each, always available to them; everything else (workers, ticks, the notifier,
  the monitor) shares the rest (``limit - 2``). Without the reserve, workers holding every
  connection through long runs would starve the renewal that keeps their leases alive, and a
  worker asking the time while holding a connection could wait for itself.
* **A refusal backs off.** When the server refuses a new connection (PostgreSQL: "too many
  clients" / "too many connections for role"; SQL Server and Azure SQL: errors 10928, 10929,
  10936, its request or session limit), no one in this process opens another for a while
  (1-2 s with full jitter, doubling per refusal in a row up to 15 s): takers wait for a
  connection the process already has to come back, so the process keeps working on what the
  server gave it and other clients (other processes, operators) keep their places. The
  places the process holds idle in the other shares are given up to the one refused (a
  reserved share refused gets an idle work connection closed for it). With none of its share
  open, the taker tries again after each pause, for up to AGENT_CONNECT_RETRY_SECONDS, then
  raises the refusal.
* **Never a connection inside a transaction.** A connection given back with a transaction open
  (``in_transaction``: the dialect's own test, without a round trip) is closed, not lent again:
  the next taker would run its statements inside that transaction and hold its locks (the start
  lock: every other worker waits on it), and the server rolls back what a closed connection
  left. That is a bug of the caller's, logged as an error.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from shared.control.sqlerrors import classify, describe, diagnostic_records
from shared.errors import PoolTimeout

log = logging.getLogger("shared.control.pool")

# Shares of the budget reserved for one connection each (see the module's docstring).
RESERVED_KINDS = ("lease", "clock")
WORK = "work"
MIN_CONNECTIONS = len(RESERVED_KINDS) + 1
IDLE_SECONDS = 60.0
# A refusal's pause: from BACKOFF_BASE_SECONDS doubling per refusal in a row, at most
# BACKOFF_MAX_SECONDS, drawn with full jitter in [pause/2, pause].
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 15.0
# A taker waiting this long for a connection says so (and again after as long again).
WAIT_NOTE_SECONDS = 60.0

# PostgreSQL's refusals (SQLSTATE 53300, which psqlODBC reports as 08001 with the text) and the
# reserved-slot variant a non-superuser meets when only the reserved places are left.
_PG_REFUSAL = re.compile(r"too many clients|too many connections for (role|database)|"
                         r"remaining connection slots are reserved", re.IGNORECASE)
# SQL Server / Azure SQL: 10928 (request or session limit of the database), 10929 (its minimum
# guarantee only), 10936 (the elastic pool's request limit).
REFUSAL_NUMBERS = frozenset({10928, 10929, 10936})


def is_refusal(exc: BaseException) -> bool:
    """The server refused a connection because it (or this login) has too many: worth a pause,
    not an alarm."""

    records = diagnostic_records(exc)
    if any(r.trusted and r.native in REFUSAL_NUMBERS for r in records):
        return True
    if any(_PG_REFUSAL.search(r.text) for r in records):
        return True
    info = classify(exc)
    return info.number in REFUSAL_NUMBERS or bool(_PG_REFUSAL.search(info.message or str(exc)))


@dataclass
class PoolStats:
    limit: int
    open: int
    idle: int
    peak: int
    opened: int
    refusals: int


class ConnectionPool:
    """At most ``limit`` connections from ``connect`` open at once, lent to Stores (see the
    module's docstring). Thread-safe; one per process (per Agent)."""

    def __init__(self, connect: Callable[[], Any], limit: int, *, idle_seconds: float = IDLE_SECONDS,
                 retry_seconds: float = 90.0, close: Callable[[Any], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 in_transaction: Callable[[Any], bool] | None = None) -> None:
        if limit < MIN_CONNECTIONS:
            raise ValueError(f"a connection pool needs at least {MIN_CONNECTIONS} connections, not {limit}")
        self._connect = connect
        self._close_raw = close or _close
        self._in_transaction = in_transaction or (lambda connection: False)
        self.limit = limit
        self._idle_seconds = idle_seconds
        self.retry_seconds = retry_seconds
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._caps = {WORK: limit - len(RESERVED_KINDS), **{kind: 1 for kind in RESERVED_KINDS}}
        self._open = {kind: 0 for kind in self._caps}
        self._idle: dict[str, list[tuple[Any, float]]] = {kind: [] for kind in self._caps}
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # The reaper sleeps on a condition of its own (the same lock) until the oldest idle
        # connection ages out: woken when the pool closes, or when a connection given back would
        # age out before that (idle_seconds lowered), never on every give. Sharing _cond, it was
        # woken on every connection given back, a second thread and a GIL handoff per run.
        self._reaper_wake = threading.Condition(lock)
        self._reaper_until: float | None = None    # when the reaper looks next (monotonic)
        self._paused_until = 0.0        # after a refusal: no new connection before this
        self._refusals_in_row = 0
        # A reserved share (lease, clock) refused by the server while the workers hold every
        # connection it allows: an idle work connection is closed to make room for it.
        self._room = 0           # places made for reserved takers (they may open despite a pause)
        self._room_wanted = 0    # reserved takers waiting for a work connection to come back
        self._reaper: threading.Thread | None = None
        self._closed = False
        self.peak = 0
        self.opened = 0
        self.refusals = 0
        self.refused_back = 0    # connections given back inside a transaction (closed instead)
        # What its connections' Stores keep for every connection of the pool (one login, one
        # database): the job's search_path and when it was read (Store._job_search_path).
        self.job_search_path: tuple[str, float] | None = None

    @property
    def idle_seconds(self) -> float:
        """How long an idle connection is kept before the reaper closes it."""
        return self._idle_seconds

    @idle_seconds.setter
    def idle_seconds(self, seconds: float) -> None:
        with self._cond:
            self._idle_seconds = seconds
            self._reaper_wake.notify_all()     # its next look may be due sooner now

    # ------------------------------------------------------------ lending

    def take(self, kind: str = WORK, wait_seconds: float | None = None) -> Any:
        """A connection for ``kind``: an idle one, or a new one within the budget; waits for one
        to come back when the share is used up (at most ``wait_seconds``, None: as long as it
        takes). Raises the server's refusal after AGENT_CONNECT_RETRY_SECONDS of refusals with
        nothing open, PoolTimeout after ``wait_seconds``."""
        cap = self._caps[kind]
        deadline = None if wait_seconds is None else self._monotonic() + wait_seconds
        refused_since: float | None = None
        waiting_since, next_note = self._monotonic(), WAIT_NOTE_SECONDS
        while True:
            stale: list[Any] = []
            with self._cond:
                while True:
                    now = self._monotonic()
                    stale.extend(self._stale(now))
                    idle = self._idle[kind]
                    if idle:
                        connection = idle.pop()[0]    # the most recently used: the others age out
                        break
                    made = kind != WORK and self._room > 0
                    if self._open[kind] < cap and (now >= self._paused_until or made):
                        if made:
                            self._room -= 1
                        self._open[kind] += 1
                        self.peak = max(self.peak, self._total_open())
                        connection = None
                        break
                    if deadline is not None and now >= deadline:
                        self._close_all(stale)
                        raise PoolTimeout(f"all {cap} of this process's {kind} connections to the control database "
                                          f"stayed in use for {wait_seconds:.0f} s (AGENT_MAX_CONNECTIONS="
                                          f"{self.limit})")
                    # Woken when a connection comes back or the pause ends; re-checked every
                    # second at most (a bounded wait, never a lost wake-up).
                    until = [1.0]
                    if deadline is not None:
                        until.append(deadline - now)
                    if now < self._paused_until:
                        until.append(self._paused_until - now)
                    self._cond.wait(max(0.001, min(until)))
                    if now - waiting_since >= next_note:
                        next_note += WAIT_NOTE_SECONDS
                        log.warning("waiting %.0f s for a %s connection to the control database: all %d in use "
                                    "(AGENT_MAX_CONNECTIONS=%d)", now - waiting_since, kind, cap, self.limit)
            self._close_all(stale)
            if connection is not None:
                return connection
            try:
                connection = self._connect()
            except BaseException as exc:
                with self._cond:
                    self._open[kind] -= 1
                    self._cond.notify_all()
                if not is_refusal(exc):
                    raise
                now = self._monotonic()
                refused_since = now if refused_since is None else refused_since
                pause = self._refused(now, exc)
                self._make_room(kind)
                with self._cond:
                    # None of this share will come back to take: after AGENT_CONNECT_RETRY_SECONDS
                    # of refusals, the refusal is the answer.
                    nothing_open = self._open[kind] == 0
                if nothing_open and now - refused_since + pause > self.retry_seconds:
                    raise
                continue
            with self._cond:
                self.opened += 1
                self._refusals_in_row = 0
            return connection

    def give(self, kind: str, connection: Any) -> None:
        """Back to the pool, for the next taker (closed after ``idle_seconds`` unused); closed
        instead when it is inside a transaction (see the module's docstring)."""
        try:
            open_transaction = self._in_transaction(connection)
        except Exception:  # noqa: BLE001 - a connection that cannot say is not lent again either
            open_transaction = True
        if open_transaction:
            with self._cond:
                self.refused_back += 1
            log.error("a %s connection to the control database was given back inside a transaction: closed "
                      "instead of lent again (the server rolls back what it held)", kind)
            self.discard(kind, connection)
            return
        with self._cond:
            if kind == WORK and self._room_wanted > 0 and not self._closed:
                self._room_wanted -= 1
                self._room += 1
                self._open[kind] -= 1
                self._cond.notify_all()
                closing = True
            else:
                closing = False
        if closing:
            self._close_raw(connection)
            return
        with self._cond:
            if not self._closed:
                now = self._monotonic()
                self._idle[kind].append((connection, now))
                self._cond.notify_all()
                if self._reaper_until is not None and now + self.idle_seconds < self._reaper_until:
                    self._reaper_wake.notify()
                self._start_reaper()
                return
            self._open[kind] -= 1
        self._close_raw(connection)

    def discard(self, kind: str, connection: Any, *, wait_seconds: float | None = None) -> None:
        """A connection that may be broken (or in an unknown state): closed, its place freed.
        ``wait_seconds``: how long to wait for the pool's lock at most (a finalizer's call: it
        must never block, and at interpreter exit the reaper, a daemon thread, can be frozen
        holding the lock for good); the connection is closed either way."""
        if self._cond.acquire(timeout=-1 if wait_seconds is None else wait_seconds):
            try:
                self._open[kind] -= 1
                self._cond.notify_all()
            finally:
                self._cond.release()
        self._close_raw(connection)

    # ------------------------------------------------------------ refusals

    def _make_room(self, kind: str) -> None:
        """``kind`` was refused while the server's places are this process's own: a reserved
        share gets an idle work connection closed for it (now, or the next one given back); the
        work share gets the reserved shares' idle connections closed (they reopen on demand)."""
        victims: list[Any] = []
        with self._cond:
            if kind == WORK:
                for reserved in RESERVED_KINDS:
                    victims.extend(connection for connection, _ in self._idle[reserved])
                    self._open[reserved] -= len(self._idle[reserved])
                    self._idle[reserved] = []
            elif self._idle[WORK]:
                victims.append(self._idle[WORK].pop(0)[0])     # the least recently used
                self._open[WORK] -= 1
                self._room += 1
            else:
                self._room_wanted = min(self._room_wanted + 1, len(RESERVED_KINDS))
            if victims:
                self._cond.notify_all()
        self._close_all(victims)

    def _refused(self, now: float, exc: BaseException) -> float:
        """Pause the whole process's opening after a refusal; returns the pause (seconds)."""
        with self._cond:
            self.refusals += 1
            self._refusals_in_row += 1
            ceiling = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (self._refusals_in_row - 1))
            pause = self._rng.uniform(ceiling / 2, ceiling)
            self._paused_until = max(self._paused_until, now + pause)
            open_now = self._total_open()
        log.warning("the control database refused a connection (%d open in this process, AGENT_MAX_CONNECTIONS=%d): "
                    "no new connection for %.1f s, working with those open: %s", open_now, self.limit, pause,
                    _one_line(exc))
        return pause

    # ------------------------------------------------------------ idle connections

    def _stale(self, now: float) -> list[Any]:
        """Under the lock: remove and return the idle connections unused for idle_seconds."""
        stale: list[Any] = []
        for kind, idle in self._idle.items():
            keep = [(c, since) for c, since in idle if now - since < self.idle_seconds]
            if len(keep) != len(idle):
                stale.extend(c for c, since in idle if now - since >= self.idle_seconds)
                self._open[kind] -= len(idle) - len(keep)
                self._idle[kind] = keep
        if stale:
            self._cond.notify_all()
        return stale

    def _start_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name="agent-pool-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Close idle connections as they age out; ends when none is idle."""
        while True:
            with self._cond:
                now = self._monotonic()
                stale = self._stale(now)
                since = [at for idle in self._idle.values() for _, at in idle]
                if self._closed or not since:
                    self._reaper = None
                else:
                    self._reaper_until = min(since) + self.idle_seconds
                    self._reaper_wake.wait(max(0.05, self._reaper_until - now))
                    self._reaper_until = None
            self._close_all(stale)
            if not since or self._closed:
                return

    def _close_all(self, connections: list[Any]) -> None:
        for connection in connections:
            self._close_raw(connection)
        connections.clear()

    def _total_open(self) -> int:
        return sum(self._open.values())

    # ------------------------------------------------------------ whole pool

    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(self.limit, self._total_open(), sum(len(i) for i in self._idle.values()), self.peak,
                             self.opened, self.refusals)

    def close(self) -> None:
        """Close every idle connection; connections still lent are closed when given back."""
        with self._cond:
            self._closed = True
            idle = [c for kind in self._idle for c, _ in self._idle[kind]]
            for kind in self._idle:
                self._open[kind] -= len(self._idle[kind])
                self._idle[kind] = []
            self._cond.notify_all()
            self._reaper_wake.notify_all()
        self._close_all(idle)


def _close(connection: Any) -> None:
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - closing a broken connection
        pass


def _one_line(exc: BaseException) -> str:

    return describe(exc)
