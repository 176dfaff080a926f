"""A control database with jobs in every state the monitor shows, built by the engine itself: a
tick syncs the jobs, run-now requests (insert_manual_run) make runs, the executor runs and fails
them, the engine's claim starts some without finishing them (a worker mid-run, or one that died),
dispatch queues one, the cap holds one, and the queue executor poisons one.

Times: the scenario plays the last day on a clock of its own that ends a few minutes before the
real now, so the pages (on the real clock) see succeeded runs over the last 24 hours, a retry an
hour ahead, a run still running, and a run whose worker died two hours ago (stuck).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from shared.messaging.memory import MemoryQueue
from shared.telemetry.client import new_operation_id
from tests.support.harness import Clock, make_agent

UTC = timezone.utc
# An error message a page must show as text: markup, a script and entities (a table name, so
# every database puts it in its error message verbatim; PostgreSQL keeps 63 characters).
HOSTILE = "<script>document.title='pwned'</script>&amp;<b>x</b>"
SUCCEEDED_RUNS = 5

JOBS = {
    "nightly_ok": {"SCHEDULE": "0 30 2 * * *", "TIMEZONE": "Europe/Paris", "COMMAND": "SELECT 1"},
    "flaky_fail": {"SCHEDULE": "0 0 */6 * * *", "COMMAND": f'SELECT * FROM "{HOSTILE}"', "MAX_ATTEMPTS": "1"},
    "retrying": {"SCHEDULE": "0 15 * * * *", "COMMAND": "SELECT * FROM no_such_table_here", "MAX_ATTEMPTS": "3"},
    "poison_me": {"SCHEDULE": "0 0 4 * * *", "COMMAND": "SELECT 1"},
    "stale_worker": {"SCHEDULE": "0 0 5 * * *", "COMMAND": "SELECT 1"},
    "running_long": {"SCHEDULE": "0 0 6 * * *", "COMMAND": "SELECT 1", "LEASE_SECONDS": "3600"},
    "queued_job": {"SCHEDULE": "0 0 7 * * *", "COMMAND": "SELECT 1"},
    "waiting_job": {"SCHEDULE": "0 0 9 * * 1-5", "COMMAND": "SELECT 1"},
    "disabled_job": {"SCHEDULE": "0 0 8 * * *", "COMMAND": "SELECT 1", "ENABLED": "false"},
    "broken_job": {"SCHEDULE": "not a schedule", "COMMAND": "SELECT 1"},
}


class SteppingClock(Clock):
    """The scenario's clock: while ``step`` is set, each reading moves it on by that many seconds,
    so a run the executor claims at one reading and finishes at a later one took that long."""

    step = 0.0

    def __call__(self) -> datetime:
        now = self.now
        if self.step:
            self.now = now + timedelta(seconds=self.step)
        return now


@dataclass
class Scenario:
    db: str
    agent: object
    clock: Clock
    run_ids: dict[str, list[int]] = field(default_factory=dict)
    malformed_poison_id: int | None = None

    def close(self) -> None:
        self.agent.close()

    def ticked(self, at: datetime | None = None, period_seconds: int = 60) -> None:
        """Record a tick of the agent at ``at`` (default: the real now) as the tick's last step does
        (shared/engine/liveness.py), without running one (a tick would move the scenario on)."""
        from shared.engine.liveness import LAST_TICK_KEY, tick_record

        at = at or datetime.now(UTC)
        store = self.agent.new_store()
        try:
            store.execute("set_state", state_key=LAST_TICK_KEY, state_value=tick_record(at, period_seconds), now=at)
        finally:
            store.close()


def build(db: str, extra_jobs: int = 0) -> Scenario:
    """The scenario on ``db`` (an empty control database). ``extra_jobs``: that many more idle
    jobs (the constant-queries test)."""
    real_now = datetime.now(UTC).replace(microsecond=0)
    clock = SteppingClock(real_now)
    jobs = dict(JOBS)
    for index in range(extra_jobs):
        jobs[f"extra_{index:03d}"] = {"SCHEDULE": "0 0 1 * * *", "COMMAND": "SELECT 1"}
    settings = {"AGENT_RETRY_BACKOFF_SECONDS": "3600", "AGENT_MAX_CONCURRENCY": "3", "AGENT_MAX_DEQUEUE_COUNT": "5",
                "AGENT_DISPATCH_LEASE_SECONDS": "7200"}
    agent = make_agent(db, jobs, clock=clock, **settings)
    scenario = Scenario(db=db, agent=agent, clock=clock)
    store = agent.store()
    clock.now = real_now
    agent.tick()                    # syncs the jobs: their next slots come after the real now

    def run_now(job: str, at: datetime) -> int:
        clock.now = at
        row = store.execute("insert_manual_run", job_name=job, now=at, operation_id=new_operation_id(), params=None).one()
        assert row is not None and row["status"] == "pending", (job, row)
        scenario.run_ids.setdefault(job, []).append(row["run_id"])
        return row["run_id"]

    executor = agent.executor(0)
    # Succeeded runs spread over the day, each a few minutes long.
    for hours_ago, minutes in ((20, 9), (16, 14), (12, 6), (8, 22), (4, 11)):
        run_now("nightly_ok", real_now - timedelta(hours=hours_ago))
        clock.step = minutes * 60 / 4
        assert [r.outcome for r in executor.work_once()] == ["succeeded"]
        clock.step = 0
    # A run that failed for good, with a hostile error message.
    run_now("flaky_fail", real_now - timedelta(hours=3))
    assert [r.outcome for r in executor.work_once()] == ["failed"]
    # A failed attempt with attempts left: retried an hour after (past the real now).
    run_now("retrying", real_now - timedelta(minutes=20))
    assert [r.outcome for r in executor.work_once()] == ["retry_scheduled"]
    # A run whose message came back more often than AGENT_MAX_DEQUEUE_COUNT allows, and a
    # malformed message: both in the poison table (the queue executor's verdict).
    queue = MemoryQueue()
    queued_agent = make_agent(db, jobs, clock=clock, queue=queue, **settings)
    try:
        run_now("poison_me", real_now - timedelta(minutes=15))
        from shared.engine.dispatch import dispatch

        dispatch(queued_agent.store(), queue, queued_agent.settings, clock(), queued_agent.telemetry)
        (message,) = queue.receive(1, 60)
        assert queued_agent.handle_message(message.body, dequeue_count=6, message_id=message.id).outcome == "poisoned"
        queued_agent.handle_message(b"{not json at all", dequeue_count=1, message_id="garbage-1")
        # A worker that died two hours ago: claimed, never finished, its lease long expired.
        stale_at = real_now - timedelta(hours=2)
        run_now("stale_worker", stale_at)
        claimed = store.execute("claim_runs", now=stale_at, late_cutoff=stale_at - timedelta(minutes=2),
                                worker="worker-gone", max_concurrency=3, batch=1).rows
        assert [r["job_name"] for r in claimed] == ["stale_worker"]
        # A run executing now on worker-7 (a lease of an hour).
        start = real_now - timedelta(minutes=10)
        run_now("running_long", start)
        claimed = store.execute("claim_runs", now=start, late_cutoff=start - timedelta(minutes=2),
                                worker="worker-7", max_concurrency=3, batch=1).rows
        assert [r["job_name"] for r in claimed] == ["running_long"]
        # Dispatched to the queue, not yet picked up.
        run_now("queued_job", real_now - timedelta(minutes=8))
        outcome = dispatch(queued_agent.store(), queue, queued_agent.settings, clock(), queued_agent.telemetry)
        assert [r["job_name"] for r in outcome.queued] == ["queued_job"], outcome
        # Runnable, but AGENT_MAX_CONCURRENCY (3) runs are in flight: it waits.
        run_now("waiting_job", real_now - timedelta(minutes=5))
        outcome = dispatch(queued_agent.store(), queue, queued_agent.settings, clock(), queued_agent.telemetry)
        assert outcome.queued == []
    finally:
        queued_agent.close()
    poison = store.execute("list_poison", limit=10).rows
    scenario.malformed_poison_id = next(p["poison_id"] for p in poison if p["run_id"] is None)
    clock.now = real_now
    return scenario
