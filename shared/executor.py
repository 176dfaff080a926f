"""The executor: one queue message in, one fenced attempt of one run out.

1. validate the message (malformed, unknown run, forged token → poison at once)
2. start the run only if the message's token is still current (else: stale/duplicate, ack)
3. a heartbeat on its own connection renews the lease; if the lease was taken over (or the
   run cancelled) it cancels the work
4. the job's SQL runs in a transaction bounded by the job's timeout
5. completion is conditional on the token; for work in the control database it commits in
   the same transaction as the work, so a fenced-off worker's work rolls back
6. failures are classified: transient → re-raise so the queue redelivers (poison at the
   dequeue-count threshold); permanent → retry with backoff (new token) or fail
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from .config import Settings
from .errors import MessageError, TransientJobError
from .messages import decode_body, parse_message
from .store import Store

log = logging.getLogger("shared.executor")
UTC = timezone.utc
MAX_BACKOFF_SECONDS = 3600


class LeaseLost(Exception):
    """The run's token moved on while this worker held it: fenced off."""


@dataclass(frozen=True)
class ExecutionResult:
    outcome: str          # succeeded | retry_scheduled | failed | poisoned | stale | duplicate | lease_lost
    run_id: int | None = None
    detail: str = ""


class Executor:
    def __init__(self, *, settings: Settings, store: Callable[[], Store], new_store: Callable[[], Store],
                 target_store: Callable[[str], Store], telemetry: Any,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.settings = settings
        self._store = store
        self._new_store = new_store
        self._target_store = target_store
        self.telemetry = telemetry
        self.clock = clock or (lambda: datetime.now(UTC))
        self.worker = settings.agent.worker_id

    # ------------------------------------------------------------ entry point

    def handle(self, body: str | bytes, dequeue_count: int, message_id: str | None = None) -> ExecutionResult:
        """Process one delivery. Returns normally when the message should be deleted;
        raises TransientJobError when the queue should deliver it again."""
        max_dequeue = self.settings.agent.max_dequeue_count
        try:
            text = decode_body(body)
            message = parse_message(text)
        except MessageError as exc:
            shown = body if isinstance(body, str) else body.decode("utf-8", errors="replace")
            return self._poison(run_id=None, token=None, body=shown, dequeue_count=dequeue_count,
                                message_id=message_id, reason=f"malformed message: {exc}", operation_id=None)
        store = self._store()
        if dequeue_count > max_dequeue:
            # Deliveries that never reached a verdict (e.g. a worker crash loop) still end here.
            return self._poison(run_id=message.run_id, token=message.token, body=text, dequeue_count=dequeue_count,
                                message_id=message_id, operation_id=message.operation_id,
                                reason=f"dequeue count {dequeue_count} is above AGENT_MAX_DEQUEUE_COUNT={max_dequeue}")
        now = self.clock()
        with store.transaction():
            started = store.execute("start_run", run_id=message.run_id, token=message.token, now=now,
                                    worker=self.worker, dequeue_count=dequeue_count).one()
            if started:
                store.execute("insert_attempt", run_id=message.run_id, attempt=started["attempt"],
                              token=message.token, worker=self.worker, dequeue_count=dequeue_count, now=now)
        if not started:
            return self._not_started(message, text, dequeue_count, message_id)
        return self._execute(started, text, dequeue_count, message_id)

    def _not_started(self, message, text: str, dequeue_count: int, message_id: str | None) -> ExecutionResult:
        run = self._store().execute("get_run", run_id=message.run_id).one()
        if run is None:
            return self._poison(run_id=message.run_id, token=None, body=text, dequeue_count=dequeue_count,
                                message_id=message_id, operation_id=message.operation_id,
                                reason=f"unknown run {message.run_id}")
        if message.token > run["token"]:
            return self._poison(run_id=message.run_id, token=None, body=text, dequeue_count=dequeue_count,
                                message_id=message_id, operation_id=message.operation_id, job=run["job_name"],
                                reason=f"token {message.token} was never issued (run {message.run_id} is at token {run['token']})")
        kind = "stale" if message.token < run["token"] else "duplicate"
        detail = (f"run {message.run_id}: message token {message.token}, run token {run['token']}, "
                  f"status {run['status']}: acknowledged without running ({kind})")
        log.info(detail)
        self.telemetry.event("StaleMessage", {"job": run["job_name"] or "(task)", "run_id": message.run_id,
                                              "token": message.token, "outcome": kind,
                                              "scheduled_for": run["scheduled_for"]},
                             operation_id=message.operation_id or run["operation_id"])
        return ExecutionResult(kind, message.run_id, detail)

    # ------------------------------------------------------------ the attempt

    def _execute(self, run: dict[str, Any], body: str, dequeue_count: int, message_id: str | None) -> ExecutionResult:
        from .sqlerrors import classify

        store = self._store()
        run_id, token, attempt = run["run_id"], run["token"], run["attempt"]
        operation_id = run["operation_id"]
        properties = {"job": run["job_name"] or "(task)", "run_id": run_id, "attempt": attempt, "token": token,
                      "scheduled_for": run["scheduled_for"], "kind": run["kind"]}
        lag = (run["started_at"] - run["scheduled_for"]).total_seconds()
        self.telemetry.event("RunStarted", {**properties, "outcome": "running"}, operation_id=operation_id)
        self.telemetry.metric("ScheduleLagSeconds", max(0.0, lag), {"job": properties["job"]}, operation_id=operation_id)

        same_database = not run["target_database"]
        work_store = store if same_database else self._target_store(run["target_database"])
        guard = _Guard(work_store)
        heartbeat = _Heartbeat(self._new_store, run_id, token, run["lease_seconds"], self.clock, guard)
        watchdog = threading.Timer(run["timeout_seconds"], guard.trip, args=("timeout",))
        watchdog.daemon = True
        started = time.perf_counter()
        heartbeat.start()
        watchdog.start()
        store.operation_id = operation_id
        try:
            with work_store.transaction(immediate=False):
                with self.telemetry.sql_call(properties["job"], target=work_store.target.display,
                                             operation_id=operation_id, data=run["command"][:1000]):
                    work_store.run_script(run["command"])
                if same_database:
                    self._complete(store, run_id, token)
            if not same_database:
                # Work in another database has committed: at-least-once from here on.
                from .sqlerrors import retry_transient

                retry_transient(lambda: self._complete_alone(run_id, token), what=f"completing run {run_id}")
        except LeaseLost:
            return self._fenced(run, properties, operation_id, "completion refused: the run's token moved on")
        except Exception as exc:
            if guard.reason == "lease":
                return self._fenced(run, properties, operation_id, "work cancelled: the lease was taken over")
            info = classify(exc)
            if guard.reason == "timeout":
                error = ("timeout", None, None, f"timed out after {run['timeout_seconds']} s (JOB TIMEOUT_SECONDS)")
            else:
                error = (info.kind, info.number, info.sqlstate, info.message)
            return self._failed(run, body, dequeue_count, message_id, error, properties, operation_id)
        finally:
            store.operation_id = None
            watchdog.cancel()
            heartbeat.stop()
            if not same_database:
                work_store.close()
        duration_ms = (time.perf_counter() - started) * 1000
        log.info("run %s (%s) attempt %s succeeded in %.0f ms", run_id, properties["job"], attempt, duration_ms)
        self.telemetry.event("RunSucceeded", {**properties, "outcome": "succeeded", "duration_ms": round(duration_ms)},
                             operation_id=operation_id)
        self.telemetry.metric("RunDurationMs", duration_ms, {"job": properties["job"]}, operation_id=operation_id)
        self.telemetry.metric("DequeueCount", dequeue_count, {"job": properties["job"]}, operation_id=operation_id)
        return ExecutionResult("succeeded", run_id)

    def _complete(self, store: Store, run_id: int, token: int) -> None:
        now = self.clock()
        if store.execute("complete_run", run_id=run_id, token=token, now=now).rowcount != 1:
            raise LeaseLost()
        store.execute("finish_attempt", run_id=run_id, token=token, now=now, outcome="succeeded",
                      error_number=None, error_sqlstate=None, error_message=None)

    def _complete_alone(self, run_id: int, token: int) -> None:
        store = self._store()
        with store.transaction():
            self._complete(store, run_id, token)

    def _fenced(self, run: dict[str, Any], properties: dict[str, Any], operation_id: str, why: str) -> ExecutionResult:
        store = self._store()
        try:
            store.execute("finish_attempt", run_id=run["run_id"], token=run["token"], now=self.clock(),
                          outcome="lease_lost", error_number=None, error_sqlstate=None, error_message=why)
        except Exception as exc:  # history only; the run itself is already someone else's
            log.warning("run %s: could not record the fenced attempt: %s", run["run_id"], exc)
        log.warning("run %s attempt %s (token %s): %s; its work was rolled back", run["run_id"], run["attempt"],
                    run["token"], why)
        self.telemetry.event("RunFailed", {**properties, "outcome": "lease_lost", "error_message": why},
                             operation_id=operation_id)
        return ExecutionResult("lease_lost", run["run_id"], why)

    def _failed(self, run: dict[str, Any], body: str, dequeue_count: int, message_id: str | None,
                error: tuple[str, int | None, str | None, str], properties: dict[str, Any],
                operation_id: str) -> ExecutionResult:
        kind, number, sqlstate, message = error
        store = self._store()
        run_id, token, attempt = run["run_id"], run["token"], run["attempt"]
        now = self.clock()
        failure = {**properties, "error_number": number, "error_message": message}
        if kind == "transient":
            if dequeue_count >= self.settings.agent.max_dequeue_count:
                return self._poison(run_id=run_id, token=token, body=body, dequeue_count=dequeue_count,
                                    message_id=message_id, operation_id=operation_id,
                                    reason=f"transient error on delivery {dequeue_count} of "
                                           f"AGENT_MAX_DEQUEUE_COUNT={self.settings.agent.max_dequeue_count}: {message}",
                                    attempt_error=error, job=properties["job"])
            lease_until = now + timedelta(seconds=self.settings.agent.dispatch_lease_seconds)
            with store.transaction():
                store.execute("finish_attempt", run_id=run_id, token=token, now=now, outcome="transient",
                              error_number=number, error_sqlstate=sqlstate, error_message=message)
                requeued = store.execute("requeue_transient", run_id=run_id, token=token, lease_until=lease_until,
                                         error_number=number, error_message=message).rowcount
            if not requeued:
                return self._fenced(run, properties, operation_id, f"transient error after the lease moved on: {message}")
            log.warning("run %s attempt %s: transient error, the queue will redeliver: %s", run_id, attempt, message)
            self.telemetry.event("RunRetried", {**failure, "outcome": "redeliver"}, operation_id=operation_id)
            raise TransientJobError(run_id, message)
        retry_at = now + timedelta(seconds=self.backoff_seconds(attempt))
        outcome = "timeout" if kind == "timeout" else "failed"
        with store.transaction():
            store.execute("finish_attempt", run_id=run_id, token=token, now=now, outcome=outcome,
                          error_number=number, error_sqlstate=sqlstate, error_message=message)
            row = store.execute("fail_run", run_id=run_id, token=token, now=now, retry_at=retry_at,
                                error_number=number, error_message=message).one()
        if row is None:
            return self._fenced(run, properties, operation_id, f"failed after the lease moved on: {message}")
        if row["status"] == "pending":
            log.warning("run %s attempt %s/%s failed (%s); retry at %s", run_id, attempt, row["max_attempts"],
                        message, retry_at.isoformat())
            self.telemetry.event("RunRetried", {**failure, "outcome": "retry_scheduled",
                                                "retry_at": retry_at}, operation_id=operation_id)
            return ExecutionResult("retry_scheduled", run_id, message)
        log.error("run %s failed after %s attempt(s): %s", run_id, attempt, message)
        self.telemetry.event("RunFailed", {**failure, "outcome": "failed"}, operation_id=operation_id)
        return ExecutionResult("failed", run_id, message)

    def backoff_seconds(self, attempt: int) -> float:
        base = self.settings.agent.retry_backoff_seconds
        return float(min(MAX_BACKOFF_SECONDS, base * (2 ** max(0, attempt - 1))))

    # ------------------------------------------------------------ poison

    def _poison(self, *, run_id: int | None, token: int | None, body: str, dequeue_count: int,
                message_id: str | None, reason: str, operation_id: str | None,
                attempt_error: tuple[str, int | None, str | None, str] | None = None,
                job: str | None = None) -> ExecutionResult:
        """Take the message out of circulation: keep its body and every error, mark the run
        (only when this message holds its current token) and return normally, so the host
        deletes the message instead of retrying it."""
        store = self._store()
        now = self.clock()
        with store.transaction():
            if attempt_error is not None and token is not None:
                kind, number, sqlstate, message = attempt_error
                store.execute("finish_attempt", run_id=run_id, token=token, now=now, outcome="poisoned",
                              error_number=number, error_sqlstate=sqlstate, error_message=message)
            errors: list[dict[str, Any]] = []
            if run_id is not None:
                for row in store.execute("list_run_errors", run_id=run_id).rows:
                    errors.append({key: (value.isoformat() if isinstance(value, datetime) else value)
                                   for key, value in row.items()})
            errors.append({"outcome": "poisoned", "error_message": reason, "at": now.isoformat()})
            poison_id = store.execute("insert_poison", run_id=run_id, message_id=message_id, body=body,
                                      dequeue_count=dequeue_count, reason=reason,
                                      errors=json.dumps(errors), now=now).scalar()
            marked = 0
            if token is not None and run_id is not None:
                marked = store.execute("poison_run", run_id=run_id, token=token, now=now, reason=reason).rowcount
        log.error("message %s poisoned (poison id %s, run %s): %s", message_id or "-", poison_id, run_id, reason)
        self.telemetry.event("RunPoisoned", {"job": job, "run_id": run_id, "token": token,
                                             "dequeue_count": dequeue_count,
                                             "outcome": "poisoned" if marked else "message_poisoned",
                                             "error_message": reason, "poison_id": poison_id},
                             operation_id=operation_id)
        return ExecutionResult("poisoned", run_id, reason)


class _Guard:
    """Cancels the running statement once, and remembers why (timeout or lost lease)."""

    def __init__(self, work_store: Store) -> None:
        self._store = work_store
        self._lock = threading.Lock()
        self.reason: str | None = None

    def trip(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        self._store.cancel()


class _Heartbeat:
    """Renews the lease every lease/3 seconds on its own connection. Zero rows renewed means
    the token moved on: the work is cancelled. A failed renewal (database unreachable) is
    retried at the next beat; the tick, not this thread, decides that a lease expired."""

    def __init__(self, new_store: Callable[[], Store], run_id: int, token: int, lease_seconds: int,
                 clock: Callable[[], datetime], guard: _Guard) -> None:
        self._new_store = new_store
        self._run_id = run_id
        self._token = token
        self._interval = max(1.0, lease_seconds / 3.0)
        self._clock = clock
        self._guard = guard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        store: Store | None = None
        try:
            while not self._stop.wait(self._interval):
                try:
                    if store is None:
                        store = self._new_store()
                    renewed = store.execute("heartbeat_run", run_id=self._run_id, token=self._token,
                                            now=self._clock()).rowcount
                except Exception as exc:
                    log.warning("run %s: heartbeat failed (will retry): %s", self._run_id, exc)
                    if store is not None:
                        store.close()
                        store = None
                    continue
                if renewed == 0 and not self._stop.is_set():
                    log.warning("run %s: lease taken over (token %s is no longer current); cancelling the work",
                                self._run_id, self._token)
                    self._guard.trip("lease")
                    return
        finally:
            if store is not None:
                store.close()
