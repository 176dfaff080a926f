"""Notifications: a run's outcome POSTed as JSON to a webhook, once per run outcome; and the
alerts the tick raises (shared/engine/alerts.py), once per (run, kind), through the same outbox.

SQL Server Agent notifies operators when a job fails, succeeds or completes; here each job's
``NOTIFY`` (``on_failure`` by default, ``on_success``, ``on_completion``, ``never``) says which
outcomes go to its webhook (``JOB__<name>__NOTIFY_WEBHOOK_URL``, else
``AGENT_NOTIFY_WEBHOOK_URL``). Email goes through Azure Monitor instead (infra/alerts.bicep).

An outbox: ``enqueue_notifications`` writes one row per run outcome in the very transaction
that ends the run (the unique (run_id, kind) makes a second enqueue a no-op), so an outcome is never
notified without having happened, nor lost once it happened. Delivery happens afterwards, off
every worker's path: one daemon thread per process (``Notifier``), woken when a run ends and
by each tick, claims due rows under a new claim token (two processes never send the same row),
POSTs each within a total deadline (connect, send and the whole answer, however slowly a
receiver trickles it), and records every attempt on the row: sent, retried later (at most
``MAX_DELIVERY_ATTEMPTS`` in all) or failed for good. A claim always outlasts the longest batch
of POSTs, so a slow receiver never makes another process send the same row again; only a
process that dies in the middle of a POST leaves the row claimed until its claim expires, and
then another process sends it (the one case where a receiver may see a notification twice: the
``webhook-id`` header is the same both times, so a receiver can drop the second).

With ``AGENT_NOTIFY_WEBHOOK_SECRET`` each POST is signed per the Standard Webhooks scheme:
``webhook-id`` (the notification's id, the same on every attempt), ``webhook-timestamp`` (Unix
seconds) and ``webhook-signature`` (``v1,`` and the base64 HMAC-SHA256 of
``id.timestamp.body`` under the secret's key). docs/schemas/notification.schema.json is the body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import logging
import socket
import ssl
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable
from urllib.parse import urlsplit

from shared.control.sqlerrors import describe
from shared.errors import NotificationError
from shared.jobs.alert_definitions import CONDITION_KINDS
from shared.jobs.run_model import RunStatus
from shared.settings import Settings

log = logging.getLogger(__name__)
UTC = timezone.utc
# The whole of one POST: connecting, sending, and reading the answer, however slowly it comes.
DELIVERY_TIMEOUT_SECONDS = 5.0
MAX_DELIVERY_ATTEMPTS = 3
# Wait before the 2nd and the 3rd attempt.
RETRY_DELAYS_SECONDS = (10, 60)
BATCH = 20
# How much of a receiver's answer is read (the status is what counts).
MAX_ANSWER_BYTES = 65536


def claim_seconds(timeout_seconds: float) -> int:
    """How long a batch stays claimed: every POST of a full batch at its deadline, twice over, plus
    a minute for the database round trips. Longer than the longest batch by construction, so a
    slow receiver can never make another process send a claimed row."""
    return int(2 * BATCH * timeout_seconds + 60)
# Retries come due without a run ending: the thread looks this often.
POLL_SECONDS = 10.0


def notifications_enabled(settings: Settings) -> bool:
    """Whether any webhook is configured (otherwise the outbox is never written)."""
    return bool(settings.agent.notify_webhook_url or any(job.notify_webhook_url for job in settings.jobs)
                or any(alert.notify_webhook_url for alert in getattr(settings, "alerts", ())))


def enqueue_calls(settings: Settings, now: datetime) -> list[tuple[str, dict[str, Any]]]:
    """The named query that writes the outbox rows of the runs a transaction ends at ``now``
    (to chain into that transaction), or nothing when no webhook is configured."""
    if not notifications_enabled(settings):
        return []
    return [("enqueue_notifications", {"now": now, "default_url": settings.agent.notify_webhook_url})]


def notification_body(notification: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """What the webhook receives."""
    if notification.get("kind") in CONDITION_KINDS:
        # A condition alert (shared/engine/condition_alerts.py): the body was written with the
        # firing (its run_id is the firing's id, not a run's).
        try:
            body = json.loads(notification.get("detail") or "{}")
        except ValueError:
            body = {"alert": notification["job_name"], "kind": notification["kind"], "error": "unreadable detail"}
        return {**body, "firing_id": notification["run_id"]}
    started, finished = run.get("first_started_at"), run.get("finished_at")
    duration = round((finished - started).total_seconds(), 3) if started and finished else None
    outcome = notification["outcome"]
    return {
        "job": notification["job_name"],
        "run_id": notification["run_id"],
        "slot": _iso(run.get("scheduled_for")),
        # "outcome": the run ended (NOTIFY); else an alert the tick raised (shared/engine/alerts.py):
        # "duration", "stopped", "slower" or "deadline", "alert" saying what, "outcome" the run's
        # status when it was raised.
        "kind": notification.get("kind") or "outcome",
        "alert": notification.get("detail"),
        "outcome": outcome,
        # A run its flow failed (quit_failure after a step that failed and was handled) keeps no
        # error of its own: the latest failed attempt's error and step say what went wrong.
        "failing_step": _first(run.get("failed_step"), run.get("attempt_step")) if outcome != RunStatus.SUCCEEDED else None,
        "error": _first(run.get("last_error"), run.get("attempt_error")) if outcome != RunStatus.SUCCEEDED else None,
        "error_number": (_first(run.get("last_error_number"), run.get("attempt_error_number"))
                         if outcome != RunStatus.SUCCEEDED else None),
        "duration_seconds": duration,
        "finished_at": _iso(finished),
        # Application Insights: operation_Id == this value finds the run's events and SQL.
        "operation_id": run.get("operation_id"),
        # A job that follows a job (JOB__<name>__AFTER): the run whose end started this one.
        "followed_run_id": run.get("followed_run_id"),
    }


def signature_headers(secret: bytes, message_id: str, timestamp: int, payload: bytes) -> dict[str, str]:
    """The Standard Webhooks headers for ``payload``."""
    signed = f"{message_id}.{timestamp}.".encode() + payload
    digest = base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp), "webhook-signature": f"v1,{digest}"}


def post_json(url: str, body: dict[str, Any], timeout: float, headers: dict[str, str] | None = None,
              payload: bytes | None = None) -> None:
    """POST ``body`` (or the exact ``payload`` bytes) and read the answer, all within ``timeout``
    seconds in total; raises with a one-line reason unless the answer is 2xx.

    A socket timeout bounds each read, not the request: a receiver sending one byte a second
    would hold the thread for as long as it likes. A timer closes the socket at the deadline,
    which ends whatever read or write is waiting."""
    data = payload if payload is not None else json.dumps(body).encode("utf-8")
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout
    if secure:
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, port, timeout=timeout, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    try:
        connection.request("POST", path, body=data, headers={
            "Content-Type": "application/json", "User-Agent": "sql-agent-notifier/1", **(headers or {})})
        response = connection.getresponse()
        remaining = MAX_ANSWER_BYTES
        while remaining > 0 and time.monotonic() < deadline:
            chunk = response.read1(min(remaining, 8192)) if hasattr(response, "read1") else response.read(remaining)
            if not chunk:
                break
            remaining -= len(chunk)
        if expired.is_set() or time.monotonic() >= deadline:
            raise NotificationError(f"no complete answer within {timeout:g} s (the deadline of one POST)")
        if not 200 <= response.status < 300:
            raise NotificationError(f"HTTP {response.status} {response.reason}")
    except NotificationError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise NotificationError(f"no complete answer within {timeout:g} s (the deadline of one POST)") from None
        raise NotificationError(f"no answer within {timeout:g} s or refused: {exc}") from None
    finally:
        timer.cancel()
        connection.close()


class Notifier:
    """One per process: delivers the outbox in a daemon thread."""

    def __init__(self, new_store: Callable[[], Any], clock: Callable[[], datetime], *,
                 post: Callable[..., None] = post_json,
                 timeout_seconds: float = DELIVERY_TIMEOUT_SECONDS, poll_seconds: float = POLL_SECONDS,
                 secret: bytes | None = None, stop_when_idle: bool = False) -> None:
        """``stop_when_idle``: the thread ends after a pass that found nothing due, instead of
        looking again every ``poll_seconds`` (quiet ticks: a process that stays up must not keep
        a serverless database awake; the next wake() starts it again, and a connected tick wakes it
        when a retry comes due, since the quiet horizon counts notifications)."""
        self.stop_when_idle = stop_when_idle
        self._new_store = new_store
        self._clock = clock
        self._post = post
        self.secret = secret
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
            # Under the lock: a thread ending because it is idle sees this wake, or is replaced.
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
                delivered = 0
                try:
                    while not self._stop.is_set():
                        claimed = self.deliver_due()
                        delivered += claimed
                        if not claimed:
                            break
                except Exception as exc:  # noqa: BLE001 - retried at the next wake
                    log.warning("notifications: delivery pass failed (retried later): %s", describe(exc))
                finally:
                    self._close_store()   # no connection held between passes (AGENT_MAX_CONNECTIONS)
                if self._flushing:
                    break
                if self.stop_when_idle and not delivered:
                    with self._lock:
                        if not self._wake.is_set():
                            if self._thread is threading.current_thread():
                                self._thread = None
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
                                claimed_until=now + timedelta(seconds=self.claim_seconds), batch=BATCH).rows
        if not claimed:
            return 0
        run_ids = [n["run_id"] for n in claimed if n.get("kind") not in CONDITION_KINDS]
        runs = {row["run_id"]: row for row in store.execute("notification_runs", run_ids=run_ids).rows} if run_ids else {}
        for notification in claimed:
            self._deliver(store, notification, runs.get(notification["run_id"], {}), token)
        return len(claimed)

    def _deliver(self, store: Any, notification: dict[str, Any], run: dict[str, Any], token: str) -> None:
        body = notification_body(notification, run)
        attempts = notification["attempts"]
        error = None
        try:
            if self.secret is not None:
                payload = json.dumps(body).encode("utf-8")
                headers = signature_headers(self.secret, f"msg_{notification['notification_id']}",
                                            int(time.time()), payload)
                self._post(notification["url"], body, self.timeout_seconds, headers=headers, payload=payload)
            else:
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


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def _shown(url: str) -> str:
    """A URL for the log: scheme, host and path (a query string may carry a secret)."""
    return url.split("?", 1)[0]
