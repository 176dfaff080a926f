"""One thread per process renews the leases of every run the process holds, in one statement,
and enforces each run's timeout. No thread per run.

A run missing from a renewal's result was taken over (its lease lapsed and another worker got
a new token) or cancelled: its work is stopped at once, and its completion would be refused
anyway (fencing). A renewal that fails (the database is unreachable) is retried at the next
beat; the tick, not this thread, decides that a lease lapsed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from shared.control.sqlerrors import describe

log = logging.getLogger(__name__)
# How often deadlines are checked: a run's timeout is enforced within this much.
CHECK_SECONDS = 0.25


@dataclass(eq=False)
class HeldRun:
    run_id: int
    token: int
    lease_seconds: int
    deadline: float                  # time.monotonic() at which the run times out
    cancel: Callable[[], None]       # stops the statement the run is executing
    reason: str | None = None        # why it was stopped: "timeout" or "lease"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def trip(self, reason: str) -> bool:
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
        try:
            self.cancel()
        except Exception as exc:  # noqa: BLE001 - cancelling is best effort; the fence still holds
            log.warning("run %s: could not cancel its statement (%s)", self.run_id, describe(exc))
        return True


class Supervisor:
    def __init__(self, new_store: Callable[[], object], clock: Callable[[], datetime]) -> None:
        self._new_store = new_store
        self._clock = clock
        self._held: dict[int, HeldRun] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_renewal = 0.0
        self.renewals = 0

    def hold(self, run_id: int, token: int, *, lease_seconds: int, timeout_seconds: int,
             cancel: Callable[[], None]) -> HeldRun:
        held = HeldRun(run_id, token, lease_seconds, time.monotonic() + timeout_seconds, cancel)
        with self._lock:
            first = time.monotonic() + _interval(lease_seconds)
            # A short run never renews: the first renewal is a third of a lease away.
            self._next_renewal = first if not self._held else min(self._next_renewal, first)
            self._held[run_id] = held
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="agent-supervisor", daemon=True)
                self._thread.start()
        return held

    def release(self, held: HeldRun) -> None:
        with self._lock:
            if self._held.get(held.run_id) is held:
                del self._held[held.run_id]

    def held(self) -> list[HeldRun]:
        with self._lock:
            return list(self._held.values())

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # ------------------------------------------------------------ the thread

    def _loop(self) -> None:
        store = None
        try:
            while not self._stop.is_set():
                self._wake.wait(CHECK_SECONDS)
                self._wake.clear()
                now = time.monotonic()
                for held in self.held():
                    if now >= held.deadline and held.trip("timeout"):
                        log.warning("run %s: timed out; its statement was cancelled", held.run_id)
                with self._lock:
                    due = bool(self._held) and now >= self._next_renewal
                if not due:
                    continue
                store = self._renew(store)
        finally:
            if store is not None:
                store.close()

    def _renew(self, store):
        held = self.held()
        if not held:
            return store
        interval = min(_interval(h.lease_seconds) for h in held)
        try:
            if store is None:
                store = self._new_store()
            rows = store.execute("renew_leases", held=[{"run_id": h.run_id, "token": h.token} for h in held],
                                 now=self._clock()).rows
            self.renewals += 1
        except Exception as exc:  # noqa: BLE001 - retried at the next beat
            log.warning("lease renewal of %d run(s) failed (retried in %.0f s): %s", len(held), interval,
                        describe(exc))
            if store is not None:
                store.close()
            with self._lock:
                self._next_renewal = time.monotonic() + min(interval, 2.0)
            return None
        renewed = {row["run_id"] for row in rows}
        for entry in held:
            if entry.run_id not in renewed:
                with self._lock:
                    still_held = self._held.get(entry.run_id) is entry
                if still_held and entry.trip("lease"):
                    log.warning("run %s: its lease was taken over or the run cancelled (token %s is no longer "
                                "current); its work was stopped", entry.run_id, entry.token)
        with self._lock:
            self._next_renewal = time.monotonic() + interval
        # Back to the process's pool (its share for renewals stays reserved): no connection is
        # held between renewals, and none at all once no run is held.
        store.close()
        return store


def _interval(lease_seconds: int) -> float:
    return max(1.0, lease_seconds / 3.0)
