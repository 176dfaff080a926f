"""The local runner: the Functions host's two triggers, played on one machine.

* the tick runs on AGENT_TICK_SCHEDULE (and once at start, for convenience);
* worker threads receive from the queue and call the executor exactly as the queue
  trigger does, applying the host's delivery rules from host.json: success deletes the
  message, an exception makes it visible again after ``visibilityTimeout``, and after
  ``maxDequeueCount`` deliveries the host moves it to ``<queue>-poison``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from .queues import HostQueueOptions, ReceivedMessage, host_queue_options
from .schedules import CronSchedule

log = logging.getLogger("shared.runner")
UTC = timezone.utc
# How long a received message stays hidden while it is processed (the host uses 10 min
# and renews it; a run's own lease, not this, decides when a slow run is presumed dead).
PROCESSING_VISIBILITY_SECONDS = 600


class LocalRunner:
    def __init__(self, agent: Any, *, concurrency: int | None = None, poll_interval: float = 0.5,
                 visibility_timeout: float | None = None, host_options: HostQueueOptions | None = None) -> None:
        self.agent = agent
        self.concurrency = max(1, concurrency or agent.settings.agent.max_concurrency)
        self.poll_interval = poll_interval
        self.host = host_options or host_queue_options()
        self.visibility_timeout = (self.host.visibility_timeout_seconds if visibility_timeout is None
                                   else visibility_timeout)
        self.stop_event = threading.Event()
        self.processed = 0
        self._count_lock = threading.Lock()

    # ------------------------------------------------------------ one message

    def process(self, message: ReceivedMessage) -> str:
        queue = self.agent.queue
        try:
            result = self.agent.handle_message(message.body, message.dequeue_count, message.id)
        except Exception as exc:  # what the host does when the function raises
            if message.dequeue_count >= self.host.max_dequeue_count:
                log.error("message %s failed on delivery %s of maxDequeueCount=%s: moved to %s-poison (%s)",
                          message.id, message.dequeue_count, self.host.max_dequeue_count, queue.name, exc)
                queue.move_to_poison(message)
                return "host-poison"
            log.warning("message %s failed on delivery %s; visible again in %.0f s: %s",
                        message.id, message.dequeue_count, self.visibility_timeout, exc)
            queue.release(message, self.visibility_timeout)
            return "redeliver"
        queue.delete(message)
        with self._count_lock:
            self.processed += 1
        return result.outcome

    # ------------------------------------------------------------ batches

    def work_once(self) -> int:
        """Receive up to ``concurrency`` messages and process them in parallel."""
        messages = self.agent.queue.receive(self.concurrency, PROCESSING_VISIBILITY_SECONDS)
        if not messages:
            return 0
        if len(messages) == 1:
            self.process(messages[0])
            return 1
        with ThreadPoolExecutor(max_workers=len(messages), thread_name_prefix="agent-work") as pool:
            list(pool.map(self._process_in_thread, messages))
        return len(messages)

    def _process_in_thread(self, message: ReceivedMessage) -> str:
        try:
            return self.process(message)
        finally:
            self.agent.store().close()

    def work_until_idle(self, max_seconds: float | None = None) -> int:
        """Work the queue until a receive finds no visible message. A message waiting for
        redelivery (failed, hidden for the visibility timeout) is not waited for."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        total = 0
        while not self.stop_event.is_set():
            count = self.work_once()
            total += count
            if count == 0 or (deadline is not None and time.monotonic() > deadline):
                break
        return total

    # ------------------------------------------------------------ forever

    def run(self) -> None:
        """Tick on schedule and work the queue until stop() (Ctrl-C)."""
        threads = [threading.Thread(target=self._tick_loop, name="agent-tick", daemon=True)]
        threads += [threading.Thread(target=self._worker_loop, name=f"agent-worker-{i}", daemon=True)
                    for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        try:
            while not self.stop_event.wait(0.5):
                pass
        finally:
            self.stop_event.set()
            for thread in threads:
                thread.join(timeout=30)

    def stop(self) -> None:
        self.stop_event.set()

    def _tick_loop(self) -> None:
        schedule = CronSchedule(self.agent.settings.agent.tick_schedule, "UTC")
        next_tick = datetime.now(UTC)
        while not self.stop_event.is_set():
            delay = (next_tick - datetime.now(UTC)).total_seconds()
            if delay > 0 and self.stop_event.wait(delay):
                break
            try:
                report = self.agent.tick()
                summary = report.summary()
                log.info("tick: %s claimed, %s skipped, %s dispatched, %s leases expired%s",
                         summary["runs_claimed"], summary["runs_skipped"], summary["runs_dispatched"],
                         summary["leases_expired"], f"; errors: {report.errors}" if report.errors else "")
            except Exception as exc:
                log.error("tick failed: %s", exc)
            finally:
                self.agent.telemetry.flush()
            next_tick = schedule.next_after(datetime.now(UTC)) or datetime.now(UTC)

    def _worker_loop(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    messages = self.agent.queue.receive(1, PROCESSING_VISIBILITY_SECONDS)
                except Exception as exc:
                    log.error("receive failed: %s", exc)
                    self.stop_event.wait(max(self.poll_interval, 2.0))
                    continue
                if not messages:
                    self.stop_event.wait(self.poll_interval)
                    continue
                for message in messages:
                    try:
                        self.process(message)
                    except Exception as exc:
                        log.error("message %s: %s", message.id, exc)
                self.agent.telemetry.flush()
        finally:
            self.agent.store().close()
