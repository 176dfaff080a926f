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
POSTs each within one total deadline (``DELIVERY_DEADLINE_SECONDS``, however slowly the
receiver answers: shared/webhooks.py), signed per Standard Webhooks when
``AGENT_NOTIFY_WEBHOOK_SECRET`` is set, and records every attempt on the row: sent, retried
later (at most ``MAX_DELIVERY_ATTEMPTS`` in all) or failed for good. A failure to notify is
logged and recorded; it never changes the run and never holds a worker.

Never sent twice by two processes: a claim lasts longer than the longest POSTs of a whole batch
(``claim_seconds`` derives it from the deadline), and a POST starts only while what is left of
its claim covers its deadline and a margin for clocks and the database (else the rest of the
batch waits for the claim to expire and is sent by whoever claims it next). A process that dies
in the middle of a POST leaves the row claimed; once its claim expires another process sends
it: the one case where a receiver may see a notification twice, with the same ``webhook-id``
(its idempotency key).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from .config import Settings
from .sqlerrors import describe

log = logging.getLogger("shared.notify")
UTC = timezone.utc
# One POST, from connecting to the answer's headers, whatever the receiver does (Standard
# Webhooks recommends receivers answer within 15-30 s: answer first, work after); the default
# of AGENT_NOTIFY_TIMEOUT_SECONDS.
DELIVERY_DEADLINE_SECONDS = 15.0
MAX_DELIVERY_ATTEMPTS = 3
# Wait before the 2nd and the 3rd attempt.
RETRY_DELAYS_SECONDS = (10, 60)
BATCH = 20
# What a claim keeps beyond the POSTs themselves: the database calls of a batch, and clocks of
# processes that disagree by up to this much.
CLAIM_MARGIN_SECONDS = 60


def claim_seconds(deadline_seconds: float, batch: int = BATCH) -> int:
    """How long a claim lasts: every POST of a batch at its deadline, plus the margin. Another
    process takes a row only after its claim expired, so only once its sender is surely done
    with it (or dead)."""
    if deadline_seconds <= 0 or batch <= 0:
        raise ValueError(f"a POST deadline and a batch must be positive (got {deadline_seconds}, {batch})")
    return int(batch * deadline_seconds + 2 * CLAIM_MARGIN_SECONDS) + 1


CLAIM_SECONDS = claim_seconds(DELIVERY_DEADLINE_SECONDS)
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
        # A run its flow failed (quit_failure after a step that failed, then others that ran)
        # ends with no error of its own: the failing step's last error is the one to tell.
        "error": (run.get("last_error") or run.get("failed_step_error")) if outcome != "succeeded" else None,
        "error_number": (run.get("last_error_number") if run.get("last_error") else run.get("failed_step_error_number"))
        if outcome != "succeeded" else None,
        "duration_seconds": duration,
        "finished_at": _iso(finished),
        # Application Insights: operation_Id == this value finds the run's events and SQL.
        "operation_id": run.get("operation_id"),
    }


def message_id(notification: dict[str, Any], run: dict[str, Any]) -> str:
    """The notification's ``webhook-id``: the same on every attempt, unique across runs (and
    across agents sharing a receiver: a run's operation id is random)."""
    operation = run.get("operation_id")
    if operation and all(ch.isalnum() or ch in "-_" for ch in str(operation)):
        return f"msg_{operation}"
    return f"msg_run{int(notification['run_id'])}"


def post_json(url: str, body: dict[str, Any], deadline: float, *, message_id: str,
              key: bytes | None = None) -> None:
    """POST ``body`` (compact JSON, the bytes signed are the bytes sent) with its Standard
    Webhooks headers; raises WebhookError with a one-line reason unless the answer is 2xx."""
    from .webhooks import post, webhook_headers

    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    post(url, data, webhook_headers(message_id, int(time.time()), data, key), deadline)


class Notifier:
    """One per process: delivers the outbox in a daemon thread."""

    def __init__(self, new_store: Callable[[], Any], clock: Callable[[], datetime], *,
                 post: Callable[..., None] = post_json, secret: bytes | None = None,
                 timeout_seconds: float = DELIVERY_DEADLINE_SECONDS, poll_seconds: float = POLL_SECONDS) -> None:
        """``timeout_seconds``: each POST's total deadline; the claim is derived from it.
        ``secret``: the Standard Webhooks signing key (None: unsigned)."""
        self._new_store = new_store
        self._clock = clock
        self._post = post
        self._secret = secret
        self.timeout_seconds = timeout_seconds
        self.claim_seconds = claim_seconds(timeout_seconds)
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
        claimed_until = now + timedelta(seconds=self.claim_seconds)
        claimed = store.execute("claim_notifications", now=now, claim_token=token,
                                claimed_until=claimed_until, batch=BATCH).rows
        if not claimed:
            return 0
        runs = {row["run_id"]: row for row in store.execute(
            "notification_runs", run_ids=[n["run_id"] for n in claimed]).rows}
        # A POST starts only while its claim outlasts it by the margin: otherwise another process
        # could claim the row again while this one is still sending it.
        needed = timedelta(seconds=self.timeout_seconds + CLAIM_MARGIN_SECONDS)
        for index, notification in enumerate(claimed):
            if claimed_until - self._clock() < needed:
                released = store.execute("release_notifications", claim_token=token, now=self._clock()).rows
                log.warning("notifications: %s claimed notification(s) given back unsent (this pass took too "
                            "long: what is left of its %s s claim no longer covers a POST)",
                            len(released), self.claim_seconds)
                break
            self._deliver(store, notification, runs.get(notification["run_id"], {}), token)
        return len(claimed)

    def _deliver(self, store: Any, notification: dict[str, Any], run: dict[str, Any], token: str) -> None:
        body = notification_body(notification, run)
        attempts = notification["attempts"]
        error = None
        try:
            self._post(notification["url"], body, self.timeout_seconds, message_id=message_id(notification, run),
                       key=self._secret)
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
