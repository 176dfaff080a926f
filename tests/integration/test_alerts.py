"""Alerts the agent raises itself (issue 32 items 1 and 2) on SQLite and PostgreSQL, in simulated
time through the tick's explicit now: MAX_DURATION_SECONDS notifies once across ticks,
STOP_AFTER_SECONDS stops the run as `stop` does (its worker fenced off) and notifies once,
SLOWER_THAN against a history of runs, DEADLINE_SECONDS once per slot for each cause and not for
a slot that succeeded in time; ticks racing write each alert once; the tick's statements do not
grow with the number of jobs; the webhook gets bodies that match the schema."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest

from shared.engine.alerts import next_alert_moment
from shared.engine.notify import Notifier
from shared.errors import LeaseLost
from shared.messaging.memory import MemoryQueue
from shared.settings import load_settings
from tests.integration.test_notifications import Receiver, Silent, notifications_table
from tests.support.harness import at, job_env, query

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/notification.schema.json").read_text())
HOURLY = "0 0 * * * *"


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def build(agent_factory, receiver, jobs, **settings):
    # Simulated time renews no lease: a lease longer than any test keeps the runs running.
    jobs = {name: {"LEASE_SECONDS": "3600", **job} for name, job in jobs.items()}
    agent = agent_factory(jobs, queue=MemoryQueue(), AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok", **settings)
    agent._notifier = Silent()          # delivered by the test, when it says so
    return agent


def run_of(agent, job, slot):
    rows = agent.store().execute("list_history", job_name=job, limit=1000).rows
    return next(r for r in rows if r["scheduled_for"].replace(tzinfo=None) == slot.replace(tzinfo=None))


def start(agent, job, slot, now=None):
    """A worker starts the run of the job's slot (its SQL not run: it stays running)."""
    run = run_of(agent, job, slot)
    now = now or slot
    (row,) = agent.store().execute("start_run", run_id=run["run_id"], token=run["token"], now=now, worker="w",
                                   dequeue_count=1, max_concurrency=100,
                                   late_cutoff=now - timedelta(seconds=120)).rows
    return row


def succeed(agent, job, slot, now):
    run = run_of(agent, job, slot)
    assert agent.store().execute("finish_run", run_id=run["run_id"], token=run["token"], now=now).rows


def fail(agent, job, slot, now):
    run = run_of(agent, job, slot)
    (row,) = agent.store().execute("fail_run", run_id=run["run_id"], token=run["token"], now=now, retry_at=now,
                                   outcome="failed", error_number=208, error_sqlstate="42P01",
                                   error_message="no_such_table").rows
    assert row["status"] == "failed"


def alerts(agent, kind=None):
    where = f" WHERE kind = '{kind}'" if kind else " WHERE kind <> 'outcome'"
    return query(agent, f"SELECT run_id, job_name, kind, outcome, detail, status FROM {notifications_table(agent)}{where} "
                        "ORDER BY notification_id")


def deliver(agent, clock_now):
    notifier = Notifier(agent.new_store, lambda: clock_now)
    try:
        while notifier.deliver_due():
            pass
    finally:
        notifier._close_store()


def test_a_run_past_max_duration_is_notified_once_and_stop_after_stops_it(agent_factory, db_url, receiver):
    slot = at("2026-03-02T10:00:00")
    agent = build(agent_factory, receiver, {
        "long": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_DURATION_SECONDS": "60", "STOP_AFTER_SECONDS": "150"},
        "plain": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1"}})
    agent.tick(slot - timedelta(seconds=30))
    assert start(agent, "long", slot)["decision"] == "start"
    assert start(agent, "plain", slot)["decision"] == "start"
    assert next_alert_moment(agent.store(), slot) == slot + timedelta(seconds=60)
    raised = []
    for seconds in (30, 59, 61, 90, 120):
        report = agent.tick(slot + timedelta(seconds=seconds))
        assert not report.errors, report.errors
        raised += report.alerts
    assert [(a["job_name"], a["kind"], a["outcome"]) for a in raised] == [("long", "duration", "running")]
    assert "MAX_DURATION_SECONDS=60" in raised[0]["detail"]
    assert next_alert_moment(agent.store(), slot + timedelta(seconds=120)) == slot + timedelta(seconds=150)
    run = run_of(agent, "long", slot)
    assert run["status"] == "running"
    # STOP_AFTER_SECONDS: stopped as `stop` stops a run, once, and told once.
    stops = []
    for seconds in (151, 180, 240):
        report = agent.tick(slot + timedelta(seconds=seconds))
        assert not report.errors, report.errors
        stops += report.stopped
        raised += report.alerts
    assert [s["job_name"] for s in stops] == ["long"]
    stopped = run_of(agent, "long", slot)
    assert stopped["status"] == "cancelled" and "STOP_AFTER_SECONDS=150" in stopped["note"]
    assert stopped["token"] == run["token"] + 1
    # The worker still running it is fenced off: its completion changes nothing.
    # (PostgreSQL's completion refuses with LeaseLost, SQLite's answers no row.)
    try:
        fenced = not agent.store().execute("finish_run", run_id=run["run_id"], token=run["token"],
                                           now=slot + timedelta(seconds=300)).rows
    except LeaseLost:
        fenced = True
    assert fenced and run_of(agent, "long", slot)["status"] == "cancelled"
    assert [a["kind"] for a in raised] == ["duration", "stopped"]
    assert run_of(agent, "plain", slot)["status"] == "running"        # no limits: untouched
    assert len(alerts(agent)) == 2
    deliver(agent, slot + timedelta(seconds=300))
    bodies = receiver.wait_for(2)
    assert sorted(b["kind"] for b in bodies) == ["duration", "stopped"]
    for body in bodies:
        jsonschema.validate(body, SCHEMA)
        assert body["job"] == "long" and body["run_id"] == run["run_id"] and body["alert"]
    assert [row[5] for row in alerts(agent)] == ["sent", "sent"]


def test_slower_than_the_recent_p95_is_notified_once(agent_factory, db_url, receiver):
    first = at("2026-03-02T01:00:00")
    agent = build(agent_factory, receiver, {"etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "SLOWER_THAN": "2"}})
    # A history of six runs of 8 to 10 s (p95, nearest rank: 10 s).
    for hour, seconds in enumerate((8, 9, 10, 9, 8, 10)):
        slot = first + timedelta(hours=hour)
        agent.tick(slot - timedelta(seconds=30))
        assert start(agent, "etl", slot)["decision"] == "start"
        succeed(agent, "etl", slot, slot + timedelta(seconds=seconds))
        assert agent.tick(slot + timedelta(seconds=30)).alerts == []
    slot = first + timedelta(hours=6)
    agent.tick(slot - timedelta(seconds=30))
    start(agent, "etl", slot)
    assert agent.tick(slot + timedelta(seconds=15)).alerts == []        # 15 s: not 2 x 10 s
    raised = agent.tick(slot + timedelta(seconds=21)).alerts
    assert [(a["kind"], a["outcome"]) for a in raised] == [("slower", "running")]
    assert "SLOWER_THAN=2" in raised[0]["detail"] and "(10.0 s)" in raised[0]["detail"]
    succeed(agent, "etl", slot, slot + timedelta(seconds=40))
    assert agent.tick(slot + timedelta(seconds=45)).alerts == []
    # A run that ended slow between two ticks is told too (once).
    slot = first + timedelta(hours=7)
    agent.tick(slot - timedelta(seconds=30))
    start(agent, "etl", slot)
    succeed(agent, "etl", slot, slot + timedelta(seconds=50))
    raised = agent.tick(slot + timedelta(seconds=55)).alerts
    assert [(a["kind"], a["outcome"]) for a in raised] == [("slower", "succeeded")]
    assert agent.tick(slot + timedelta(seconds=90)).alerts == []
    assert len(alerts(agent, "slower")) == 2


def test_too_little_history_raises_no_slower_alert(agent_factory, db_url, receiver):
    first = at("2026-03-02T01:00:00")
    agent = build(agent_factory, receiver, {"etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "SLOWER_THAN": "2"}})
    for hour in range(4):                      # 4 successful runs: fewer than MIN_HISTORY_RUNS
        slot = first + timedelta(hours=hour)
        agent.tick(slot - timedelta(seconds=30))
        start(agent, "etl", slot)
        succeed(agent, "etl", slot, slot + timedelta(seconds=5))
    slot = first + timedelta(hours=4)
    agent.tick(slot - timedelta(seconds=30))
    start(agent, "etl", slot)
    assert agent.tick(slot + timedelta(seconds=600)).alerts == []


def test_deadline_is_notified_once_per_slot_for_each_cause(agent_factory, db_url, receiver):
    slot = at("2026-03-02T10:00:00")
    every = "0 * * * * *"                     # each minute: the second slot meets the first still running
    deadline = {"DEADLINE_SECONDS": "300"}
    agent = build(agent_factory, receiver, {
        "fails": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1", **deadline},
        "fine": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", **deadline},
        "late": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", **deadline},
        "idle": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", **deadline},
        "busy": {"SCHEDULE": every, "COMMAND": "SELECT 1", **deadline},
        "nolimit": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1"},
    })
    agent.tick(slot - timedelta(seconds=30))
    for job in ("fails", "fine", "late", "busy", "nolimit"):
        assert start(agent, job, slot)["decision"] == "start"
    fail(agent, "fails", slot, slot + timedelta(seconds=5))
    fail(agent, "nolimit", slot, slot + timedelta(seconds=5))
    succeed(agent, "fine", slot, slot + timedelta(seconds=299))
    agent.tick(slot + timedelta(seconds=30))
    second = slot + timedelta(minutes=1)
    assert start(agent, "busy", second)["decision"] == "skip-overlap"   # its first run still running
    assert run_of(agent, "busy", second)["status"] == "skipped"
    assert next_alert_moment(agent.store(), slot + timedelta(seconds=60)) == slot + timedelta(seconds=300)
    raised = []
    for seconds in (299, 301, 330, 361, 420, 600):
        report = agent.tick(slot + timedelta(seconds=seconds))
        assert not report.errors, report.errors
        raised += [(a["job_name"], a["outcome"], a["run_id"]) for a in report.alerts]
        if seconds == 330:
            succeed(agent, "late", slot, slot + timedelta(seconds=330))    # after its deadline: told already
    by_slot = {}
    for job, outcome, run_id in raised:
        by_slot.setdefault((job, run_id), []).append(outcome)
    assert all(len(outcomes) == 1 for outcomes in by_slot.values()), by_slot
    told = {(job, outcome) for job, outcome, _ in raised}
    # Failed for good; still running at its deadline (it succeeded later); never started; skipped.
    assert ("fails", "failed") in told and ("late", "running") in told
    assert ("idle", "pending") in told or ("idle", "queued") in told
    assert ("busy", "running") in told and ("busy", "skipped") in told
    assert not any(job in ("fine", "nolimit") for job, _ in told)
    busy_second = run_of(agent, "busy", second)["run_id"]
    assert ("busy", busy_second) in by_slot
    assert {job for job, _ in told} == {"fails", "late", "idle", "busy"}
    assert len(alerts(agent, "deadline")) == len(raised)
    assert alerts(agent, "duration") == [] and alerts(agent, "slower") == []
    # A later tick tells nothing twice: only the slots of "busy" whose deadlines came since.
    later = agent.tick(slot + timedelta(seconds=900)).alerts
    assert later and {a["job_name"] for a in later} == {"busy"}
    assert not {a["run_id"] for a in later} & {run_id for _, _, run_id in raised}


def test_ticks_racing_write_each_alert_once(agent_factory, db_url, receiver):
    slot = at("2026-03-02T10:00:00")
    jobs = {f"j{i}": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_DURATION_SECONDS": "60",
                      "DEADLINE_SECONDS": "120"} for i in range(8)}
    agent = build(agent_factory, receiver, jobs)
    agent.tick(slot - timedelta(seconds=30))
    for name in jobs:
        start(agent, name, slot)
    others = [build(agent_factory, receiver, jobs) for _ in range(3)]
    barrier = threading.Barrier(4)
    reports, failures = [], []

    def tick(instance):
        try:
            barrier.wait(timeout=30)
            reports.append(instance.tick(slot + timedelta(seconds=200)))
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=tick, args=(instance,)) for instance in [agent, *others]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert all(not report.errors for report in reports), [r.errors for r in reports]
    told = [(a["job_name"], a["kind"]) for report in reports for a in report.alerts]
    assert sorted(told) == sorted((name, kind) for name in jobs for kind in ("duration", "deadline"))
    assert len(alerts(agent)) == 16


def test_the_tick_statements_do_not_grow_with_the_jobs_with_alerts(agent_factory, db_url, receiver):
    counts = []
    for phase, size in enumerate((2, 20)):
        slot = at("2026-03-02T10:00:00") + timedelta(days=phase)
        jobs = {f"p{phase}j{i}": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_DURATION_SECONDS": "60",
                                  "STOP_AFTER_SECONDS": "120", "SLOWER_THAN": "3", "DEADLINE_SECONDS": "90"}
                for i in range(size)}
        agent = build(agent_factory, receiver, jobs)
        agent.tick(slot - timedelta(seconds=30))
        for name in jobs:
            assert start(agent, name, slot)["decision"] == "start"
        agent.tick(slot + timedelta(seconds=30))
        report = agent.tick(slot + timedelta(seconds=70))             # duration
        assert [a["kind"] for a in report.alerts] == ["duration"] * size
        counts.append(report.statements)
        report = agent.tick(slot + timedelta(seconds=150))            # stops, stopped and deadline at once
        assert not report.errors, report.errors
        assert len(report.stopped) == size, report.stopped
        assert sorted({a["kind"] for a in report.alerts}) == ["deadline", "stopped"]
        assert len(report.alerts) == 2 * size
        counts.append(report.statements)
    assert counts[:2] == counts[2:], counts


@pytest.mark.parametrize("suffix,raw,expected", [
    ("MAX_DURATION_SECONDS", "0", "a whole number from 1 to 604800"),
    ("STOP_AFTER_SECONDS", "ten", "a whole number from 1 to 604800"),
    ("DEADLINE_SECONDS", "999999999", "a whole number from 1 to 604800"),
    ("SLOWER_THAN", "1", "a number above 1"),
    ("SLOWER_THAN", "nan", "a number above 1"),
])
def test_a_bad_alert_setting_names_the_setting_and_stops_only_its_job(suffix, raw, expected):
    settings = load_settings(environ=job_env({
        "bad": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", suffix: raw},
        "good": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "SLOWER_THAN": "1.5", "DEADLINE_SECONDS": "60"}}))
    assert [job.name for job in settings.jobs] == ["good"]
    assert settings.jobs[0].slower_than == 1.5 and settings.jobs[0].deadline_seconds == 60
    (bad,) = settings.invalid_jobs
    assert f"JOB__bad__{suffix}={raw!r}" in bad.message and expected in bad.message


def test_jobs_lists_the_limits(agent_factory, db_url, receiver, capsys):
    from shared.cli.commands import cmd_jobs
    from shared.engine.views import jobs_view
    agent = build(agent_factory, receiver, {
        "etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_DURATION_SECONDS": "60", "STOP_AFTER_SECONDS": "300",
                "SLOWER_THAN": "2.5", "DEADLINE_SECONDS": "900"},
        "plain": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1"}})
    agent.tick(at("2026-03-02T09:00:00"))
    rows = {row["job_name"]: row for row in jobs_view(agent.store(), at("2026-03-02T09:00:00"))}
    assert (rows["etl"]["max_duration_seconds"], rows["etl"]["stop_after_seconds"], rows["etl"]["slower_than"],
            rows["etl"]["deadline_seconds"]) == (60, 300, 2.5, 900)
    assert [rows["plain"][k] for k in ("max_duration_seconds", "stop_after_seconds", "slower_than",
                                       "deadline_seconds")] == [None] * 4

    class Args:
        json = False

    assert cmd_jobs(agent, Args()) == 0
    out = capsys.readouterr().out
    assert "max 60 s, stop 300 s, slower 2.5x p95, deadline 900 s" in out
    # The monitor's job page says the same.
    import contextlib
    from datetime import datetime, timezone
    from shared.web.app import Monitor, MonitorSettings

    @contextlib.contextmanager
    def lend():
        store = agent.new_store()
        try:
            yield store
        finally:
            store.close()

    monitor = Monitor(lend, clock=lambda: datetime.now(timezone.utc), settings=MonitorSettings, base_path="")
    response = monitor.handle("GET", "/jobs/etl", "", "")
    assert response.status == 200, response.body[:300]
    assert "<dt>Alerts</dt><dd>max 60 s, stop 300 s, slower 2.5x p95, deadline 900 s</dd>" in response.body.decode()


def test_a_quiet_tick_wakes_for_a_deadline_nothing_else_would_wake_for(agent_factory, db_url, receiver):
    """A slot whose run failed for good leaves nothing pending, leased or due: only its deadline
    (next_alert_moment) keeps a quiet tick from sleeping past it."""
    from shared.engine import quiet
    slot = at("2026-03-02T10:00:00")
    agent = build(agent_factory, receiver, {
        "fails": {"SCHEDULE": "0 0 0 * * *", "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1", "DEADLINE_SECONDS": "3600"}},
        AGENT_QUIET_MAX_MINUTES="120")
    agent.tick(slot)                                                # the job synced; its next slot: midnight
    day = at("2026-03-03T00:00:00")
    agent.tick(day - timedelta(seconds=30))
    start(agent, "fails", day)
    fail(agent, "fails", day, day + timedelta(seconds=5))
    now = day + timedelta(seconds=60)
    agent.tick(now)
    assert next_alert_moment(agent.store(), now) == day + timedelta(seconds=3600)
    wake, why = quiet.horizon(agent.store(), agent.settings, now)
    assert why == "next_alert_at" and wake <= day + timedelta(seconds=3600), (wake, why)
    assert [a["kind"] for a in agent.tick(day + timedelta(seconds=3601)).alerts] == ["deadline"]
