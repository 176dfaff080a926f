"""Schedules hardened after an attack (issue 33), on SQLite, PostgreSQL and SQL Server when
AGENT_TEST_MSSQL is set (the T-SQL procedures on both servers): a run is keyed by a function of the job's definition and the time it stands for,
never of what one tick decided about it, so a slot is claimed once whichever instance and tick
plans it (jitter with ON_EXCLUDED=next, a slot one tick claims ahead and another catches up);
backfill knows a slot's run whatever jitter keyed it and refuses a disabled job; a change of a
job's calendars or jitter re-plans its runs claimed ahead (settings jobs, and database jobs
through agent.set_job_calendars and the calendars it names) instead of duplicating them or
leaving them at a time a new calendar excludes; a moved catch-up run keeps its catch-up note; a
catch-up window larger than the scan runs its newest slots and says what it dropped; jitter never
pushes a run into an excluded period; a one-time run a calendar moved is decided again when its
calendars change, and never runs twice."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine import scheduler
from shared.engine.operations import backfill, backfill_slots, pause_job, resume_job
from shared.engine.views import upcoming_slots
from shared.errors import UsageError
from shared.messaging.memory import MemoryQueue
from tests.support.harness import MSSQL_BASE, at, execute, fresh_database, make_agent, work
from tests.support.tsql_caller import call, connect

UTC = timezone.utc
HOURLY = {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}
# 2026-12-04 is a Friday.
FREEZE = {"CALENDAR__freeze__WEEKLY": "FRI 08:30-10:00"}
REPLANNED_SETTINGS = "skipped: the job's calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed"
REPLANNED_DATABASE = ("skipped: the job's calendars or jitter changed (agent.set_job_calendars, add_calendar or "
                      "remove_calendar) after this slot was claimed")
# A run a calendar had moved, recorded skipped by such a change (the job is then decided again from now).
MOVED_SETTINGS = "skipped: the job's calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here"
MOVED_DATABASE = ("skipped: the job's calendars or jitter changed (agent.set_job_calendars, add_calendar or "
                  "remove_calendar) after a calendar moved this run here")


def history(agent, job):
    rows = agent.store().execute("list_history", job_name=job, limit=5000).rows
    return sorted(rows, key=lambda r: (_aware(r["scheduled_for"]), r["run_id"]))


def _aware(value):
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def live(rows):
    """The runs that run or may run (not skipped, not cancelled)."""
    return [r for r in rows if r["status"] not in ("skipped", "cancelled")]


def table(agent, name):
    return f"agent_{name}" if agent.target.dialect == "sqlite" else f"agent.{name}"


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


# ---------------------------------------------------------------- 1. one run per slot, whoever plans it


def test_a_moved_run_and_the_schedules_own_slot_there_are_one_run_across_instances(db_url):
    """Jitter with ON_EXCLUDED=next: the 09:00 slot is excluded and moved to 10:00, a slot of the
    schedule too. One instance claims the moved run (its tick reaches 09:00), another, an hour later,
    the 10:00 slot itself: both key it at 10:00 + the jitter of 10:00, so it is claimed once."""
    jobs = {"moved": {**HOURLY, "EXCLUDE": "freeze", "ON_EXCLUDED": "next", "JITTER_SECONDS": "600"}}
    first = make_agent(db_url, jobs, **FREEZE)
    second = make_agent(db_url, jobs, **FREEZE)
    first.tick(at("2026-12-04T08:59:30"))
    second.tick(at("2026-12-04T09:59:30"))
    first.tick(at("2026-12-04T10:30:00"))
    second.tick(at("2026-12-04T10:30:00"))
    rows = history(first, "moved")
    ten = [r for r in rows if at("2026-12-04T10:00:00") <= _aware(r["scheduled_for"]) < at("2026-12-04T11:00:00")]
    assert [(_aware(r["scheduled_for"]), r["status"]) for r in ten] == [(at("2026-12-04T10:00:21"), "pending")], ten
    assert ten[0]["note"] == "calendar: freeze; moved from 2026-12-04T09:00:00+00:00 (jitter: +21 s from 2026-12-04T10:00:00+00:00)"
    nine = [r for r in rows if _aware(r["scheduled_for"]) < at("2026-12-04T10:00:00")]
    assert [(_aware(r["scheduled_for"]), r["status"], r["note"]) for r in nine] == [
        (at("2026-12-04T09:00:00"), "skipped", "calendar: freeze; moved to 2026-12-04T10:00:00+00:00")]


def test_a_slot_two_ticks_decide_differently_is_still_one_run(db_url):
    """One tick claims 10:00 ahead (keyed at its jittered time); a racing tick that read the job
    before that claim committed decides the same slot later, as missed and caught up once
    (run-once): it keys it the same, and the unique (job, slot) key keeps one run."""
    agent = make_agent(db_url, {"racer": {**HOURLY, "JITTER_SECONDS": "600"}})
    agent.tick(at("2026-12-04T09:59:30"))
    # The racing tick saw 10:00 as the job's next slot (the first tick's advance not yet committed).
    execute(agent, f"UPDATE {table(agent, 'jobs')} SET next_due_at = '2026-12-04 10:00:00' WHERE job_name = 'racer'")
    agent.tick(at("2026-12-04T10:20:00"))
    rows = [r for r in history(agent, "racer")
            if at("2026-12-04T10:00:00") <= _aware(r["scheduled_for"]) < at("2026-12-04T11:00:00")]
    assert [_aware(r["scheduled_for"]) for r in rows] == [at("2026-12-04T10:06:24")], rows


def test_two_instances_ticking_at_once_at_different_times_claim_each_slot_once(db_url):
    """Two instances tick at the same moment, one a little before each slot, the other after it
    (its clock, or its slow tick, past AGENT_MISFIRE_THRESHOLD_SECONDS: the slot is missed for it
    and caught up once), through an excluded stretch moved with ON_EXCLUDED=next: whichever wins,
    each slot has one run."""
    jobs = {"racer": {**HOURLY, "EXCLUDE": "freeze", "ON_EXCLUDED": "next", "JITTER_SECONDS": "600"}}
    agents = [make_agent(db_url, jobs, **FREEZE), make_agent(db_url, jobs, **FREEZE)]
    errors: list[BaseException] = []
    for hour in range(7, 13):
        barrier = threading.Barrier(2)
        moments = [at(f"2026-12-04T{hour - 1:02d}:59:30"), at(f"2026-12-04T{hour:02d}:03:00")]

        def tick(agent, moment):
            try:
                barrier.wait(timeout=30)
                agent.tick(moment)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=tick, args=pair) for pair in zip(agents, moments)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    rows = live(history(agents[0], "racer"))
    per_slot = Counter(_aware(r["scheduled_for"]).replace(minute=0, second=0) for r in rows)
    assert per_slot and max(per_slot.values()) == 1, [(r["scheduled_for"], r["note"]) for r in rows]
    assert at("2026-12-04T09:00:00") not in per_slot         # excluded: its run is the 10:00 slot's


# ---------------------------------------------------------------- 2. backfill


def test_backfill_knows_a_slot_run_under_another_jitter_and_reruns_a_skipped_one_in_place(db_url):
    now = at("2026-12-04T12:00:00")
    first = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "600"}}, clock=lambda: now)
    for hour in range(7, 12):
        first.tick(at(f"2026-12-04T{hour - 1:02d}:59:30"))
    claimed = [r for r in history(first, "jit") if r["kind"] == "scheduled"]
    assert len(claimed) == 5
    # They ran; the 09:00 slot's run was skipped and never started (a misfire, say).
    execute(first, f"UPDATE {table(first, 'runs')} SET status = 'succeeded', attempt = 1 WHERE job_name = 'jit'")
    nine = next(r for r in claimed if at("2026-12-04T09:00:00") <= _aware(r["scheduled_for"]) < at("2026-12-04T10:00:00"))
    execute(first, f"UPDATE {table(first, 'runs')} SET status = 'skipped', attempt = 0, note = 'misfire: test' "
                   f"WHERE run_id = {nine['run_id']}")
    # The job's jitter changes: the keys backfill computes are not those the runs have.
    second = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "300"}}, clock=lambda: now)
    second.tick(at("2026-12-04T11:59:50"))
    assert backfill_slots(next(r for r in second.store().execute("list_jobs").rows if r["job_name"] == "jit"),
                          at("2026-12-04T07:00:00"), at("2026-12-04T11:00:00"), now)[0] != sorted(
        _aware(r["scheduled_for"]) for r in claimed)
    done = backfill(second, "jit", at("2026-12-04T07:00:00"), at("2026-12-04T11:00:00"))
    assert [(row["scheduled_for"], row["action"]) for row in done.made] == [(_aware(nine["scheduled_for"]), "rerun")]
    assert done.already == 4 and done.slots == 5
    rows = history(second, "jit")
    assert len(rows) == 6          # the five slots and the 12:00 slot the last tick claimed: nothing inserted
    assert Counter(r["kind"] for r in rows) == Counter({"scheduled": 5, "backfill": 1})


def test_backfill_of_a_disabled_job_is_refused_naming_it(db_url):
    now = at("2026-12-04T12:00:00")
    agent = make_agent(db_url, {"off": {**HOURLY, "ENABLED": "false"}}, clock=lambda: now)
    agent.tick(at("2026-12-04T11:59:30"))
    with pytest.raises(UsageError) as caught:
        backfill(agent, "off", at("2026-12-04T07:00:00"), at("2026-12-04T11:00:00"))
    assert "job 'off' is disabled" in str(caught.value) and "enable it first" in str(caught.value)
    assert history(agent, "off") == []
    audit = [r for r in agent.store().execute("list_audit", job_name=None, since=None, limit=10).rows
             if r["action"] == "backfill"]
    assert [r["outcome"] for r in audit] == ["refused"]


# ---------------------------------------------------------------- 3-4. a change of calendars or jitter


def test_a_settings_jitter_change_replans_the_runs_claimed_ahead_once(db_url):
    agent = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "600"}})
    agent.tick(at("2026-12-04T09:59:30"))          # 10:00 claimed ahead, +257 s
    ahead = [_aware(r["scheduled_for"]) for r in live(history(agent, "jit"))]
    assert ahead == [at("2026-12-04T10:04:17")]
    changed = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "60"}})
    changed.tick(at("2026-12-04T09:59:40"))
    rows = history(changed, "jit")
    assert [(_aware(r["scheduled_for"]), r["note"]) for r in rows if r["status"] == "skipped"] == [
        (at("2026-12-04T10:04:17"), REPLANNED_SETTINGS)]
    assert [_aware(r["scheduled_for"]) for r in live(rows)] == [at("2026-12-04T10:00:29")]      # +29 s of 60
    # Within a run's jitter (its slot has come, its delayed time not yet), a change leaves it: it is
    # the run of a slot before the job's next slot, which the new plan does not cover.
    changed.tick(at("2026-12-04T10:59:30"))
    (eleven,) = [r for r in live(history(changed, "jit")) if _aware(r["scheduled_for"]) >= at("2026-12-04T11:00:00")]
    assert _aware(eleven["scheduled_for"]) == at("2026-12-04T11:00:25")
    again = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "30"}})
    again.tick(at("2026-12-04T11:00:10"))
    assert [(r["run_id"], r["status"]) for r in history(again, "jit")
            if _aware(r["scheduled_for"]) >= at("2026-12-04T11:00:00")] == [(eleven["run_id"], "pending")]


def test_a_jitter_change_after_downtime_still_decides_the_missed_slots(db_url):
    """The change is synced by a tick after downtime: the job's next slot stays the first one not
    claimed (the missed slots are decided by the misfire policy, never passed over), and the run
    claimed before the downtime, keyed before the new next slot, is left as it is."""
    agent = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "600"}})
    agent.tick(at("2026-12-04T09:59:30"))
    (ten,) = live(history(agent, "jit"))
    changed = make_agent(db_url, {"jit": {**HOURLY, "JITTER_SECONDS": "60"}})
    changed.tick(at("2026-12-04T13:30:00"))
    rows = history(changed, "jit")
    slots = {_aware(r["scheduled_for"]).replace(minute=0, second=0): r for r in rows}
    assert sorted(slots) == [at(f"2026-12-04T{hour}:00:00") for hour in (10, 11, 12, 13)]
    assert slots[at("2026-12-04T10:00:00")]["run_id"] == ten["run_id"]
    assert slots[at("2026-12-04T10:00:00")]["note"] != REPLANNED_SETTINGS
    assert slots[at("2026-12-04T13:00:00")]["note"].startswith("misfire: caught up late, once")
    assert [slots[at(f"2026-12-04T{hour}:00:00")]["status"] for hour in (11, 12)] == ["skipped", "skipped"]


def test_a_run_moved_to_a_time_a_new_calendar_excludes_does_not_run(db_url):
    """ON_EXCLUDED=next moved the 24 December slot to 27 December 00:00; the freeze is then
    extended over the 27th: the moved run claimed ahead is recorded skipped, and the stretch's
    run comes after the new freeze, once."""
    job = {"nightly": {"SCHEDULE": "0 0 2 * * *", "COMMAND": "SELECT 1", "EXCLUDE": "freeze", "ON_EXCLUDED": "next"}}
    agent = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-26")
    agent.tick(at("2026-12-24T01:59:30"))
    moved = [r for r in live(history(agent, "nightly"))]
    assert [_aware(r["scheduled_for"]) for r in moved] == [at("2026-12-27T00:00:00")]
    extended = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-27")
    for moment in ("2026-12-24T03:00:00", "2026-12-25T01:59:30", "2026-12-26T01:59:30", "2026-12-26T23:59:30",
                   "2026-12-27T01:59:30", "2026-12-27T23:59:30", "2026-12-28T01:59:30"):
        extended.tick(at(moment))
    rows = history(extended, "nightly")
    assert [(_aware(r["scheduled_for"]), r["note"]) for r in rows if r["run_id"] == moved[0]["run_id"]] == [
        (at("2026-12-27T00:00:00"), MOVED_SETTINGS)]
    assert [_aware(r["scheduled_for"]) for r in live(rows)] == [at("2026-12-28T00:00:00"), at("2026-12-28T02:00:00")]


SERVERS = ["postgres"] + (["mssql"] if MSSQL_BASE else [])


@contextlib.contextmanager
def agent_and_connection(dialect: str, **settings: str):
    """An agent on the real clock (the procedures read the server's) and a user's connection."""
    with fresh_database(dialect) as url:
        agent = make_agent(url, **settings)
        connection = connect(url)
        try:
            yield agent, connection
        finally:
            connection.close()
            agent.close()


@pytest.fixture(params=SERVERS)
def procedures(request):
    """On PostgreSQL and, when AGENT_TEST_MSSQL names one, on SQL Server (Babelfish)."""
    with agent_and_connection(request.param) as pair:
        yield pair


def test_set_job_calendars_replaces_the_runs_claimed_ahead_instead_of_duplicating_them(procedures):
    agent, connection = procedures
    if agent.target.dialect != "postgres":
        # Babelfish takes seconds a call under load: start early in a minute, so that the slot
        # claimed ahead is still ahead when the planning after the change runs.
        deadline = time.monotonic() + 65
        while datetime.now(UTC).second > 3 and time.monotonic() < deadline:
            time.sleep(0.5)
    call(connection, "add_scheduled_job", name="minutely", sql="SELECT 1", schedule="0 * * * * *")
    call(connection, "set_job_calendars", job_name="minutely", jitter_seconds=50)
    agent.tick()
    ahead = live(history(agent, "minutely"))
    assert ahead, "nothing claimed ahead"
    call(connection, "set_job_calendars", job_name="minutely", jitter_seconds=5)
    agent.tick()
    rows = history(agent, "minutely")
    per_slot = Counter(_aware(r["scheduled_for"]).replace(second=0, microsecond=0) for r in live(rows))
    assert per_slot and max(per_slot.values()) == 1, rows
    replaced = [r for r in rows if r["note"] == REPLANNED_DATABASE]
    assert replaced, "no run claimed ahead was replaced"
    assert {r["run_id"] for r in replaced} <= {r["run_id"] for r in ahead}
    # The same call again changes nothing: nothing is replanned, nothing skipped.
    call(connection, "set_job_calendars", job_name="minutely", jitter_seconds=5)
    agent.tick()
    assert len([r for r in history(agent, "minutely") if r["note"] == REPLANNED_DATABASE]) == len(replaced)
    # The audit of the procedure is as it was.
    audit = [r for r in agent.store().execute("list_audit", job_name=None, since=None, limit=50).rows
             if r["action"] == "set-calendars"]
    assert len(audit) == 3


def test_a_calendar_a_database_job_now_names_skips_its_runs_claimed_ahead(procedures):
    agent, connection = procedures
    call(connection, "add_scheduled_job", name="minutely", sql="SELECT 1", schedule="0 * * * * *")
    agent.tick()
    assert live(history(agent, "minutely"))
    today = datetime.now(UTC).date()
    call(connection, "add_calendar", name="freeze", dates=f"{today - timedelta(days=1)}..{today + timedelta(days=1)}")
    call(connection, "set_job_calendars", job_name="minutely", exclude_calendars="freeze")
    agent.tick()
    now = datetime.now(UTC)
    # What still runs was keyed before the job's first slot after the change (a slot that had come).
    assert all(_aware(r["scheduled_for"]) < now + timedelta(seconds=1) for r in live(history(agent, "minutely")))
    later = [r for r in history(agent, "minutely") if _aware(r["scheduled_for"]) > now + timedelta(seconds=1)]
    assert later and all(r["status"] == "skipped" for r in later)
    assert {r["note"] for r in later} <= {REPLANNED_DATABASE, "calendar: freeze"}


# ---------------------------------------------------------------- 5. a moved catch-up keeps its note


def test_a_catch_up_slot_moved_by_a_calendar_runs_as_a_catch_up(db_url):
    jobs = {"caught": {**HOURLY, "CATCHUP_SECONDS": "21600", "OVERLAP": "queue", "EXCLUDE": "freeze",
                       "ON_EXCLUDED": "next"}}
    agent = make_agent(db_url, jobs, queue=MemoryQueue(), CALENDAR__freeze__WEEKLY="FRI 02:30-04:30")
    agent.tick(at("2026-12-04T00:00:30"))
    agent.tick(at("2026-12-04T07:00:30"))          # down since: 01:00 to 06:00 missed
    rows = {_aware(r["scheduled_for"]): r for r in history(agent, "caught")}
    moved = rows[at("2026-12-04T04:30:00")]
    assert moved["note"].startswith("catch-up:"), moved["note"]
    assert "calendar: freeze; moved from 2026-12-04T03:00:00+00:00" in moved["note"]
    assert moved["status"] != "skipped", moved
    assert rows[at("2026-12-04T03:00:00")]["status"] == "skipped"
    assert rows[at("2026-12-04T04:00:00")]["status"] == "skipped"
    assert all(r["status"] != "skipped" for moment, r in rows.items() if moment in (
        at("2026-12-04T02:00:00"), at("2026-12-04T05:00:00"), at("2026-12-04T06:00:00")))


# ---------------------------------------------------------------- 6. a huge catch-up window


def test_a_huge_catch_up_window_runs_its_newest_slots_and_says_what_it_dropped(caplog):
    """250,000 missed slots of a per-second job (more than MAX_MISSED_SCAN, where the walk used to
    stop and drop the rest): the newest 1,000 run, the older ones are counted up to a bound."""
    now = at("2026-12-04T12:00:00")
    late_cutoff = now - timedelta(seconds=120)
    job = {"job_name": "busy", "schedule": "* * * * * *", "timezone": "UTC", "misfire": "run-once",
           "grace_seconds": 300_000, "catchup_seconds": 250_000, "next_due_at": now - timedelta(seconds=260_000),
           "paused": 0, "paused_at": None, "paused_until": None, "calendars": None}
    with caplog.at_level(logging.WARNING, logger="shared.engine.scheduler"):
        planned, following = scheduler._plan_slots(job, now, now + timedelta(seconds=90), late_cutoff)
    window = [entry for entry in planned if (entry[2] or "").startswith("catch-up:")]
    assert len(window) == scheduler.MAX_CATCHUP_SLOTS
    # The newest ones: up to the misfire cut-off, every second.
    assert window[-1][0] == late_cutoff - timedelta(seconds=1)
    assert window[0][0] == late_cutoff - timedelta(seconds=scheduler.MAX_CATCHUP_SLOTS)
    assert f"(at least {scheduler.MAX_DROPPED_COUNTED} older slot(s) of the window not run" in window[0][2], window[0][2]
    assert any("busy" in record.getMessage() and "at least" in record.getMessage() for record in caplog.records)
    ahead = [entry for entry in planned if entry[0] >= late_cutoff]
    assert ahead and ahead[0][0] == late_cutoff and following is not None


def test_a_catch_up_window_of_a_few_thousand_slots_counts_what_it_dropped_exactly():
    now = at("2026-12-04T12:00:00")
    late_cutoff = now - timedelta(seconds=120)
    job = {"job_name": "busy", "schedule": "* * * * * *", "timezone": "UTC", "misfire": "run-once",
           "grace_seconds": 10_000, "catchup_seconds": 5_000, "next_due_at": now - timedelta(seconds=5_000),
           "paused": 0, "paused_at": None, "paused_until": None, "calendars": None}
    planned, _ = scheduler._plan_slots(job, now, now + timedelta(seconds=90), late_cutoff)
    window = [entry for entry in planned if (entry[2] or "").startswith("catch-up:")]
    assert len(window) == scheduler.MAX_CATCHUP_SLOTS and window[-1][0] == late_cutoff - timedelta(seconds=1)
    assert f"({5_000 - 120 - scheduler.MAX_CATCHUP_SLOTS} older slot(s) of the window not run" in window[0][2]


# ---------------------------------------------------------------- 7. jitter and excluded periods


def test_jitter_never_pushes_a_run_into_an_excluded_period(db_url):
    """10:00 is allowed but 10:00 + its jitter (811 s) falls in the freeze from 10:05: the run keeps
    its slot's time. The planner, `next` and backfill key it alike."""
    jobs = {"edge": {**HOURLY, "EXCLUDE": "freeze", "JITTER_SECONDS": "3000"}}
    now = at("2026-12-04T12:30:00")
    agent = make_agent(db_url, jobs, clock=lambda: now, CALENDAR__freeze__WEEKLY="FRI 10:05-11:00")
    for moment in ("2026-12-04T08:59:30", "2026-12-04T09:59:30", "2026-12-04T10:59:30"):
        agent.tick(at(moment))
    keys = [_aware(r["scheduled_for"]) for r in history(agent, "edge")]
    assert keys == [at("2026-12-04T09:23:12"), at("2026-12-04T10:00:00"), at("2026-12-04T11:48:21")]
    row = next(r for r in agent.store().execute("list_jobs").rows if r["job_name"] == "edge")
    view = upcoming_slots(row, at("2026-12-04T08:30:00"), 3)
    assert [slot["at"] for slot in view["slots"]] == keys
    assert backfill_slots(row, at("2026-12-04T09:00:00"), at("2026-12-04T12:00:00"), now)[0] == keys
    # Backfill of the window finds the three runs.
    execute(agent, f"UPDATE {table(agent, 'runs')} SET status = 'succeeded', attempt = 1 WHERE job_name = 'edge'")
    done = backfill(agent, "edge", at("2026-12-04T09:00:00"), at("2026-12-04T12:00:00"))
    assert done.made == () and done.already == 3


def test_a_one_time_job_that_ran_does_not_run_again_when_its_jitter_or_calendars_change(procedures):
    """A one-time job runs once. Its run is keyed at the time given (JITTER_SECONDS does not apply
    to a one-time slot: a new jitter would be a new key, a second run of a job that already ran)."""
    agent, connection = procedures
    when = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=3)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=when)
    call(connection, "set_job_calendars", job_name="once", jitter_seconds=30)
    agent.tick()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(r["status"] == "succeeded" for r in history(agent, "once")):
        time.sleep(0.5)
        work(agent, concurrency=1, max_seconds=10)
    (ran,) = history(agent, "once")
    assert ran["status"] == "succeeded" and _aware(ran["scheduled_for"]) == when
    for jitter in (5, 50, 0):
        call(connection, "set_job_calendars", job_name="once", jitter_seconds=jitter)
        agent.tick()
        work(agent, concurrency=1, max_seconds=10)
    assert [(r["run_id"], r["status"]) for r in history(agent, "once")] == [(ran["run_id"], "succeeded")]


# ---------------------------------------------------------------- 8. a one-time run a calendar moved is decided again

ONCE_MOVED = {"once": {"SCHEDULE": "@once 2026-12-24T02:00:00", "COMMAND": "SELECT 1", "EXCLUDE": "freeze",
                       "ON_EXCLUDED": "next"}}


def slots_of(rows):
    return [_aware(r["scheduled_for"]) for r in rows]


def test_a_one_time_run_a_calendar_moved_is_decided_again_when_the_calendars_change(db_url):
    """A one-time job has no next slot once claimed: its run a calendar moved used to keep its
    moved time whatever the calendars became. Now each change of its calendars before it runs
    records that run skipped and decides the job again from now (its slot has passed: not a
    missed slot, the misfire rules do not drop it), one live run at a time; once it ran, a
    change of calendars runs nothing more."""
    agent = make_agent(db_url, ONCE_MOVED, CALENDAR__freeze__DATES="2026-12-24..2026-12-26")
    agent.tick(at("2026-12-24T01:59:30"))
    first = live(history(agent, "once"))
    assert slots_of(first) == [at("2026-12-27T00:00:00")]
    # The freeze is extended over the moved time, three days after the slot (past GRACE_SECONDS).
    extended = make_agent(db_url, ONCE_MOVED, CALENDAR__freeze__DATES="2026-12-24..2026-12-27")
    for moment in ("2026-12-26T10:00:00", "2026-12-26T23:59:30", "2026-12-27T00:00:30"):
        extended.tick(at(moment))
    rows = history(extended, "once")
    assert [r["note"] for r in rows if r["run_id"] == first[0]["run_id"]] == [MOVED_SETTINGS]
    assert slots_of(live(rows)) == [at("2026-12-28T00:00:00")]
    # The freeze is cut short: the job runs now, at the tick that sees the change.
    shortened = make_agent(db_url, ONCE_MOVED, CALENDAR__freeze__DATES="2026-12-24..2026-12-25")
    shortened.tick(at("2026-12-27T12:00:00"))
    shortened.tick(at("2026-12-27T12:01:00"))
    rows = history(shortened, "once")
    assert slots_of(live(rows)) == [at("2026-12-27T12:00:00")]
    assert live(rows)[0]["status"] == "pending"
    # It ran; a later change of its calendars runs nothing more.
    execute(shortened, f"UPDATE {table(shortened, 'runs')} SET status = 'succeeded' "
                       f"WHERE run_id = {live(rows)[0]['run_id']}")
    for dates, moment in (("2026-12-24..2026-12-31", "2026-12-27T13:00:00"), ("2027-01-01", "2027-01-02T13:00:00")):
        make_agent(db_url, ONCE_MOVED, CALENDAR__freeze__DATES=dates).tick(at(moment))
    rows = history(shortened, "once")
    assert [(slots_of([r])[0], r["status"]) for r in live(rows)] == [(at("2026-12-27T12:00:00"), "succeeded")]


def test_a_one_time_run_claimed_ahead_moves_when_a_new_calendar_excludes_its_slot(db_url):
    """Claimed ahead at its slot, then a calendar now excluding the slot: the run is not left at a
    time the calendars exclude; the slot's run is moved as a claim would have moved it."""
    job = {"once": {**ONCE_MOVED["once"], "EXCLUDE": "none_yet"}}
    agent = make_agent(db_url, job, CALENDAR__none_yet__DATES="2026-01-01")
    agent.tick(at("2026-12-24T01:59:30"))
    assert slots_of(live(history(agent, "once"))) == [at("2026-12-24T02:00:00")]
    make_agent(db_url, ONCE_MOVED, CALENDAR__freeze__DATES="2026-12-24").tick(at("2026-12-24T01:59:40"))
    rows = history(agent, "once")
    assert slots_of(live(rows)) == [at("2026-12-25T00:00:00")]
    (slot,) = [r for r in rows if _aware(r["scheduled_for"]) == at("2026-12-24T02:00:00")]
    assert (slot["status"], slot["note"]) == ("skipped", "calendar: freeze; moved to 2026-12-25T00:00:00+00:00")
    # A calendar that allows the slot again: the run is back at its slot, the same run.
    make_agent(db_url, job, CALENDAR__none_yet__DATES="2026-01-01").tick(at("2026-12-24T01:59:50"))
    rows = history(agent, "once")
    assert [(r["run_id"], r["status"]) for r in live(rows)] == [(slot["run_id"], "pending")]


def test_a_one_time_database_job_a_calendar_moved_runs_once_after_its_calendars_change(procedures):
    agent, connection = procedures
    now = datetime.now(UTC)
    if now.hour == 23 and now.minute >= 59:
        time.sleep(61)
        now = datetime.now(UTC)
    today = now.date()
    call(connection, "add_calendar", name="today", dates=str(today))
    when = now.replace(microsecond=0) + timedelta(seconds=2)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=when)
    call(connection, "set_job_calendars", job_name="once", exclude_calendars="today", on_excluded="next")
    agent.tick()
    midnight = datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC)
    assert slots_of(live(history(agent, "once"))) == [midnight]
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 0.5)
    # The exclusion is lifted after the slot passed: the job runs now, once.
    call(connection, "set_job_calendars", job_name="once")
    agent.tick()
    work(agent, concurrency=1, max_seconds=20)
    rows = history(agent, "once")
    assert [r["note"] for r in rows if _aware(r["scheduled_for"]) == midnight] == [MOVED_DATABASE]
    (ran,) = live(rows)
    assert ran["status"] == "succeeded" and when < _aware(ran["scheduled_for"]) < midnight
    # Calendars changed after it ran: nothing runs again.
    for exclude in ("today", None):
        call(connection, "set_job_calendars", job_name="once", exclude_calendars=exclude, on_excluded="next")
        agent.tick()
    assert [(r["run_id"], r["status"]) for r in live(history(agent, "once"))] == [(ran["run_id"], "succeeded")]


def succeed(agent, run_id):
    execute(agent, f"UPDATE {table(agent, 'runs')} SET status = 'succeeded', finished_at = scheduled_for "
                   f"WHERE run_id = {run_id}")


ONCE = {"SCHEDULE": "@once 2026-12-24T02:00:00", "COMMAND": "SELECT 1"}


def test_a_one_time_slot_that_ran_or_was_skipped_for_good_is_not_brought_back_by_a_calendar_change(db_url):
    """From the attack on the re-plan: only a run not yet due is decided again. A one-time job
    backfilled after a missed slot, then given a jitter; one skipped by its misfire rule, then
    given a calendar; one a calendar skipped (ON_EXCLUDED=skip), then the calendar's dates
    changed: none runs (again)."""
    backfilled = {"once": {**ONCE, "MISFIRE": "skip"}}
    agent = make_agent(db_url, backfilled, clock=lambda: at("2026-12-24T05:00:00"))
    agent.tick(at("2026-12-24T04:00:00"))
    backfill(agent, "once", at("2026-12-24T01:00:00"), at("2026-12-24T03:00:00"))
    (ran,) = live(history(agent, "once"))
    succeed(agent, ran["run_id"])
    make_agent(db_url, {"once": {**backfilled["once"], "JITTER_SECONDS": "30"}}).tick(at("2026-12-24T06:00:00"))
    assert [r["run_id"] for r in live(history(agent, "once"))] == [ran["run_id"]]

    other = make_agent(db_url, {"missed": {**ONCE, "MISFIRE": "skip"}})
    other.tick(at("2026-12-24T04:00:00"))
    make_agent(db_url, {"missed": {**ONCE, "MISFIRE": "skip", "EXCLUDE": "x"}},
               CALENDAR__x__DATES="2027-05-05").tick(at("2026-12-30T06:00:00"))
    assert not live(history(other, "missed"))

    held = {"held": {**ONCE, "EXCLUDE": "x"}}
    make_agent(db_url, held, CALENDAR__x__DATES="2026-12-24").tick(at("2026-12-24T01:59:30"))
    make_agent(db_url, held, CALENDAR__x__DATES="2026-12-25").tick(at("2026-12-30T06:00:00"))
    assert not live(history(other, "held")) and history(other, "held")


def test_two_settings_syncs_before_a_claim_keep_the_one_time_job_decided_from_now(db_url):
    """Two instances with different calendars sync, one after the other, before either claims: the
    second sync must not take the job back to its passed time (a missed slot past GRACE_SECONDS
    then, dropped)."""
    moved = ONCE_MOVED["once"]
    make_agent(db_url, {"once": moved}, CALENDAR__freeze__DATES="2026-12-24..2026-12-26").tick(at("2026-12-24T01:59:30"))
    first = make_agent(db_url, {"once": moved}, CALENDAR__freeze__DATES="2026-12-24..2026-12-25")
    second = make_agent(db_url, {"once": moved}, CALENDAR__freeze__DATES="2026-12-24")
    now = at("2026-12-25T12:00:00")
    first.scheduler().sync_jobs(now, scheduler.TickReport(now=now))
    second.tick(now + timedelta(seconds=1))
    later = now + timedelta(seconds=2)
    first.scheduler().claim_slots(later, scheduler.TickReport(now=later))
    for moment in ("2026-12-25T12:01:00", "2026-12-26T00:00:10"):
        second.tick(at(moment))
    assert slots_of(live(history(second, "once"))) == [now + timedelta(seconds=1)]


def test_a_one_time_job_given_a_new_date_is_decided_again_under_its_calendars(db_url):
    """A job reused for a new date (its SCHEDULE edited after its first run ran): the first run
    does not keep the new date's moved run at a time the calendars now exclude."""
    job = {"m": {**ONCE_MOVED["once"], "SCHEDULE": "@once 2026-11-24T02:00:00"}}
    make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-26").tick(at("2026-11-24T01:59:30"))
    agent = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-26")
    (ran,) = live(history(agent, "m"))
    succeed(agent, ran["run_id"])
    job = {"m": {**job["m"], "SCHEDULE": "@once 2026-12-24T02:00:00"}}
    make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-26").tick(at("2026-12-24T01:59:30"))
    make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-27").tick(at("2026-12-26T10:00:00"))
    pending = [r for r in live(history(agent, "m")) if r["status"] == "pending"]
    assert slots_of(pending) == [at("2026-12-28T00:00:00")]


@pytest.fixture(params=SERVERS)
def hurried_procedures(request):
    """As procedures, with an agent that records a slot missed one second after it."""
    with agent_and_connection(request.param, AGENT_MISFIRE_THRESHOLD_SECONDS="1") as pair:
        yield pair


def test_a_one_time_database_job_backfilled_does_not_run_again_when_its_jitter_changes(hurried_procedures):
    agent, connection = hurried_procedures
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=when, misfire="skip")
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 2)
    agent.tick()                                   # not ticking at its time: missed, skipped
    assert not live(history(agent, "once"))
    backfill(agent, "once", when - timedelta(seconds=1), datetime.now(UTC) - timedelta(seconds=1))
    work(agent, concurrency=1, max_seconds=20)
    (ran,) = live(history(agent, "once"))
    assert ran["status"] == "succeeded"
    call(connection, "set_job_calendars", job_name="once", jitter_seconds=5)
    agent.tick()
    work(agent, concurrency=1, max_seconds=20)
    assert [(r["run_id"], r["status"]) for r in live(history(agent, "once"))] == [(ran["run_id"], "succeeded")]


# ---------------------------------------------------------------- 9. the second attack on the re-plan


def test_a_paused_one_time_job_whose_calendars_change_keeps_its_one_run(db_url):
    """A pause holds the moved run (recorded skipped 'paused'); the calendars change meanwhile. The
    held run is not decided again (a pause's slot stays the pause's): resume brings it back, one
    run, never caught up at once inside the new freeze nor lost."""
    for misfire in ("run-once", "skip"):
        job = {f"o_{misfire}": {**ONCE_MOVED["once"], "MISFIRE": misfire}}
        name = f"o_{misfire}"
        agent = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-26")
        agent.tick(at("2026-12-24T01:59:30"))
        pause_job(agent.store(), name, now=at("2026-12-24T10:00:00"))
        changed = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-25")
        changed.tick(at("2026-12-24T12:00:00"))
        resume_job(changed.store(), name, now=at("2026-12-24T14:00:00"))
        for moment in ("2026-12-24T14:00:10", "2026-12-25T12:00:00", "2026-12-26T00:00:10"):
            changed.tick(at(moment))
        assert slots_of(live(history(changed, name))) == [at("2026-12-27T00:00:00")], (misfire, history(changed, name))


def lead(agent) -> timedelta:
    """How far ahead a test on the real clock puts a slot: a few seconds on PostgreSQL; more on SQL
    Server, where Babelfish takes seconds a call under load (the slot must still be ahead when
    the job is defined, planned and paused)."""
    return timedelta(seconds=3 if agent.target.dialect == "postgres" else 40)


def _not_at_midnight():
    now = datetime.now(UTC)
    if now.hour == 23 and now.minute >= 58:
        time.sleep(150)


def test_a_one_time_database_job_redefined_and_given_a_jitter_in_one_planning_keeps_its_run(procedures):
    """The same definition again (a deployment script run twice) and a jitter, before one planning:
    the redefinition recorded the moved run skipped; the job is planned again, not dropped."""
    agent, connection = procedures
    _not_at_midnight()
    now = datetime.now(UTC)
    call(connection, "add_calendar", name="today", dates=str(now.date()))
    when = now.replace(microsecond=0) + timedelta(seconds=2)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=when)
    call(connection, "set_job_calendars", job_name="once", exclude_calendars="today", on_excluded="next")
    agent.tick()
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 1)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=when)
    call(connection, "set_job_calendars", job_name="once", exclude_calendars="today", on_excluded="next",
         jitter_seconds=5)
    agent.tick()
    agent.tick()
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    assert slots_of(live(history(agent, "once"))) == [midnight]


def test_a_one_time_database_slot_a_pause_skipped_for_good_is_not_brought_back_by_a_jitter(procedures):
    agent, connection = procedures
    when = datetime.now(UTC).replace(microsecond=0) + lead(agent)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=when, misfire="skip")
    agent.tick()
    pause_job(agent.store(), "once", now=datetime.now(UTC))
    agent.tick()
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 1)
    agent.tick()
    resume_job(agent.store(), "once", now=datetime.now(UTC))
    agent.tick()
    assert not live(history(agent, "once"))
    call(connection, "set_job_calendars", job_name="once", jitter_seconds=5)
    agent.tick()
    work(agent, concurrency=1, max_seconds=10)
    assert not live(history(agent, "once"))


def test_a_database_schedule_past_its_until_keeps_its_moved_last_run_when_its_jitter_changes(procedures):
    """A schedule with `; until` whose last slot a calendar moved has no next slot: a jitter change
    decides that run again (from now: still excluded today, tomorrow's midnight) instead of
    dropping it."""
    agent, connection = procedures
    _not_at_midnight()
    now = datetime.now(UTC)
    when = now.replace(microsecond=0) + lead(agent)
    call(connection, "add_calendar", name="today", dates=str(now.date()))
    call(connection, "add_scheduled_job", name="u", sql="SELECT 1",
         schedule=f"{when.second} {when.minute} {when.hour} * * * ; until {when.date()}")
    call(connection, "set_job_calendars", job_name="u", exclude_calendars="today", on_excluded="next")
    agent.tick()
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 1)
    agent.tick()
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    assert slots_of(live(history(agent, "u"))) == [midnight]
    call(connection, "set_job_calendars", job_name="u", exclude_calendars="today", on_excluded="next",
         jitter_seconds=5)
    agent.tick()
    agent.tick()
    assert len(live(history(agent, "u"))) == 1, history(agent, "u")


@pytest.mark.parametrize("schedule", ["0 0 2 * * *", "0 0 2 * * * ; until 2026-12-24"])
def test_a_freeze_extended_over_the_time_an_earlier_slot_moved_to_moves_that_run_again(db_url, schedule):
    """Daily at 02:00; a freeze on the 24th moves that slot to the 25th 00:00, before the 25th's own
    slot. The freeze is extended over the 25th: that run is decided again (from now: the end of
    the new freeze), with the 25th's slot, one run; a schedule past its `until` alike."""
    job = {"d": {"SCHEDULE": schedule, "COMMAND": "SELECT 1", "EXCLUDE": "freeze", "ON_EXCLUDED": "next"}}
    agent = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24")
    agent.tick(at("2026-12-24T01:59:30"))
    assert slots_of(live(history(agent, "d"))) == [at("2026-12-25T00:00:00")]
    extended = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-25")
    for moment in ("2026-12-24T10:00:00", "2026-12-25T01:59:30", "2026-12-25T23:59:30"):
        extended.tick(at(moment))
    rows = history(extended, "d")
    assert slots_of(live(rows))[:1] == [at("2026-12-26T00:00:00")], rows
    assert not [r for r in live(rows) if _aware(r["scheduled_for"]).date().isoformat() == "2026-12-25"], rows


def test_a_database_job_whose_calendar_grows_over_an_earlier_slots_moved_run_moves_it_again(procedures):
    """The same from T-SQL: add_calendar redefines the calendar a job names, now excluding tomorrow
    too; the run moved to tomorrow's midnight moves to the day after."""
    agent, connection = procedures
    _not_at_midnight()
    now = datetime.now(UTC)
    when = now.replace(microsecond=0) + lead(agent)
    today, tomorrow = now.date(), now.date() + timedelta(days=1)
    call(connection, "add_calendar", name="freeze", dates=str(today))
    call(connection, "add_scheduled_job", name="d", sql="SELECT 1",
         schedule=f"{when.second} {when.minute} {when.hour} * * *")
    call(connection, "set_job_calendars", job_name="d", exclude_calendars="freeze", on_excluded="next")
    agent.tick()
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 1)
    agent.tick()
    midnight = datetime.combine(tomorrow, datetime.min.time(), UTC)
    assert midnight in slots_of(live(history(agent, "d")))
    call(connection, "add_calendar", name="freeze", dates=f"{today}..{tomorrow}")
    agent.tick()
    agent.tick()
    rows = history(agent, "d")
    assert midnight not in slots_of(live(rows)), rows
    assert datetime.combine(tomorrow + timedelta(days=1), datetime.min.time(), UTC) in slots_of(live(rows)), rows


def test_a_freeze_cut_short_runs_the_slot_it_had_moved_past_the_next_slot(db_url):
    """From the third attack: a freeze on the 24th and 25th moves the 24th's slot to the 26th
    00:00, past the 25th's own slot. The freeze is cut to the 25th alone: the 24th's slot, now
    allowed, runs (from the moment of the change), and the 25th's still moves to the 26th."""
    job = {"d": {"SCHEDULE": "0 0 2 * * *", "COMMAND": "SELECT 1", "EXCLUDE": "freeze", "ON_EXCLUDED": "next"}}
    make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-24..2026-12-25").tick(at("2026-12-24T01:59:30"))
    agent = make_agent(db_url, job, CALENDAR__freeze__DATES="2026-12-25")
    for moment in ("2026-12-24T10:00:00", "2026-12-24T10:00:30", "2026-12-25T01:59:30", "2026-12-25T23:59:30"):
        agent.tick(at(moment))
    assert slots_of(live(history(agent, "d"))) == [at("2026-12-24T10:00:00"), at("2026-12-26T00:00:00")]


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00", "0999-06-01T00:00:00"])
def test_a_one_time_job_before_year_1000_stops_no_other_job(db_url, moment):
    """An attack on SQLite: the store wrote year 999 as '999-06-01 ...' (strftime's %Y), which no
    reader takes back: every tick's claim failed, and `jobs` with it, for every job."""
    from shared.engine.views import jobs_view

    agent = make_agent(db_url, {"good": {"SCHEDULE": "0 */5 * * * *", "COMMAND": "SELECT 1"},
                                "old": {"SCHEDULE": f"@once {moment}", "COMMAND": "SELECT 1"}})
    try:
        claimed = 0
        for moment_now in ("2026-12-04T10:00:00", "2026-12-04T10:04:30", "2026-12-04T10:09:30"):
            report = agent.tick(at(moment_now))
            assert not report.errors, report.errors
            claimed += report.summary()["runs_claimed"]
        assert claimed >= 2
        rows = {row["job_name"]: row for row in jobs_view(agent.store(), at("2026-12-04T10:09:30"))}
        assert set(rows) >= {"good", "old"}
    finally:
        agent.close()
