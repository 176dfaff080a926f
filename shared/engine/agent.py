"""The engine wired from settings: stores, queue, telemetry, scheduler and executor.

One Agent per process. Stores are per thread (the Functions Python worker runs sync
functions on a thread pool, and the local runner has worker threads).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from shared.control.clock import DatabaseClock, as_utc
from shared.control.db import DatabaseTarget, connector, resolve_database, transaction_open
from shared.control.pool import ConnectionPool
from shared.control.store import Store
from shared.engine.executor import Executor
from shared.engine.notify import Notifier, notifications_enabled
from shared.engine.operations import request_run_now
from shared.engine.scheduler import Scheduler
from shared.engine.supervisor import Supervisor
from shared.errors import AgentError
from shared.messaging.azure_storage import AzureStorageQueue
from shared.messaging.port import host_queue_options
from shared.settings import Settings, load_settings
from shared.telemetry.factory import create_telemetry

log = logging.getLogger(__name__)
UTC = timezone.utc


class Agent:
    def __init__(self, settings: Settings, *, db: str | None = None, queue: Any = None, telemetry: Any = None,
                 clock: Callable[[], datetime] | None = None, simulated_time: bool = False) -> None:
        """``queue``: a queue port to dispatch to (queue mode); by default the Azure Storage queue
        when one is configured, else none (direct mode: the runs table is the queue).
        ``clock``: the agent's notion of time; by default the control database's
        (:class:`shared.control.clock.DatabaseClock`: one clock for every instance, whatever their own
        wall clocks say). An explicit clock is a test hook: it is used as given, and a tick's
        time is checked against it. ``simulated_time`` is the other (tests that travel in time
        through ``tick(now)``): a tick's explicit time is taken as the truth, unchecked. The
        command line and the function app never set either."""
        self.simulated_time = simulated_time
        self.settings = settings
        self.target: DatabaseTarget = resolve_database(settings.agent, db)
        self.system_clock = clock is None
        self.database_clock = None
        if clock is None:
            self.database_clock = DatabaseClock(lambda: Store(
                self.target, self._connect, job_principal=self.settings.agent.job_principal, pool=self.pool,
                kind="clock"))
        self.clock = clock or self.database_clock
        self._queue = queue
        self._telemetry = telemetry
        self._local = threading.local()
        self._stores: list[Store] = []
        self._lock = threading.Lock()
        self._connect = connector(self.target, retry_refusals=False)

        # AGENT_MAX_CONNECTIONS: every connection this process opens to the control database.
        self.pool = ConnectionPool(self._connect, settings.agent.max_connections,
                                   retry_seconds=self.target.connect_retry_seconds,
                                   in_transaction=transaction_open(self.target.dialect))
        self._supervisor = None
        self._notifier = None

    # ------------------------------------------------------------ resources

    def store(self) -> Store:
        """This thread's store. Its connection comes from the process's pool on the first
        statement and goes back with release() (AGENT_MAX_CONNECTIONS)."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self.new_store()
            self._local.store = store
            with self._lock:
                self._stores.append(store)
        return store

    def release(self) -> None:
        """This thread is done for now: its connection goes back to the pool (the next
        statement takes one again). Called between units of work, never inside one."""
        store = getattr(self._local, "store", None)
        if store is not None:
            store.close()

    def new_store(self, kind: str = "work") -> Store:
        """A store of its own (the lease renewal's: ``kind="lease"``, the clock's: ``"clock"``,
        the notifier's, the monitor's), its connection from the process's pool."""
        return self._observed(Store(self.target, self._connect, job_principal=self.settings.agent.job_principal,
                                    pool=self.pool, kind=kind))

    def target_store(self, database: str, server: str | None = None) -> Store:
        """A store on a job's own database (``server``: on another server, a fleet target)."""
        return Store(self.target, connector(self.target, database, server),
                     job_principal=self.settings.agent.job_principal)

    def _observed(self, store: Store) -> Store:
        """With Application Insights configured, every named query is a SQL dependency."""
        if self.settings.agent.appinsights_connection_string:
            target = self.target.display

            def observe(name: str, duration_ms: float, success: bool, operation_id: str | None) -> None:
                self.telemetry.dependency(name, target=target, duration_ms=duration_ms, success=success,
                                          operation_id=operation_id)

            store.observer = observe
        return store

    @property
    def queue_mode(self) -> bool:
        """True when runs are dispatched to a queue (Azure Storage, or one given to the agent);
        False when the local runner's workers claim straight from agent.runs."""
        return self._queue is not None or self.settings.agent.uses_azure_queue

    @property
    def queue(self) -> Any:
        """The queue port in queue mode, None in direct mode."""
        if self._queue is None and self.settings.agent.uses_azure_queue:
            with self._lock:
                if self._queue is None:
                    agent = self.settings.agent
                    self._queue = AzureStorageQueue.from_settings(
                        connection_string=agent.storage_connection, queue_service_uri=agent.storage_queue_service_uri,
                        client_id=agent.storage_client_id, queue_name=agent.queue_name, encoding=agent.queue_encoding)
        return self._queue

    @property
    def supervisor(self):
        """The process's one lease-renewal and timeout thread (started on first use)."""
        if self._supervisor is None:
            with self._lock:
                if self._supervisor is None:
                    self._supervisor = Supervisor(lambda: self.new_store("lease"), self.clock)
        return self._supervisor

    @property
    def notifier(self):
        """The process's one notification deliverer (its thread starts when first woken)."""
        if self._notifier is None:
            with self._lock:
                if self._notifier is None:
                    self._notifier = Notifier(self.new_store, self.clock,
                                              secret=self.settings.agent.notify_webhook_secret,
                                              stop_when_idle=self.settings.agent.quiet_max_minutes > 0)
        return self._notifier

    def reference_clock(self) -> datetime:
        """What a tick's time is checked against: the database server's clock, read now (one
        statement; the agent's clock takes the reading too), or the explicit clock given."""
        if self.database_clock is None:
            return self.clock()


        store = self.store()
        store.connection   # connected first: the round trip timed is the statement's alone
        value = as_utc(store.execute("database_time").scalar())
        self.database_clock.observe(value, time.monotonic())   # lags by the round trip, never ahead
        return value

    @property
    def telemetry(self) -> Any:
        if self._telemetry is None:
            agent = self.settings.agent
            self._telemetry = create_telemetry(
                agent.appinsights_connection_string, exporter=agent.telemetry_exporter,
                authentication_string=agent.appinsights_authentication_string)
        return self._telemetry

    def scheduler(self):
        return Scheduler(self.store(), self.queue, self.settings, self.telemetry, clock=self.clock,
                         reference_clock=None if self.simulated_time else self.reference_clock)

    def executor(self, transient_delay_seconds: float | None = None):
        """The executor (one per agent, shared by threads). ``transient_delay_seconds``: how
        long a direct-mode run waits after a transient error (default: host.json's
        visibilityTimeout, the delay the queue would redeliver after)."""

        if transient_delay_seconds is None:
            cached = getattr(self, "_executor", None)
            if cached is not None:
                return cached

            self._executor = self.executor(host_queue_options().visibility_timeout_seconds)
            return self._executor
        return Executor(settings=self.settings, store=self.store, target_store=self.target_store,
                        telemetry=self.telemetry, supervisor=self.supervisor, queue=self.queue, clock=self.clock,
                        transient_delay_seconds=transient_delay_seconds, notifier=self.notifier,
                        database_decides_now=self.database_clock is not None)

    # ------------------------------------------------------------ operations

    def init(self) -> tuple[int, int]:
        """Create or upgrade the control schema, and the queue if it is missing."""
        before, after = self.store().migrate(self.clock())
        if self.queue is not None:
            self.queue.ensure_exists()
        return before, after

    def tick(self, now: datetime | None = None):
        self.store().require_schema()
        report = self.scheduler().tick(now)

        if notifications_enabled(self.settings):
            self.notifier.wake()   # retries come due, and runs the tick ended (lapses)
        return report

    def request_run_now(self, job_name: str, *, operation_id: str | None = None) -> dict[str, Any] | None:
        """run-now's run (None: no such valid job): :func:`shared.engine.operations.request_run_now`."""
        return request_run_now(self, job_name, operation_id=operation_id)

    def poll(self, now: datetime | None = None):
        """Between ticks: plan the jobs the T-SQL procedures defined and claim their slots."""
        return self.scheduler().poll(now)

    def handle_message(self, body: str | bytes, dequeue_count: int, message_id: str | None = None):
        return self.executor().handle(body, dequeue_count, message_id)

    def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()
        if self._notifier is not None:
            # What is due goes out first, bounded: a local command ends right after its runs.
            self._notifier.stop(flush_seconds=10.0)
        with self._lock:
            stores, self._stores = self._stores, []
        for store in stores:
            store.close()
        if self.database_clock is not None:
            self.database_clock.close()
        self.pool.close()
        if self._telemetry is not None:
            self._telemetry.close()


_default: Agent | None = None
_default_lock = threading.Lock()


def default_agent() -> Agent:
    """The process-wide agent built from the environment (the Functions app settings).
    App settings changes restart the app, so building it once per process is enough."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                logging.getLogger("shared").setLevel(logging.INFO)
                _default = Agent(load_settings())
    return _default


def reset_default_agent() -> None:
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = None


def run_timer_tick(past_due: bool = False) -> None:
    """What the timer trigger does. Raises when a step failed, so the invocation shows as
    failed in Application Insights; whatever the tick did commit stays done."""

    from shared.engine import quiet

    agent = default_agent()
    try:
        decision, report = quiet.timer_tick(agent)
        if report is None:
            # Nothing in the control database can come due before the recorded wake time: this
            # tick did not connect, so a serverless database may pause (docs/cost.md).
            log.info("tick: quiet, not connecting to the control database: %s", decision.reason)
            return
        if report.refused:
            # Its time was too far from the database's: nothing changed, and a retry would
            # not help; the next timer tick tries again. Logged, reported as an event, not raised.
            log.error("%s%s", "; ".join(report.errors), " (past-due timer)" if past_due else "")
            return
        summary = report.summary()
        log.info("tick%s: %s", " (past due)" if past_due else "", summary)
        if report.errors:
            raise AgentError("tick finished with errors: " + "; ".join(report.errors))
    finally:
        agent.release()   # the host's thread keeps no connection between invocations
        agent.telemetry.flush()


def run_queue_message(body: bytes | str, dequeue_count: int, message_id: str | None = None) -> None:
    """What the queue trigger does: returns to delete the message, raises to have it redelivered."""
    agent = default_agent()
    try:
        result = agent.handle_message(body, dequeue_count, message_id)
        log.info("message %s: %s (run %s)", message_id, result.outcome, result.run_id)
    finally:
        agent.release()
        agent.telemetry.flush()
