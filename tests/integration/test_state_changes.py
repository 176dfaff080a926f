"""Slots after a change of a job's state (issue 34, items 4 to 6 follow-up; attack class 4).

A change of a job's definition (disabled, removed, redefined, its schedule changed) records the
slots it had claimed ahead skipped, and the runs table's unique (job, slot) key let no later claim
take a skipped slot: a job disabled and enabled again at once, removed and added back, or given a
schedule with slots at the same instants, lost every slot up to the next tick's horizon. Each test
makes one change (or two in a row, or the same one twice) and checks the state after it: the
slots the job now runs are pending at their time (and run then), the slots of a disabled stretch
stay skipped; in the settings (SQLite, PostgreSQL), through the T-SQL procedures (PostgreSQL;
SQL Server or Babelfish when AGENT_TEST_MSSQL is set), and measured on the database's clock with
the local runner. Also: a changed COMMAND reaches the slots claimed ahead, a sync that changes
nothing of a job leaves its row alone (its updated_at keys the follow-up refusals' "said once"),
and a definition committed while a claim is in flight waits for it.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine.views import history_view
from shared.jobs.chains import MAX_CHAIN_JOBS
from tests.support.harness import MSSQL_BASE, Clock, at, make_agent, query, runs_table, work
from tests.support.tsql_caller import call, connect, select

UTC = timezone.utc
EVERY_5_SECONDS = "*/5 * * * * *"
FIVE = {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1"}
NOTE_DISABLED = "skipped: the job was disabled after this slot was claimed"
NOTE_REMOVED = "skipped: the job was removed from the settings after this slot was claimed"
NOTE_RESCHEDULED = "skipped: the job's schedule or time zone changed after this slot was claimed"
TSQL_DIALECTS = ["postgres"] + (["mssql"] if MSSQL_BASE else [])


def decided(agent, job: str, since: datetime) -> dict[datetime, tuple]:
    """Each slot of the job from ``since`` on: (status, note)."""
    rows = history_view(agent.store(), job, 1000)["runs"]
    return {row["scheduled_for"]: (row["status"], row["note"]) for row in sorted(rows, key=lambda r: r["scheduled_for"])
            if row["scheduled_for"] >= since}


def slots_every(seconds: int, first: datetime, last: datetime) -> list[datetime]:
    slots, slot = [], first
    while slot <= last:
        slots.append(slot)
        slot += timedelta(seconds=seconds)
    return slots


def run_at(agent, clock: Clock, moment: datetime) -> None:
    clock.now = moment
    work(agent)


# ---------------------------------------------------------------- the settings (SQLite, PostgreSQL)


@pytest.mark.parametrize("disabled_for", [0.5, 11])
def test_a_job_disabled_and_enabled_again_in_the_settings_runs_every_slot_after_the_enable(agent_factory,
                                                                                         disabled_for):
    """ENABLED=false then true: the slots after the enable are pending at their time, none lost;
    those of the disabled stretch stay skipped and do not run."""
    clock = Clock(at("2026-11-25T08:00:00"))
    first = agent_factory({"five": FIVE}, clock=clock)
    first.tick()                                          # claims every slot up to 08:01:30
    clock.advance(1)
    disabled = agent_factory({"five": {**FIVE, "ENABLED": "false"}}, clock=clock)
    assert disabled.tick().synced
    ahead = decided(disabled, "five", clock.now)
    assert len(ahead) >= 17 and set(ahead.values()) == {("skipped", NOTE_DISABLED)}
    if disabled_for > 5:
        run_at(disabled, clock, at("2026-11-25T08:00:05"))  # inside the disabled stretch: nothing runs
    clock.now = at("2026-11-25T08:00:01") + timedelta(seconds=disabled_for)
    enabled = agent_factory({"five": FIVE}, clock=clock)
    report = enabled.tick()
    assert report.synced and not report.errors, report.errors
    enabled_at = clock.now
    after = decided(enabled, "five", enabled_at)
    assert list(after) == slots_every(5, min(after), max(after)) and len(after) >= 15
    assert set(after.values()) == {("pending", None)}, after
    inside = decided(enabled, "five", at("2026-11-25T08:00:01"))
    assert {value for slot, value in inside.items() if slot < enabled_at} == (
        {("skipped", NOTE_DISABLED)} if disabled_for > 5 else set())
    for moment in (min(after), min(after) + timedelta(seconds=5)):
        run_at(enabled, clock, moment)
        assert decided(enabled, "five", moment)[moment] == ("succeeded", None), moment
    statuses = [status for status, _ in decided(enabled, "five", at("2026-11-25T08:00:00")).values()]
    assert statuses.count("succeeded") == 2


def test_a_job_removed_and_added_back_in_the_settings_runs_every_slot_after_it_came_back(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent_factory({"five": FIVE}, clock=clock).tick()
    clock.advance(1)
    assert agent_factory({"other": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}}, clock=clock).tick().synced
    gone = decided(agent_factory(clock=clock), "five", clock.now)
    assert gone and set(gone.values()) == {("skipped", NOTE_REMOVED)}
    clock.advance(0.5)
    back = agent_factory({"five": FIVE}, clock=clock)
    assert back.tick().synced
    after = decided(back, "five", clock.now)
    assert after.keys() == gone.keys() | after.keys() and set(after.values()) == {("pending", None)}, after
    run_at(back, clock, at("2026-11-25T08:00:05"))
    assert decided(back, "five", clock.now)[clock.now] == ("succeeded", None)


def test_a_new_schedule_whose_slots_fall_on_the_old_ones_runs_them(agent_factory):
    """*/5 to */10: the slots at :x0 are the new schedule's too (pending, the same run id, no
    note), those at :x5 stay skipped; and back to */5 at once: every slot is the job's again."""
    clock = Clock(at("2026-11-25T08:00:00"))
    five = agent_factory({"five": FIVE}, clock=clock)
    five.tick()
    ids_before = dict(query(five, f"SELECT scheduled_for, run_id FROM {runs_table(five)}"))
    clock.advance(1)
    ten = agent_factory({"five": {**FIVE, "SCHEDULE": "*/10 * * * * *"}}, clock=clock)
    assert ten.tick().synced
    after = decided(ten, "five", clock.now)
    assert {slot.second % 10 for slot, value in after.items() if value == ("pending", None)} == {0}
    assert {value for slot, value in after.items() if slot.second % 10 == 5} == {("skipped", NOTE_RESCHEDULED)}
    assert all(value == ("pending", None) for slot, value in after.items() if slot.second % 10 == 0)
    ids_after = dict(query(ten, f"SELECT scheduled_for, run_id FROM {runs_table(ten)}"))
    assert all(ids_after[slot] == ids_before[slot] for slot in ids_before), "claimed again in place"
    run_at(ten, clock, at("2026-11-25T08:00:10"))
    assert decided(ten, "five", clock.now)[clock.now] == ("succeeded", None)
    clock.advance(0.5)
    back = agent_factory({"five": FIVE}, clock=clock)
    assert back.tick().synced
    again = decided(back, "five", clock.now)
    assert len(again) >= 16 and set(again.values()) == {("pending", None)}, again
    run_at(back, clock, at("2026-11-25T08:00:15"))
    assert decided(back, "five", clock.now)[clock.now] == ("succeeded", None)


def test_a_time_zone_change_keeps_the_slots_of_a_schedule_that_falls_on_the_same_instants(agent_factory):
    """Every 5 s in UTC and every 5 s in Europe/Paris are the same instants: the new definition
    claims them all again."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent_factory({"five": FIVE}, clock=clock).tick()
    clock.advance(1)
    moved = agent_factory({"five": {**FIVE, "TIMEZONE": "Europe/Paris"}}, clock=clock)
    assert moved.tick().synced
    after = decided(moved, "five", clock.now)
    assert len(after) >= 15 and set(after.values()) == {("pending", None)}, after


def test_a_job_made_invalid_and_valid_again_in_the_settings_runs_every_slot_after_the_fix(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent_factory({"five": FIVE}, clock=clock).tick()
    clock.advance(1)
    broken = agent_factory({"five": {**FIVE, "TIMEZONE": "Mars/Olympus"}}, clock=clock)
    assert broken.tick().synced
    invalid = decided(broken, "five", clock.now)
    assert invalid and {status for status, _ in invalid.values()} == {"skipped"}
    clock.advance(1)
    fixed = agent_factory({"five": FIVE}, clock=clock)
    assert fixed.tick().synced
    after = decided(fixed, "five", clock.now)
    assert len(after) >= 15 and set(after.values()) == {("pending", None)}, after
    run_at(fixed, clock, at("2026-11-25T08:00:05"))
    assert decided(fixed, "five", clock.now)[clock.now] == ("succeeded", None)


@pytest.mark.parametrize("misfire", ["run-once", "skip"])
def test_a_one_time_job_disabled_and_enabled_again_before_its_time_runs_at_its_time(agent_factory, misfire):
    """@once: its one slot, claimed ahead, skipped by the disable, is its slot again."""
    clock = Clock(at("2026-11-25T08:00:00"))
    once = {"SCHEDULE": "@once 2026-11-25T08:00:40", "COMMAND": "SELECT 1", "MISFIRE": misfire}
    agent_factory({"once": once}, clock=clock).tick()
    clock.advance(10)
    agent_factory({"once": {**once, "ENABLED": "false"}}, clock=clock).tick()
    assert set(decided(agent_factory(clock=clock), "once", clock.now).values()) == {("skipped", NOTE_DISABLED)}
    clock.advance(10)
    back = agent_factory({"once": once}, clock=clock)
    back.tick()
    run_at(back, clock, at("2026-11-25T08:00:40"))
    assert decided(back, "once", at("2026-11-25T08:00:00")) == {at("2026-11-25T08:00:40"): ("succeeded", None)}


@pytest.mark.parametrize("misfire", ["run-once", "skip"])
def test_a_one_time_job_enabled_again_after_its_time_is_decided_by_its_misfire_policy(agent_factory, misfire):
    """As a one-time job added after its moment: run-once catches it up (within GRACE_SECONDS),
    skip records it skipped as a misfire; never left skipped as 'disabled' for a job now enabled."""
    from shared.engine.scheduler import NOTE_CATCH_UP, NOTE_MISFIRE_SKIP

    clock = Clock(at("2026-11-25T08:00:00"))
    once = {"SCHEDULE": "@once 2026-11-25T08:00:40", "COMMAND": "SELECT 1", "MISFIRE": misfire}
    agent_factory({"once": once}, clock=clock).tick()
    clock.advance(10)
    agent_factory({"once": {**once, "ENABLED": "false"}}, clock=clock).tick()
    clock.now = at("2026-11-25T08:05:00")
    back = agent_factory({"once": once}, clock=clock)
    back.tick()
    slot = at("2026-11-25T08:00:40")
    expected = ("pending", NOTE_CATCH_UP) if misfire == "run-once" else ("skipped", NOTE_MISFIRE_SKIP)
    assert decided(back, "once", slot) == {slot: expected}
    work(back)
    assert decided(back, "once", slot)[slot][0] == ("succeeded" if misfire == "run-once" else "skipped")


def test_disabled_twice_and_enabled_twice_in_the_settings(agent_factory):
    """The same change twice (each sync forced by another setting): the second disable skips
    nothing more and the second enable claims nothing twice; each slot after the enable runs once."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent_factory({"five": FIVE}, clock=clock).tick()
    clock.advance(1)
    off = {"five": {**FIVE, "ENABLED": "false"}}
    agent_factory(off, clock=clock).tick()
    clock.advance(1)
    again = agent_factory({**off, "other": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}}, clock=clock)
    assert again.tick().synced
    skipped = decided(again, "five", at("2026-11-25T08:00:00"))
    assert skipped and set(skipped.values()) == {("skipped", NOTE_DISABLED)}
    clock.advance(1)
    agent_factory({"five": FIVE}, clock=clock).tick()
    clock.advance(0.5)
    twice = agent_factory({"five": FIVE, "other": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 2"}}, clock=clock)
    assert twice.tick().synced
    after = decided(twice, "five", clock.now)
    assert len(after) >= 16 and set(after.values()) == {("pending", None)}
    for second in (5, 10, 15):
        run_at(twice, clock, at(f"2026-11-25T08:00:{second:02d}"))
    runs = query(twice, f"SELECT scheduled_for, status FROM {runs_table(twice)} WHERE job_name = 'five' "
                        "AND status = 'succeeded' ORDER BY scheduled_for")
    assert len(runs) == 3


def test_a_job_disabled_while_paused_and_enabled_again_stays_paused_and_comes_back_on_resume(agent_factory):
    from shared.engine.operations import pause_job, resume_job

    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"five": {**FIVE, "MISFIRE": "skip"}}, clock=clock)
    agent.tick()
    clock.advance(1)
    pause_job(agent.store(), "five", now=clock.now)
    agent_factory({"five": {**FIVE, "MISFIRE": "skip", "ENABLED": "false"}}, clock=clock).tick()
    clock.advance(1)
    enabled = agent_factory({"five": {**FIVE, "MISFIRE": "skip"}}, clock=clock)
    enabled.tick()
    held = decided(enabled, "five", clock.now)
    assert held and set(held.values()) == {("skipped", "paused")}, held
    clock.advance(1)
    resumed = resume_job(enabled.store(), "five", now=clock.now)
    assert resumed.runs_resumed == len(decided(enabled, "five", clock.now))
    assert set(decided(enabled, "five", clock.now).values()) == {("pending", None)}
    run_at(enabled, clock, at("2026-11-25T08:00:05"))
    assert decided(enabled, "five", clock.now)[clock.now] == ("succeeded", None)


def test_a_changed_command_reaches_the_slots_claimed_ahead(agent_factory):
    """A run claimed ahead carried the command of the moment it was claimed: a changed COMMAND
    (the schedule unchanged) ran the old one for up to a tick and a half."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent_factory({"five": {**FIVE, "OVERLAP": "skip", "MAX_ATTEMPTS": "1"}}, clock=clock).tick()
    clock.advance(1)
    changed = agent_factory({"five": {**FIVE, "COMMAND": "SELECT 2", "OVERLAP": "queue", "MAX_ATTEMPTS": "4"}},
                            clock=clock)
    assert changed.tick().synced
    rows = query(changed, f"SELECT DISTINCT command, overlap, max_attempts, status FROM {runs_table(changed)} "
                          "WHERE job_name = 'five'")
    assert rows == [("SELECT 2", "queue", 4, "pending")], rows


def test_a_sync_that_changes_nothing_of_a_job_leaves_its_row_alone(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    jobs = {"a": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}, "b": {"COMMAND": "SELECT 2", "AFTER": "a"}}
    reader = agent_factory(jobs, clock=clock)
    reader.tick()
    table = "agent_jobs" if reader.target.dialect == "sqlite" else "agent.jobs"

    def updated() -> dict[str, object]:
        return dict(query(reader, f"SELECT job_name, updated_at FROM {table}"))

    before = updated()
    clock.advance(60)
    assert agent_factory({**jobs, "c": {"COMMAND": "SELECT 3"}}, clock=clock).tick().synced
    after = updated()
    assert {name: after[name] for name in before} == before and "c" in after
    clock.advance(60)
    assert agent_factory({**jobs, "b": {"COMMAND": "SELECT 4", "AFTER": "a"}}, clock=clock).tick().synced
    last = updated()
    assert last["a"] == before["a"] and last["b"] != before["b"]


def test_a_follow_up_refusal_is_told_once_however_many_syncs_come_between(db_url):
    """A chain longer than the bound is refused at the same job each time it comes back; a sync
    of the settings meanwhile (another job added) must not make the job events say it again."""
    count = MAX_CHAIN_JOBS + 1
    jobs = {f"j{n:03d}": {"COMMAND": "SELECT 1", **({"AFTER": f"j{n - 1:03d}"} if n else {})} for n in range(count)}
    agent = make_agent(db_url, jobs)
    agent.tick()
    table = "agent_job_events" if agent.target.dialect == "sqlite" else "agent.job_events"
    for round_ in range(2):
        if round_:
            synced = make_agent(db_url, {**jobs, "other": {"COMMAND": "SELECT 2"}})
            assert synced.tick().synced
        agent.request_run_now("j000")
        work(agent, max_seconds=120)
    refused = query(agent, f"SELECT job_name FROM {runs_table(agent)} WHERE note LIKE 'chain:%'")
    assert refused == [(f"j{MAX_CHAIN_JOBS:03d}",)] * 2
    events = query(agent, f"SELECT job_name, detail FROM {table} WHERE kind = 'follow_up_refused'")
    assert len(events) == 1, events


# ---------------------------------------------------------------- the T-SQL procedures


def _tsql_rows(connection, job: str) -> list[dict]:
    return select(connection, f"SELECT run_id, scheduled_for, status, note FROM agent.runs WHERE job_name = '{job}' "
                              "AND kind = 'scheduled' ORDER BY scheduled_for")


def _ahead(connection, job: str, now: datetime) -> dict[datetime, tuple]:
    return {r["scheduled_for"].replace(tzinfo=UTC): (r["status"], r["note"]) for r in _tsql_rows(connection, job)
            if r["scheduled_for"].replace(tzinfo=UTC) > now}


def _server_now(connection) -> datetime:
    (row,) = select(connection, "SELECT CAST(SYSUTCDATETIME() AS DATETIME2(6)) AS now" if _is_mssql(connection)
                    else "SELECT CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamp) AS now")
    return row["now"].replace(tzinfo=UTC)


def _is_mssql(connection) -> bool:
    from tests.support.tsql_caller import dialect_of

    return dialect_of(connection) == "mssql"


@pytest.mark.parametrize("dialect", TSQL_DIALECTS)
def test_tsql_disable_and_enable_at_once_gives_back_every_slot_claimed_ahead(dialect):
    """agent.enable_job @enabled = 0 then 1: the slots the disable recorded skipped that have not
    come are the job's again at once, pending at their time (resumed_runs), with no tick; both
    changes are job events; the same call twice changes nothing."""
    from tests.support.harness import fresh_database

    with fresh_database(dialect) as url:
        agent = make_agent(url, simulated_time=False)
        connection = connect(url)
        try:
            call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS)
            agent.tick()
            (off,) = call(connection, "enable_job", name="five", enabled=0)
            assert off["skipped_runs"] >= 5 and off["resumed_runs"] == 0
            assert call(connection, "enable_job", name="five", enabled=0)[0] == {
                "job_name": "five", "skipped_runs": 0, "resumed_runs": 0}
            (on,) = call(connection, "enable_job", name="five", enabled=1)
            now = _server_now(connection)
            ahead = _ahead(connection, "five", now)
            assert set(ahead.values()) == {("pending", None)}, ahead
            assert on["resumed_runs"] == len(ahead) >= off["skipped_runs"] - 1
            assert call(connection, "enable_job", name="five", enabled=1)[0]["resumed_runs"] == 0
            agent.poll()                                   # plans it: claims after the slots given back
            assert set(_ahead(connection, "five", now).values()) == {("pending", None)}
            kinds = [r["kind"] for r in select(connection, "SELECT kind FROM agent.job_events WHERE job_name = 'five' "
                                                           "ORDER BY event_id")]
            assert kinds == ["disabled", "enabled"]
        finally:
            connection.close()
            agent.close()


@pytest.mark.parametrize("dialect", TSQL_DIALECTS)
def test_tsql_a_paused_job_disabled_and_enabled_stays_paused_until_resumed(dialect):
    from tests.support.harness import fresh_database

    with fresh_database(dialect) as url:
        agent = make_agent(url, simulated_time=False)
        connection = connect(url)
        try:
            call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS,
                 misfire="skip")
            agent.tick()
            call(connection, "pause_job", job_name="five")
            call(connection, "enable_job", name="five", enabled=0)
            (on,) = call(connection, "enable_job", name="five", enabled=1)
            now = _server_now(connection)
            assert on["resumed_runs"] == 0
            assert set(_ahead(connection, "five", now).values()) == {("skipped", "paused")}
            call(connection, "resume_job", job_name="five")
            now = _server_now(connection)
            ahead = _ahead(connection, "five", now)
            assert ahead and set(ahead.values()) == {("pending", None)}, ahead
        finally:
            connection.close()
            agent.close()


@pytest.mark.parametrize("dialect", TSQL_DIALECTS)
def test_tsql_removed_and_added_back_or_redefined_on_coinciding_slots_claims_them_again(dialect):
    """agent.remove_scheduled_job then add_scheduled_job, and a redefinition to */10: the engine
    plans the new definition (a poll) and claims again, in place, the skipped slots it runs."""
    from tests.support.harness import fresh_database

    with fresh_database(dialect) as url:
        agent = make_agent(url, simulated_time=False)
        connection = connect(url)
        try:
            call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS)
            agent.tick()
            ids = {r["scheduled_for"]: r["run_id"] for r in _tsql_rows(connection, "five")}
            call(connection, "remove_scheduled_job", name="five")
            call(connection, "add_scheduled_job", name="five", sql="SELECT 2", schedule=EVERY_5_SECONDS)
            now = _server_now(connection)
            agent.poll()
            ahead = _ahead(connection, "five", now)
            assert len(ahead) >= 5 and set(ahead.values()) == {("pending", None)}, ahead
            rows = {r["scheduled_for"]: r["run_id"] for r in _tsql_rows(connection, "five")}
            assert all(rows[slot] == ids[slot] for slot in ids if slot.replace(tzinfo=UTC) > now)
            commands = select(connection, "SELECT DISTINCT command FROM agent.runs WHERE job_name = 'five' "
                                          "AND status = 'pending'")
            assert [r["command"] for r in commands] == ["SELECT 2"]
            call(connection, "add_scheduled_job", name="five", sql="SELECT 2", schedule="*/10 * * * * *")
            now = _server_now(connection)
            agent.poll()
            ahead = _ahead(connection, "five", now)
            assert {slot.second % 10 for slot, value in ahead.items() if value == ("pending", None)} == {0}, ahead
            assert all(value == ("pending", None) for slot, value in ahead.items() if slot.second % 10 == 0)
            assert {value[0] for slot, value in ahead.items() if slot.second % 10 == 5} == {"skipped"}
        finally:
            connection.close()
            agent.close()


def test_a_definition_committed_while_a_claim_is_in_flight_waits_for_it(pg_url):
    """A claim computes its slots from the definitions it read (select_due_jobs) and writes them
    later (claim_slots): a redefinition committed in between made the claim write the old
    schedule's slots, pending, after the redefinition had skipped the old ones. The claim holds
    the job-definitions lock shared to its commit: the redefinition waits, then skips them."""
    from shared.engine.scheduler import Scheduler, TickReport

    agent = make_agent(pg_url, simulated_time=False)
    connection = connect(pg_url)
    tick_store = agent.new_store()
    try:
        call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS)
        agent.poll()                                        # planned: its first slots claimed
        claim_now = agent.clock() + timedelta(seconds=100)  # slots to claim beyond the first claim's
        reached, release = threading.Event(), threading.Event()
        original = tick_store.execute

        def execute(name, **params):
            result = original(name, **params)
            if name == "select_due_jobs":
                reached.set()
                release.wait(20)
            return result

        tick_store.execute = execute
        outcome: dict = {}

        def claim() -> None:
            report = TickReport(now=claim_now)
            Scheduler(tick_store, None, agent.settings, agent.telemetry).claim_slots(claim_now, report)
            outcome["claimed"] = report.claimed

        def redefine() -> None:
            other = connect(pg_url)
            try:
                call(other, "add_scheduled_job", name="five", sql="SELECT 1", schedule="0 0 3 * * *")
            finally:
                other.close()

        claimer = threading.Thread(target=claim)
        claimer.start()
        assert reached.wait(20)
        redefiner = threading.Thread(target=redefine)
        redefiner.start()
        redefiner.join(1.0)
        assert redefiner.is_alive(), "the redefinition did not wait for the claim in flight"
        release.set()
        claimer.join(30)
        redefiner.join(30)
        assert len(outcome["claimed"]) >= 10, "the claim had the old schedule's slots to claim"
        pending = select(connection, "SELECT scheduled_for FROM agent.runs WHERE job_name = 'five' "
                                     "AND status IN ('pending', 'queued')")
        assert pending == [], pending
    finally:
        release.set()
        tick_store.close()
        connection.close()
        agent.close()


# ---------------------------------------------------------------- on time, on the database's clock


def _started_late_by(agent, job: str, after: datetime) -> list[float]:
    rows = query(agent, f"SELECT scheduled_for, started_at FROM {runs_table(agent)} WHERE job_name = '{job}' "
                        f"AND status = 'succeeded' AND scheduled_for > '{after.replace(tzinfo=None).isoformat(sep=' ')}' "
                        "ORDER BY scheduled_for")
    return [(started - slot).total_seconds() for slot, started in rows]


def _ran_between(agent, job: str, start: datetime, end: datetime) -> list[tuple]:
    return query(agent, f"SELECT scheduled_for, status FROM {runs_table(agent)} WHERE job_name = '{job}' "
                        f"AND scheduled_for > '{start.replace(tzinfo=None).isoformat(sep=' ')}' "
                        f"AND scheduled_for < '{end.replace(tzinfo=None).isoformat(sep=' ')}' "
                        "AND status NOT IN ('skipped')")


@pytest.mark.parametrize("how", ["settings", "tsql", "tsql-readded"])
@pytest.mark.parametrize("disabled_for", [0, 6])
def test_a_job_every_5_seconds_disabled_and_enabled_again_runs_its_next_slots_on_time(pg_url, how, disabled_for):
    """Measured with the local runner on the database's clock: the job disabled and enabled again
    (in the settings, by agent.enable_job, or removed and added back by the procedures), at once
    or after 6 s; every slot after the enable starts within a couple of seconds of its time
    (generous for CI load), no slot of the disabled stretch runs. AGENT_POLL_SECONDS=1 bounds what
    the docs bound by it: the planning of a definition added back, and how long an idle worker
    sleeps before it looks again (a change made by another process)."""
    from shared.engine.runner import LocalRunner

    jobs = {"five": {**FIVE, "MISFIRE": "skip"}} if how == "settings" else {}
    # The runner ticks at its start only (hourly, claiming an hour ahead): a tick of its own in the
    # disabled stretch would sync its settings (the job enabled) before the test enables it.
    agent = make_agent(pg_url, jobs, simulated_time=False, AGENT_POLL_SECONDS="1", AGENT_TICK_SCHEDULE="0 0 * * * *")
    connection = connect(pg_url)
    if how != "settings":
        call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS, misfire="skip")
    runner = LocalRunner(agent, concurrency=2)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not _started_late_by(agent, "five", datetime(2000, 1, 1, tzinfo=UTC)) and time.monotonic() < deadline:
            time.sleep(0.2)
        disabled_at = agent.clock()
        if how == "settings":
            assert make_agent(pg_url, {"five": {**FIVE, "MISFIRE": "skip", "ENABLED": "false"}},
                              simulated_time=False).tick().synced
        elif how == "tsql":
            call(connection, "enable_job", name="five", enabled=0)
        else:
            call(connection, "remove_scheduled_job", name="five")
        time.sleep(disabled_for)
        enabled_at = agent.clock()
        if how == "settings":
            assert make_agent(pg_url, {"five": {**FIVE, "MISFIRE": "skip"}}, simulated_time=False).tick().synced
        elif how == "tsql":
            call(connection, "enable_job", name="five", enabled=1)
        else:
            call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS,
                 misfire="skip")
        time.sleep(12)
    finally:
        runner.stop()
        thread.join(30)
        connection.close()
    late = _started_late_by(agent, "five", enabled_at)
    assert len(late) >= 2, late                            # every slot after the enable ran
    assert max(late) < 2.5, late
    assert _ran_between(agent, "five", disabled_at + timedelta(seconds=0.5), enabled_at) == []
