"""The local runner: the agent on one machine, without the Functions host.

* the tick runs on AGENT_TICK_SCHEDULE (and once at start) — the safety net, as in Azure;
* long-lived worker threads do the work, each taking a connection from the process's pool for
  each claim, run or look-ahead and giving it back after (AGENT_MAX_CONNECTIONS, shared.control.pool):
  idle workers hold none, and more workers than connections wait for one in turn:
  - **direct mode** (no storage queue configured): the runs table is the queue. A worker
    claims a runnable run straight from agent.runs (``FOR UPDATE SKIP LOCKED`` /
    ``UPDLOCK, READPAST`` / SQLite's single writer), runs it, and claims the next. An idle
    worker sleeps until the next pending run's slot, at most AGENT_POLL_SECONDS (so rows
    inserted by another process start within that), and wakes at once when a sibling ends a run
    (a place freed, an order level done) or a tick claimed something;
  - **queue mode** (AzureWebJobsStorage set, e.g. Azurite): the workers receive from the
    storage queue and call the executor exactly as the queue trigger does, applying the host's
    delivery rules from host.json: success deletes the message, an exception makes it visible
    again after ``visibilityTimeout``, and after ``maxDequeueCount`` deliveries the host moves
    it to ``<queue>-poison``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import timezone
from typing import Any, Callable

from shared.control.sqlerrors import classify, describe
from shared.errors import ConnectError
from shared.jobs.schedules import CronSchedule
from shared.messaging.port import HostQueueOptions, ReceivedMessage, host_queue_options, next_polling_interval

log = logging.getLogger(__name__)
UTC = timezone.utc
# How long a received message stays hidden while it is processed (the host uses 10 min
# and renews it; a run's own lease, not this, decides when a slow run is presumed dead).
PROCESSING_VISIBILITY_SECONDS = 600
# work --until-idle: a claim that failed with a transient error (a deadlock, a lock timeout, a
# connection the server ended) is tried again this many times, after 0.25, 0.5, 1 s ...
CLAIM_RETRIES = 3
CLAIM_RETRY_DELAY = 0.25
CLAIM_RETRY_MAX_DELAY = 5.0


class LocalRunner:
    def __init__(self, agent: Any, *, concurrency: int | None = None, poll_interval: float | None = None,
                 visibility_timeout: float | None = None, host_options: HostQueueOptions | None = None) -> None:
        self.agent = agent
        self.concurrency = max(1, concurrency or agent.settings.agent.max_concurrency)
        self.poll_interval = float(agent.settings.agent.poll_seconds if poll_interval is None else poll_interval)
        self.host = host_options or host_queue_options()
        self.visibility_timeout = (self.host.visibility_timeout_seconds if visibility_timeout is None
                                   else visibility_timeout)
        self.executor = agent.executor(self.visibility_timeout)
        # Direct mode on PostgreSQL: a worker's completion also claims its next run (two round
        # trips a task, not three) while the worker goes on working: inside the loops below,
        # until stop(). A run claimed so is run before the worker ends (_run_claimed_ahead).
        self.executor.claim_ahead = self._claims_ahead
        self.stop_event = threading.Event()
        self.processed = 0
        self._changed = threading.Condition()
        self._generation = 0
        self._busy = 0
        self._poll_state = threading.local()

    # ------------------------------------------------------------ signalling

    def notify(self) -> None:
        """Something changed (a run ended, a tick claimed): idle workers look again now."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _wait(self, seen: int, seconds: float) -> None:
        with self._changed:
            if self._generation == seen and not self.stop_event.is_set():
                self._changed.wait(max(0.0, seconds))

    def stop(self) -> None:
        self.stop_event.set()
        self.notify()

    def _claims_ahead(self) -> bool:
        return bool(getattr(self._poll_state, "looping", False)) and not self.stop_event.is_set()

    def _run_claimed_ahead(self) -> None:
        """A worker leaves its loop: the run its last completion claimed is its own (token and
        lease), so it runs it now rather than leave it to lapse."""
        self._poll_state.looping = False
        if self.agent.queue_mode:
            return
        try:
            rows = self.executor.take_claimed_ahead()
            if rows:
                count = len(self.executor._run_claimed(rows))
                with self._changed:
                    self.processed += count
                self.notify()
        except Exception as exc:  # noqa: BLE001 - the run's lease lapses and it is taken back
            log.error("worker: running the run claimed with the last completion failed: %s", describe(exc))
        finally:
            self.agent.release()

    # ------------------------------------------------------------ one unit of work

    def work_one(self) -> int:
        """Direct mode: claim one runnable run and execute it. Queue mode: receive one message
        and process it as the host would. Returns how many runs/messages were handled."""
        if self.agent.queue_mode:
            messages = self.agent.queue.receive(1, PROCESSING_VISIBILITY_SECONDS)
            for message in messages:
                self.process(message)
            count = len(messages)
        else:
            count = len(self.executor.work_once(batch=1))
        with self._changed:
            self.processed += count
        return count

    def process(self, message: ReceivedMessage) -> str:
        """What the Functions host does with one delivery."""
        queue = self.agent.queue
        if message.dequeue_count > self.host.max_dequeue_count:
            # The host moves such a message before the function runs (a worker that crashed on
            # every delivery never let the function return).
            log.error("message %s arrived on delivery %s, above maxDequeueCount=%s: moved to %s-poison unrun",
                      message.id, message.dequeue_count, self.host.max_dequeue_count, queue.name)
            queue.move_to_poison(message)
            return "host-poison"
        try:
            result = self.executor.handle(message.body, message.dequeue_count, message.id)
        except Exception as exc:  # what the host does when the function raises
            if message.dequeue_count >= self.host.max_dequeue_count:
                log.error("message %s failed on delivery %s of maxDequeueCount=%s: moved to %s-poison (%s)",
                          message.id, message.dequeue_count, self.host.max_dequeue_count, queue.name, describe(exc))
                queue.move_to_poison(message)
                return "host-poison"
            log.warning("message %s failed on delivery %s; visible again in %.0f s: %s",
                        message.id, message.dequeue_count, self.visibility_timeout, describe(exc))
            queue.release(message, self.visibility_timeout)
            return "redeliver"
        queue.delete(message)
        return result.outcome

    def _next_wait(self) -> float:
        """Queue mode: the host's polling back-off (host.json maxPollingInterval). Direct mode:
        seconds until the next pending run's slot, at most the poll interval."""
        if self.agent.queue_mode:
            # Per worker thread, as each of the host's listeners backs off on its own.
            previous = getattr(self._poll_state, "interval", None)
            interval = next_polling_interval(previous, False, self.host.max_polling_interval_seconds,
                                             random.random())
            self._poll_state.interval = interval
            return interval
        try:
            now = self.agent.clock()
            next_at = self.agent.store().execute("next_runnable_at", now=now).scalar()
        except Exception as exc:  # noqa: BLE001 - the database may be away; poll again later
            log.warning("looking for the next runnable run failed: %s", describe(exc))
            return self.poll_interval
        finally:
            self.agent.release()
        if next_at is None:
            return self.poll_interval
        next_at = next_at.replace(tzinfo=UTC) if next_at.tzinfo is None else next_at
        return min(self.poll_interval, max(0.0, (next_at - now).total_seconds()) + 0.01)

    # ------------------------------------------------------------ until idle (work command, tests)

    def work_once(self) -> int:
        """One unit of work on each of up to ``concurrency`` threads, in parallel. A claim or
        receive that failed is raised (after the other threads ended): it found nothing out."""
        counts: list[int] = []
        failures: list[BaseException] = []

        def one() -> None:
            try:
                counts.append(self.work_one())
            except Exception as exc:  # noqa: BLE001 - raised below, once every thread ended
                failures.append(exc)
            finally:
                self.agent.release()   # an idle worker holds no connection

        threads = [threading.Thread(target=one, name=f"agent-work-{i}") for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        return sum(counts)

    def work_until_idle(self, max_seconds: float | None = None) -> int:
        """Work until the database says nothing is runnable now (a claim on its clock found
        nothing) and no worker is busy; a run waiting for a later slot, a retry backoff or a
        redelivery is not waited for. A claim or receive that failed found nothing out, so it is
        never taken for "nothing to do": a transient error is tried again (CLAIM_RETRIES times,
        backing off), anything else ends every worker and is raised, once they end."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        before = self.processed
        failures: list[BaseException] = []

        def loop() -> None:
            retries = 0
            self._poll_state.looping = True
            try:
                while not self.stop_event.is_set() and not failures and (
                        deadline is None or time.monotonic() < deadline):
                    with self._changed:
                        seen = self._generation
                        self._busy += 1
                    try:
                        count = self.work_one()
                        retries = 0
                    except Exception as exc:  # noqa: BLE001 - retried or raised, never "idle"
                        count = None
                        retries += 1
                        # A connection that could not be made was retried already (for
                        # AGENT_CONNECT_RETRY_SECONDS): that is final here.
                        if isinstance(exc, ConnectError) or not classify(exc).transient or retries > CLAIM_RETRIES:
                            log.error("worker: claiming or receiving failed: %s", describe(exc))
                            failures.append(exc)
                        else:
                            log.warning("worker: claiming or receiving failed (%s of %s, trying again): %s",
                                        retries, CLAIM_RETRIES, describe(exc))
                    finally:
                        self.agent.release()   # an idle worker holds no connection
                        with self._changed:
                            self._busy -= 1
                    if count is None:        # failed: back off (or, after the last, stop everyone)
                        self.notify()
                        if not failures:
                            self.stop_event.wait(min(CLAIM_RETRY_MAX_DELAY, CLAIM_RETRY_DELAY * 2 ** (retries - 1)))
                        continue
                    if count:
                        self.notify()
                        continue
                    with self._changed:
                        if self._busy == 0 and self._generation == seen:
                            self._generation += 1  # tell the others: idle everywhere
                            self._changed.notify_all()
                            return
                        if self._busy == 0:
                            continue  # a sibling finished something since: look again
                        self._changed.wait(0.5)
            finally:
                self._run_claimed_ahead()
                self._release_thread_store()

        self._run_threads(loop)
        if failures:
            raise failures[0]
        return self.processed - before

    def _safe_work_one(self) -> int:
        try:
            return self.work_one()
        except Exception as exc:  # noqa: BLE001 - a worker survives a failed receive/claim
            log.error("worker: claiming or receiving failed: %s", describe(exc))
            return 0
        finally:
            self.agent.release()   # an idle worker holds no connection

    # ------------------------------------------------------------ forever

    def run(self) -> None:
        """Tick on schedule and work until stop() (Ctrl-C)."""
        threads = [threading.Thread(target=self._tick_loop, name="agent-tick", daemon=True)]
        threads += [threading.Thread(target=self._worker_loop, name=f"agent-worker-{i}", daemon=True)
                    for i in range(self.concurrency)]
        started: list[threading.Thread] = []
        # The threads start inside the try: a Ctrl-C between two starts still stops and joins
        # the ones running (else the caller closed the agent's connections under them).
        try:
            for thread in threads:
                thread.start()
                started.append(thread)
            while not self.stop_event.wait(0.5):
                pass
        finally:
            self.stop()
            for thread in started:
                thread.join(timeout=30)
            running = [thread.name for thread in started if thread.is_alive()]
            if running:
                log.warning("stopping while %s still run a job (its run's lease lapses and it is "
                            "taken back)", ", ".join(running))

    def _run_threads(self, target: Callable[[], None]) -> None:
        threads = [threading.Thread(target=target, name=f"agent-worker-{i}", daemon=True)
                   for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _tick_loop(self) -> None:
        """Tick on schedule; between ticks, every poll interval, plan the jobs the T-SQL
        procedures defined (one statement when there is none) so they start without waiting for
        the next tick."""
        schedule = CronSchedule(self.agent.settings.agent.tick_schedule, "UTC")
        # When to tick, on the monotonic clock: a wall clock that jumps back (or forward) while
        # the runner runs neither stops the ticks nor bunches them. The next slot of the tick
        # schedule is read on the agent's clock (the database's).
        tick_at = time.monotonic()
        try:
            while not self.stop_event.is_set():
                delay = tick_at - time.monotonic()
                if delay > self.poll_interval:
                    if self.stop_event.wait(self.poll_interval):
                        break
                    self._poll()
                    continue
                if delay > 0 and self.stop_event.wait(delay):
                    break
                try:
                    report = self.agent.tick()
                    summary = report.summary()
                    log.info("tick: %s claimed, %s skipped, %s dispatched, %s leases expired%s",
                             summary["runs_claimed"], summary["runs_skipped"], summary["runs_dispatched"],
                             summary["leases_expired"], f"; errors: {report.errors}" if report.errors else "")
                except Exception as exc:  # noqa: BLE001
                    log.error("tick failed: %s", describe(exc))
                finally:
                    self.agent.release()
                    self.agent.telemetry.flush()
                self.notify()
                tick_at = time.monotonic() + self._seconds_to_next_tick(schedule)
        finally:
            self._release_thread_store()

    def _seconds_to_next_tick(self, schedule: CronSchedule) -> float:
        """Seconds until the tick schedule's next slot on the agent's clock (a minute when that
        clock cannot be read)."""
        try:
            now = self.agent.clock()
            following = schedule.next_after(now)
        except Exception as exc:  # noqa: BLE001 - the database is away: try again in a minute
            log.error("cannot read the clock for the next tick: %s", describe(exc))
            return 60.0
        if following is None:
            return 60.0
        return min(3600.0, max(0.0, (following - now).total_seconds()))

    def _poll(self) -> None:
        try:
            report = self.agent.poll()
            if report.planned:
                log.info("poll: %s database job(s) planned, %s run(s) claimed", len(report.planned),
                         len(report.claimed))
                self.notify()
        except Exception as exc:  # noqa: BLE001 - the next poll or tick tries again
            log.error("poll failed: %s", describe(exc))
        finally:
            self.agent.release()

    def _worker_loop(self) -> None:
        self._poll_state.looping = True
        try:
            while not self.stop_event.is_set():
                with self._changed:
                    seen = self._generation
                count = self._safe_work_one()
                if count:
                    self._poll_state.interval = None      # a message: poll again at once
                    self.notify()
                    self.agent.telemetry.flush()
                    continue
                self._wait(seen, self._next_wait())
        finally:
            self._run_claimed_ahead()
            self._release_thread_store()

    def _release_thread_store(self) -> None:
        """A worker thread ends: close its connection (threads, not runs, own connections)."""
        store = getattr(self.agent._local, "store", None)
        if store is not None:
            store.close()
            self.agent._local.store = None
