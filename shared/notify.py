"""Notifications: a run's outcome POSTed as JSON to a webhook, once per run outcome.

SQL Server Agent notifies operators when a job fails, succeeds or completes; here each job's
``NOTIFY`` (``on_failure`` by default, ``on_success``, ``on_completion``, ``never``) says which
outcomes go to its webhook (``JOB__<name>__NOTIFY_WEBHOOK_URL``, else
``AGENT_NOTIFY_WEBHOOK_URL``). Email goes through Azure Monitor instead (infra/alerts.bicep).

An outbox: ``enqueue_notifications`` writes one row per run outcome in the very transaction
that ends the run (the unique run_id makes a second enqueue a no-op), so an outcome is never
notified without having happened, nor lost once it happened. Delivery happens afterwards, off
every worker's path: one daemon thread per process (``Notifier``), woken when a run ends and
by each tick, claims due rows under a new claim token (two processes never send the same row),
POSTs each with a bounded timeout, and records every attempt on the row: sent, retried later
(at most ``MAX_DELIVERY_ATTEMPTS`` in all) or failed for good. A failure to notify is logged
and recorded; it never changes the run and never holds a worker. A process that dies in the
middle of a POST leaves the row claimed; once its claim expires another process sends it
(the one case where a receiver may see a notification twice).
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from .config import Settings
from .sqlerrors import describe

log = logging.getLogger("shared.notify")
UTC = timezone.utc
DELIVERY_TIMEOUT_SECONDS = 5.0
MAX_DELIVERY_ATTEMPTS = 3
# Wait before the 2nd and the 3rd attempt.
RETRY_DELAYS_SECONDS = (10, 60)
# A claim outlives the slowest delivery of a batch by far; then another process may take it.
CLAIM_SECONDS = 300
BATCH = 20
# Retries come due without a run ending: the thread looks this often.
POLL_SECONDS = 10.0


def notifications_enabled(settings: Settings) -> bool:
    """Whether any webhook is configured (otherwise the outbox is never written)."""
    return bool(settings.agent.notify_webhook_url or any(job.notify_webhook_url for job in settings.jobs))


def enqueue_calls(settings: Settings, now: datetime) -> list[tuple[str, dict[str, Any]]]:
    """The named query that writes the outbox rows of the runs a transaction ends at ``now``
    (to chain into that transaction), or nothing when no webhook is configured."""
    if not notifications_enabled(settings):
        return []
    return [("enqueue_notifications", {"now": now, "default_url": settings.agent.notify_webhook_url})]


def notification_body(notification: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """What the webhook receives."""
    started, finished = run.get("first_started_at"), run.get("finished_at")
    duration = round((finished - started).total_seconds(), 3) if started and finished else None
    outcome = notification["outcome"]
    return {
        "job": notification["job_name"],
        "run_id": notification["run_id"],
        "slot": _iso(run.get("scheduled_for")),
        "outcome": outcome,
        "failing_step": run.get("failed_step") if outcome != "succeeded" else None,
        "error": run.get("last_error") if outcome != "succeeded" else None,
        "error_number": run.get("last_error_number") if outcome != "succeeded" else None,
        "duration_seconds": duration,
        "finished_at": _iso(finished),
        # Application Insights: operation_Id == this value finds the run's events and SQL.
        "operation_id": run.get("operation_id"),
    }


def post_json(url: str, body: dict[str, Any], timeout: float) -> None:
    """POST ``body``; raises with a one-line reason unless the answer is 2xx."""
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "sql-agent-notifier/1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - validated URL
            response.read(65536)
    except urllib.error.HTTPError as exc:
        raise NotificationError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise NotificationError(f"no answer within {timeout:g} s or refused: {reason}") from None


class NotificationError(Exception):
    pass


class Notifier:
    """One per process: delivers the outbox in a daemon thread."""

    def __init__(self, new_store: Callable[[], Any], clock: Callable[[], datetime], *,
                 post: Callable[[str, dict[str, Any], float], None] = post_json,
                 timeout_seconds: float = DELIVERY_TIMEOUT_SECONDS, poll_seconds: float = POLL_SECONDS) -> None:
        self._new_store = new_store
        self._clock = clock
        self._post = post
        self.timeout_seconds = timeout_seconds
        self.poll_seconds = poll_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._flushing = False

    def wake(self) -> None:
        """Deliver soon (a run ended, or a tick came): never waits."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="agent-notifier", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self, flush_seconds: float = 0.0) -> None:
        """Stop the thread; with ``flush_seconds``, first let it deliver what is due for at most
        that long (the local commands end right after their last run)."""
        thread = self._thread
        if thread is None:
            return
        if flush_seconds > 0 and thread.is_alive():
            self._flushing = True      # one more pass over what is due, then the thread ends
            self._wake.set()
            thread.join(timeout=flush_seconds)
        self._stop.set()
        self._wake.set()
        if thread is not threading.current_thread():
            thread.join(timeout=self.timeout_seconds + 1)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.wait(self.poll_seconds)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    while self.deliver_due() and not self._stop.is_set():
                        pass
                except Exception as exc:  # noqa: BLE001 - retried at the next wake
                    log.warning("notifications: delivery pass failed (retried later): %s", describe(exc))
                    self._close_store()
                if self._flushing:
                    break
        finally:
            self._close_store()

    def _close_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def deliver_due(self) -> int:
        """One pass: claim up to BATCH due notifications, POST each, record each attempt.
        Returns how many were claimed (0: nothing is due)."""
        if self._store is None:
            self._store = self._new_store()
        store = self._store
        now = self._clock()
        token = uuid.uuid4().hex
        claimed = store.execute("claim_notifications", now=now, claim_token=token,
                                claimed_until=now + timedelta(seconds=CLAIM_SECONDS), batch=BATCH).rows
        if not claimed:
            return 0
        runs = {row["run_id"]: row for row in store.execute(
            "notification_runs", run_ids=[n["run_id"] for n in claimed]).rows}
        for notification in claimed:
            self._deliver(store, notification, runs.get(notification["run_id"], {}), token)
        return len(claimed)

    def _deliver(self, store: Any, notification: dict[str, Any], run: dict[str, Any], token: str) -> None:
        body = notification_body(notification, run)
        attempts = notification["attempts"]
        error = None
        try:
            self._post(notification["url"], body, self.timeout_seconds)
        except Exception as exc:  # noqa: BLE001 - recorded on the row, never raised into a run
            error = str(exc) or type(exc).__name__
        now = self._clock()
        if error is None:
            status, next_at = "sent", now
            log.info("notification of run %s (%s, %s) sent", notification["run_id"], notification["job_name"],
                     notification["outcome"])
        elif attempts >= MAX_DELIVERY_ATTEMPTS:
            status, next_at = "failed", now
            log.error("notification of run %s (%s, %s) to %s failed for good after %s attempts: %s",
                      notification["run_id"], notification["job_name"], notification["outcome"],
                      _shown(notification["url"]), attempts, error)
        else:
            status = "pending"
            next_at = now + timedelta(seconds=RETRY_DELAYS_SECONDS[min(attempts, len(RETRY_DELAYS_SECONDS)) - 1])
            log.warning("notification of run %s (%s) to %s: attempt %s of %s failed (%s); retry at %s",
                        notification["run_id"], notification["job_name"], _shown(notification["url"]), attempts,
                        MAX_DELIVERY_ATTEMPTS, error, next_at.isoformat())
        # Recorded one by one, right after its POST (not once per batch): a process that dies
        # later in the batch does not send this one again.
        recorded = store.execute("finish_notification", notification_id=notification["notification_id"],
                                 claim_token=token, status=status, next_attempt_at=next_at,
                                 last_error=error, now=now).rows
        if not recorded:
            log.warning("notification %s: its claim expired before the attempt was recorded",
                        notification["notification_id"])


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def _shown(url: str) -> str:
    """A URL for the log: scheme, host and path (a query string may carry a secret)."""
    return url.split("?", 1)[0]
