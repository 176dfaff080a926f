"""Pause and resume (issue 27, item 2): a paused job claims no slot and each slot that comes is
recorded skipped "paused"; its runs in flight finish; --until ends the pause by itself; on resume
the misfire policy decides the slots missed; a settings sync keeps the pause; `pause`/`resume`
from the command line (text and --json), agent.pause_job / agent.resume_job for the operator
role on PostgreSQL; the views and the monitor show it; and a pause racing ticks in several
processes never leaves a slot inside the pause claimed once pause_job returned."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import re
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from shared.cli.commands import main as cli
from shared.engine.operations import pause_job, resume_job
from shared.engine.scheduler import NOTE_CATCH_UP, NOTE_MISFIRE_GRACE, NOTE_MISFIRE_SKIP, NOTE_PAUSED
from shared.engine.views import history_view, jobs_view
from shared.errors import NotFoundError, UsageError
from shared.web.app import Monitor, MonitorSettings
from tests.support.harness import (
    MSSQL_BASE,
    Clock,
    at,
    grant_operator_args,
    make_agent,
    pg_admin_connection,
    query,
    runs_table,
    url_as,
    work,
)
from tests.support.tsql_caller import CallError, call, select

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
EVERY_MINUTE = "0 * * * * *"
HOURLY = "0 0 * * * *"


def runs_of(agent, job: str) -> dict[datetime, dict]:
    """The job's runs by slot (history_view: the rows `history --json` shows)."""
    rows = history_view(agent.store(), job, 1000)["runs"]
    return {row["scheduled_for"]: row for row in rows}


def job_row(agent, job: str, now: datetime) -> dict:
    return next(row for row in jobs_view(agent.store(), now) if row["job_name"] == job)


def minutes(start: str, count: int) -> list[datetime]:
    return [at(start) + MINUTE * i for i in range(count)]


# ---------------------------------------------------------------- scheduling


def test_a_paused_job_claims_no_slot_and_each_slot_is_recorded_skipped_paused(agent_factory):
    clock = Clock(at("2026-11-25T07:59:40"))
    # "other" shares the paused job's schedule and next slot: advance_jobs moves the two apart.
    agent = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1", "MISFIRE": "skip"},
                           "other": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock)
    agent.tick()                            # claims 08:00:00
    clock.now = at("2026-11-25T08:00:40")
    agent.tick()                            # claims 08:01:00
    clock.advance(10)
    ahead = [slot for slot, run in runs_of(agent, "often").items() if slot >= clock.now and run["status"] == "pending"]
    assert ahead, "the first tick claimed slots ahead of the pause"
    pause = pause_job(agent.store(), "often", now=clock.now, paused_by="tester", reason="maintenance")
    assert (pause.paused_at, pause.paused_until, pause.runs_skipped) == (clock.now, None, len(ahead))
    paused_at = clock.now
    # The slot that came before the pause is in flight: it runs.
    work(agent)
    assert runs_of(agent, "often")[at("2026-11-25T08:00:00")]["status"] == "succeeded"
    for _ in range(5):
        clock.now = clock.now.replace(second=0) + MINUTE
        report = agent.tick()
        assert not report.errors, report.errors
    often = runs_of(agent, "often")
    inside = sorted(slot for slot in often if slot >= paused_at)
    # Every slot of the pause shows, once, skipped "paused": the gap is in the history (and the
    # slots up to the last tick's horizon are recorded so ahead, as pause_job records those
    # claimed before it).
    assert inside[:5] == minutes("2026-11-25T08:01:00", 5) and inside[-1] <= clock.now + MINUTE * 2
    assert {(often[slot]["status"], often[slot]["note"]) for slot in inside} == {("skipped", NOTE_PAUSED)}
    # The other job of the same schedule kept its slots.
    other = runs_of(agent, "other")
    assert all(other[slot]["status"] in ("pending", "succeeded") for slot in minutes("2026-11-25T08:01:00", 5))
    row = job_row(agent, "often", clock.now)
    assert (row["state"], row["paused"], row["paused_at"], row["paused_by"], row["pause_reason"]) == (
        "paused", True, paused_at, "tester", "maintenance")
    events = [e for e in history_view(agent.store(), "often", 50)["job_events"] if e["kind"] == "paused"]
    assert len(events) == 1 and "maintenance" in events[0]["detail"]
    # Resumed: the slots recorded ahead are the job's again, at once (no tick in between).
    clock.advance(30)
    resumed = resume_job(agent.store(), "often", now=clock.now, resumed_by="tester")
    assert resumed.paused_at == paused_at
    ahead = sorted(slot for slot in runs_of(agent, "often") if slot >= clock.now)
    assert ahead and resumed.runs_resumed == len(ahead)
    assert {(runs_of(agent, "often")[slot]["status"], runs_of(agent, "often")[slot]["note"]) for slot in ahead} == {
        ("pending", None)}
    clock.advance(30)
    agent.tick()
    assert runs_of(agent, "often")[at("2026-11-25T08:06:00")]["status"] == "pending"
    assert job_row(agent, "often", clock.now)["state"] == "enabled"


def test_on_resume_the_misfire_policy_decides_the_slots_the_pause_missed(agent_factory):
    clock = Clock(at("2026-11-25T08:30:00"))
    agent = agent_factory({"catch_up": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1"},            # run-once
                           "short_grace": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "GRACE_SECONDS": "600"},
                           "skipper": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock)
    agent.tick()
    names = ("catch_up", "short_grace", "skipper")
    for name in names:
        pause_job(agent.store(), name, now=clock.now)
    for _ in range(3):
        clock.advance(3600)
        agent.tick()
    # 09:00, 10:00 and 11:00 are recorded "paused", whatever the policy: the pause's end is not
    # known yet.
    for name in names:
        runs = runs_of(agent, name)
        for slot in (at("2026-11-25T09:00:00"), at("2026-11-25T10:00:00"), at("2026-11-25T11:00:00")):
            assert (runs[slot]["status"], runs[slot]["note"]) == ("skipped", NOTE_PAUSED), (name, slot)
    clock.advance(600)                      # 11:40
    resumed = {name: resume_job(agent.store(), name, now=clock.now) for name in names}
    # Resume decides the last slot it held (11:00) by the misfire policy, at once: run-once
    # catches it up now within GRACE_SECONDS, outside it the slot stays skipped, saying so.
    held = at("2026-11-25T11:00:00")
    caught = runs_of(agent, "catch_up")[held]
    assert (caught["status"], caught["note"], resumed["catch_up"].runs_caught_up) == ("pending", NOTE_CATCH_UP, 1)
    late = runs_of(agent, "short_grace")[held]
    assert (late["status"], late["note"], resumed["short_grace"].runs_caught_up) == ("skipped", NOTE_MISFIRE_GRACE, 0)
    assert [r for r in runs_of(agent, "skipper").values() if r["status"] == "pending"] == []
    work(agent)
    assert runs_of(agent, "catch_up")[held]["status"] == "succeeded"
    clock.advance(60)
    agent.tick()
    assert runs_of(agent, "catch_up")[held]["status"] == "succeeded"
    assert [r for r in runs_of(agent, "skipper").values() if r["status"] not in ("skipped",)] == []


def test_until_ends_the_pause_by_itself_at_the_database_time(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock, AGENT_MISFIRE_THRESHOLD_SECONDS="30")
    agent.tick()
    clock.advance(30)
    until = at("2026-11-25T08:03:30")
    pause = pause_job(agent.store(), "often", now=clock.now, until=until)
    assert pause.paused_until == until
    clock.now = at("2026-11-25T08:01:00")
    agent.tick()
    assert job_row(agent, "often", clock.now)["state"] == "paused"
    # No tick while the pause ends; the first one after it finds the job running again.
    clock.now = at("2026-11-25T08:05:00")
    assert job_row(agent, "often", clock.now)["state"] == "enabled"
    assert job_row(agent, "often", clock.now)["paused_until"] is None
    agent.tick()
    runs = runs_of(agent, "often")
    decided = {slot: (runs[slot]["status"], runs[slot]["note"]) for slot in minutes("2026-11-25T08:01:00", 5)}
    assert decided == {
        at("2026-11-25T08:01:00"): ("skipped", NOTE_PAUSED),
        at("2026-11-25T08:02:00"): ("skipped", NOTE_PAUSED),      # missed inside the pause
        at("2026-11-25T08:03:00"): ("skipped", NOTE_PAUSED),
        at("2026-11-25T08:04:00"): ("skipped", NOTE_MISFIRE_SKIP),  # missed after it: a misfire
        at("2026-11-25T08:05:00"): ("pending", None)}
    # A pause that ended is no pause: resuming it is refused, pausing again starts a new one.
    with pytest.raises(UsageError, match="not paused"):
        resume_job(agent.store(), "often", now=clock.now)
    assert pause_job(agent.store(), "often", now=clock.now).paused_at == clock.now


def test_a_settings_sync_keeps_the_pause(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    first = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock)
    first.tick()
    pause_job(first.store(), "often", now=clock.now, reason="kept")
    # The settings change (a new command, another job): the sync rewrites the job's row.
    second = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 2", "MISFIRE": "skip"},
                            "fresh": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1"}}, clock=clock)
    clock.advance(90)
    report = second.tick()
    assert report.synced and not report.errors
    row = job_row(second, "often", clock.now)
    assert (row["state"], row["pause_reason"]) == ("paused", "kept")
    runs = runs_of(second, "often")
    assert (runs[at("2026-11-25T08:01:00")]["status"], runs[at("2026-11-25T08:01:00")]["note"]) == (
        "skipped", NOTE_PAUSED)
    assert not [r for slot, r in runs.items() if slot > clock.now - MINUTE * 2 and r["status"] == "pending"]


def test_pausing_an_unknown_job_or_until_a_past_time_is_refused_and_changes_nothing(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1"}}, clock=clock)
    agent.tick()
    with pytest.raises(NotFoundError, match="no job named 'ghost'.*often"):
        pause_job(agent.store(), "ghost", now=clock.now)
    with pytest.raises(UsageError, match="expected a time after now") as caught:
        pause_job(agent.store(), "often", now=clock.now, until=clock.now - timedelta(seconds=1))
    assert caught.value.setting == "--until"
    with pytest.raises(UsageError, match="at most 400"):
        pause_job(agent.store(), "often", now=clock.now, reason="x" * 401)
    with pytest.raises(UsageError, match="is not paused"):
        resume_job(agent.store(), "often", now=clock.now)
    with pytest.raises(NotFoundError):
        resume_job(agent.store(), "ghost", now=clock.now)
    table = "agent_job_pauses" if agent.target.dialect == "sqlite" else "agent.job_pauses"
    assert query(agent, f"SELECT COUNT(*) FROM {table}") == [(0,)]
    assert job_row(agent, "often", clock.now)["state"] == "enabled"


# ---------------------------------------------------------------- the command line and the monitor


def test_pause_and_resume_from_the_command_line_and_what_jobs_and_the_monitor_show(agent_factory, db_url, capsys):
    agent = agent_factory({"hello": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}})
    agent.tick()
    capsys.readouterr()
    assert cli(["--db", db_url, "pause", "hello", "--until", "2999-01-01T00:00:00Z", "--reason", "upgrade"]) == 0
    out = capsys.readouterr().out
    assert re.match(r"job hello paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d, until 2999-01-01 00:00:00", out), out
    assert cli(["--db", db_url, "jobs"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("hello "))
    assert "paused until 2999-01-01 00:00:00" in line
    assert cli(["--db", db_url, "jobs", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["paused"], row["pause_reason"]) == ("paused", True, "upgrade")
    assert row["paused_until"].startswith("2999-01-01") and row["paused_by"].endswith("(sql-agent)")
    # The monitor's page and its JSON twin.
    store = agent.new_store()
    try:
        monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: datetime.now(UTC),
                          settings=lambda: MonitorSettings())
        body = monitor.handle("GET", "/", "", "").body.decode()
        html = re.search(r'<tr class="job" id="job-hello">(.*?)</tr>', body, re.S).group(1)
        assert "state-paused" in html and "until 2999-01-01 00:00:00" in html and "upgrade" in html
        assert "none while paused" in html
        (twin,) = json.loads(monitor.handle("GET", "/", "format=json", "").body)
        assert (twin["state"], twin["pause_reason"]) == ("paused", "upgrade")
        page = json.loads(monitor.handle("GET", "/jobs/hello", "format=json", "").body)
        assert page["job"]["paused"] is True
        assert [e["kind"] for e in page["job_events"]].count("paused") == 1
    finally:
        store.close()
    # Started by hand while paused: allowed, as SQL Server Agent starts a disabled job.
    assert cli(["--db", db_url, "run-now", "hello"]) == 0
    assert "of hello created" in capsys.readouterr().out
    assert cli(["--db", db_url, "resume", "hello", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["job_name"], document["paused"]) == ("hello", False)
    assert cli(["--db", db_url, "resume", "hello"]) == 2
    assert capsys.readouterr().err.startswith("error: job 'hello' is not paused")
    assert cli(["--db", db_url, "pause", "ghost", "--json"]) == 2
    error = json.loads(capsys.readouterr().err)
    assert (error["kind"], error["setting"], error["value"]) == ("not_found", "JOB", "ghost")
    assert cli(["--db", db_url, "pause", "hello"]) == 0
    assert "until resumed" in capsys.readouterr().out


# ---------------------------------------------------------------- PostgreSQL: the operator's functions


_roles_to_drop: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def _drop_login_roles():
    yield
    if not _roles_to_drop:
        return
    admin = pg_admin_connection()
    try:
        for role in _roles_to_drop:
            admin.cursor().execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        admin.close()


def test_the_operator_role_pauses_and_resumes_through_the_functions_and_another_role_cannot(pg_url, capsys):
    import pyodbc

    agent = make_agent(pg_url, {"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1", "MISFIRE": "skip"}})
    agent.tick()        # the real clock: the functions read the server's
    operator, outsider = f"op_{uuid.uuid4().hex[:10]}", f"out_{uuid.uuid4().hex[:10]}"
    _roles_to_drop.extend([operator, outsider])
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f'CREATE ROLE "{operator}" LOGIN')
        admin.cursor().execute(f'CREATE ROLE "{outsider}" LOGIN')
    finally:
        admin.close()
    assert cli(grant_operator_args(pg_url, operator)) == 0
    capsys.readouterr()
    as_operator = pyodbc.connect(url_as(pg_url, operator), autocommit=True, timeout=10)
    as_outsider = pyodbc.connect(url_as(pg_url, outsider), autocommit=True, timeout=10)
    try:
        claimed = select(as_operator, "SELECT next_run_at FROM agent.job_activity WHERE job_name = 'often'")
        assert claimed[0]["next_run_at"] is not None
        until = datetime.now(UTC) + timedelta(hours=2)
        (paused,) = call(as_operator, "pause_job", job_name="often", until=until, reason="deploy")
        assert paused["paused_by"] == operator and paused["runs_skipped"] >= 1
        (activity,) = select(as_operator, "SELECT state, paused_until, paused_by, pause_reason FROM agent.job_activity "
                                          "WHERE job_name = 'often'")
        assert (activity["state"], activity["paused_by"], activity["pause_reason"]) == ("paused", operator, "deploy")
        assert abs((activity["paused_until"].replace(tzinfo=UTC) - until).total_seconds()) < 0.01
        pending = query(agent, f"SELECT COUNT(*) FROM {runs_table(agent)} WHERE job_name = 'often' "
                               "AND status IN ('pending', 'queued') AND scheduled_for >= "
                               f"(SELECT paused_at FROM agent.job_pauses WHERE job_name = 'often')")
        assert pending == [(0,)]
        # Refusals: each one line with its SQLSTATE, nothing changed.
        for arguments, code, words in (
                ({"job_name": "ghost"}, "P0002", "no such job"),
                ({"job_name": "often", "until": datetime.now(UTC) - timedelta(minutes=1)}, "22023", "a time after now"),
                ({"job_name": None}, "22023", "expected the name of a job")):
            with pytest.raises(CallError) as caught:
                call(as_operator, "pause_job", **arguments)
            assert caught.value.code == code and words in caught.value.message, caught.value
        with pytest.raises(CallError) as caught:
            call(as_outsider, "pause_job", job_name="often")
        assert caught.value.code == "42501"
        with pytest.raises(CallError) as caught:
            call(as_outsider, "resume_job", job_name="often")
        assert caught.value.code == "42501"
        (resumed,) = call(as_operator, "resume_job", job_name="often")
        assert resumed["paused_at"] is not None and resumed["resumed_at"] >= resumed["paused_at"]
        with pytest.raises(CallError) as caught:
            call(as_operator, "resume_job", job_name="often")
        assert caught.value.code == "55000" and "not paused" in caught.value.message
        (activity,) = select(as_operator, "SELECT state, paused_at FROM agent.job_activity WHERE job_name = 'often'")
        assert activity["state"] != "paused" and activity["paused_at"] is None
        kinds = [e["kind"] for e in history_view(agent.store(), "often", 50)["job_events"]]
        assert sorted(kinds) == ["paused", "resumed"]
        # A job defined from T-SQL is paused the same way.
        call(as_operator, "add_scheduled_job", name="dbjob", sql="SELECT 1", schedule=EVERY_MINUTE)
        agent.tick()
        (paused,) = call(as_operator, "pause_job", job_name="dbjob")
        agent.tick()
        (activity,) = select(as_operator, "SELECT state, defined_in FROM agent.job_activity WHERE job_name = 'dbjob'")
        assert (activity["state"], activity["defined_in"]) == ("paused", "database")
        assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE job_name = 'dbjob' AND status = 'pending' "
                            "AND scheduled_for >= (SELECT paused_at FROM agent.job_pauses WHERE job_name = 'dbjob')"
                     ) == [(0,)]
    finally:
        as_operator.close()
        as_outsider.close()
        agent.close()


# ---------------------------------------------------------------- concurrency (PostgreSQL, processes)


RACE_JOBS = {"fast": {"SCHEDULE": "* * * * * *", "COMMAND": "SELECT 1", "MISFIRE": "skip"}}
RACE_SECONDS = 8.0
RACE_MAX_TICKS = 400


def _tick_until(url: str, stop_at: float, errors) -> None:
    """A process ticking on the database's clock until ``stop_at`` (at most RACE_MAX_TICKS)."""
    agent = make_agent(url, RACE_JOBS, simulated_time=False)
    ticks = 0
    try:
        while time.time() < stop_at and ticks < RACE_MAX_TICKS:
            report = agent.tick()
            errors.put(("tick", report.errors))
            ticks += 1
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        errors.put(("crash", [repr(exc)]))
    finally:
        agent.close()


def _claimed_inside(agent, paused_at: datetime) -> int:
    rows = query(agent, "SELECT COUNT(*) FROM agent.runs WHERE job_name = 'fast' "
                        "AND status IN ('pending', 'queued', 'running') "
                        f"AND scheduled_for >= '{paused_at.replace(tzinfo=None).isoformat(sep=' ')}'")
    return rows[0][0]


def test_a_pause_racing_ticks_in_several_processes_leaves_no_slot_claimed_inside_it(pg_url):
    agent = make_agent(pg_url, RACE_JOBS, simulated_time=False)
    agent.tick()
    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    stop_at = time.time() + RACE_SECONDS
    workers = [context.Process(target=_tick_until, args=(pg_url, stop_at, errors)) for _ in range(3)]
    for worker in workers:
        worker.start()
    checks = []
    try:
        time.sleep(1.5)                          # the processes are ticking
        for cycle in range(3):
            if time.time() > stop_at - 1.5:
                break
            pause = pause_job(agent.store(), "fast", now=agent.clock(), paused_by=f"race {cycle}")
            checks.append(_claimed_inside(agent, pause.paused_at))       # at once
            time.sleep(0.8)                                            # while they tick on
            checks.append(_claimed_inside(agent, pause.paused_at))
            resume_job(agent.store(), "fast", now=agent.clock())
            time.sleep(0.4)
    finally:
        for worker in workers:
            worker.join(timeout=RACE_SECONDS + 60)
    reports = []
    while not errors.empty():
        reports.append(errors.get(timeout=5))
    assert all(worker.exitcode == 0 for worker in workers), [w.exitcode for w in workers]
    assert not [r for r in reports if r[0] == "crash"], reports
    assert not [r for r in reports if r[1]], [r for r in reports if r[1]][:3]
    assert len(reports) >= 6, "the processes ticked"
    assert len(checks) >= 2 and checks == [0] * len(checks), checks
    # The ticks did meet the pauses: slots inside them were recorded skipped "paused".
    paused = query(agent, "SELECT COUNT(*) FROM agent.runs WHERE job_name = 'fast' AND note LIKE 'paused%'")[0][0]
    assert paused > 0


def _held_after(store, query_name: str, reached, release) -> None:
    """Make ``store`` stop, inside its transaction, right after the named query ``query_name``
    ran, until ``release`` is set (at most 20 s): the other side of the race runs meanwhile."""
    original = store.execute

    def execute(name, **params):
        result = original(name, **params)
        if name == query_name:
            reached.set()
            release.wait(20)
        return result

    store.execute = execute


@pytest.mark.parametrize("first", ["tick", "pause"])
def test_a_pause_and_a_claim_in_flight_at_once_never_leave_a_slot_claimed_inside_the_pause(pg_url, first):
    """The two orders of the race, held open on purpose: a claim that has inserted its slots and
    not committed when the pause comes (the pause waits for it, then skips them), and a pause
    not committed when a claim comes (the claim waits, then records the slots 'paused')."""
    import threading

    from shared.engine.scheduler import Scheduler, TickReport

    agent = make_agent(pg_url, RACE_JOBS, simulated_time=False)
    agent.tick()
    claim_now = agent.clock() + timedelta(seconds=120)     # slots to claim beyond the first tick's
    reached, release = threading.Event(), threading.Event()
    tick_store, pause_store = agent.new_store(), agent.new_store()
    outcome: dict = {}

    def claim() -> None:
        scheduler = Scheduler(tick_store, None, agent.settings, agent.telemetry)
        report = TickReport(now=claim_now)
        scheduler.claim_slots(claim_now, report)
        outcome["claimed"] = report.claimed

    def pause() -> None:
        outcome["pause"] = pause_job(pause_store, "fast", now=agent.clock())

    holder, other = (claim, pause) if first == "tick" else (pause, claim)
    _held_after(tick_store if first == "tick" else pause_store,
                "claim_slots" if first == "tick" else "settle_paused_runs", reached, release)
    held = threading.Thread(target=holder)
    held.start()
    try:
        assert reached.wait(20), "the first side reached its hold"
        racer = threading.Thread(target=other)
        racer.start()
        racer.join(1.0)
        # The second side waits for the first one's commit (the pauses lock).
        assert racer.is_alive(), f"the {other.__name__} did not wait for the {holder.__name__} in flight"
    finally:
        release.set()
        held.join(30)
        racer.join(30)
        tick_store.close()
        pause_store.close()
    assert {"claimed", "pause"} <= set(outcome), outcome
    assert len(outcome["claimed"]) >= 30, "the claim had slots to claim inside the pause"
    assert _claimed_inside(agent, outcome["pause"].paused_at) == 0
    notes = {run["note"] for run in outcome["claimed"] if run["scheduled_for"] >= outcome["pause"].paused_at}
    if first == "tick":
        assert outcome["pause"].runs_skipped >= 30        # the claim's slots, skipped by the pause
    else:
        assert notes == {NOTE_PAUSED}                     # the claim recorded them 'paused' itself


def test_pause_and_resume_send_their_telemetry_events_and_no_misfire_event_per_paused_slot(agent_factory):
    from shared.telemetry.client import Telemetry, _dimensions

    class Recorder(Telemetry):
        enabled = True

        def __init__(self) -> None:
            self.events: list[tuple[str, dict]] = []

        def event(self, name, properties=None, *, operation_id=None):
            super().event(name, properties, operation_id=operation_id)     # the name must be registered
            self.events.append((name, _dimensions(properties)))

    clock = Clock(at("2026-11-25T08:00:30"))
    agent = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock)
    recorder = Recorder()
    agent._telemetry = recorder
    agent.tick()
    pause_job(agent.store(), "often", now=clock.now, until=at("2026-11-25T09:00:00"), paused_by="ops",
              reason="patching", telemetry=recorder)
    for _ in range(3):
        clock.advance(60)
        agent.tick()
    resume_job(agent.store(), "often", now=clock.now, resumed_by="ops", telemetry=recorder)
    assert any(name == "RunClaimed" for name, _ in recorder.events), "the ticks report to this recorder"
    named = [(name, dims) for name, dims in recorder.events if name in ("JobPaused", "JobResumed", "MisfireSkipped")]
    assert named[0] == ("JobPaused", {"job": "often", "outcome": "paused", "paused_until": named[0][1]["paused_until"],
                                      "paused_by": "ops", "reason": "patching", "runs_skipped": "1"})
    assert named[0][1]["paused_until"].startswith("2026-11-25T09:00:00")
    assert named[1:] == [("JobResumed", {"job": "often", "outcome": "resumed", "paused_by": "ops"})]
    assert len([r for r in runs_of(agent, "often").values() if r["note"] == NOTE_PAUSED]) >= 3


@pytest.mark.parametrize("misfire", ["skip", "run-once"])
def test_slots_inside_a_pause_that_ended_between_two_ticks_do_not_run(agent_factory, misfire):
    """A job every 10 s paused until 08:03:30, ticks on the minute: the tick of 08:03, whose
    horizon reaches past the end, records the slots up to 08:03:20 "paused" and claims 08:03:30
    on, runnable at their time: the first slot after the pause runs at the end, not at the next
    tick. Under run-once there is no catch-up: a slot falls at the end itself."""
    clock = Clock(at("2026-11-25T08:00:30"))
    agent = agent_factory({"tens": {"SCHEDULE": "*/10 * * * * *", "COMMAND": "SELECT 1", "MISFIRE": misfire}},
                          clock=clock)
    agent.tick()
    pause_job(agent.store(), "tens", now=clock.now, until=at("2026-11-25T08:03:30"))
    for moment in ("08:01:00", "08:02:00", "08:03:00", "08:04:00"):
        clock.now = at(f"2026-11-25T{moment}")
        agent.tick()
    runs = runs_of(agent, "tens")
    for second in ("08:03:10", "08:03:20"):
        assert (runs[at(f"2026-11-25T{second}")]["status"], runs[at(f"2026-11-25T{second}")]["note"]) == (
            "skipped", NOTE_PAUSED), second
    held = runs[at("2026-11-25T08:03:00")]
    assert (held["status"], held["note"]) == ("skipped", NOTE_PAUSED)
    after = [runs[slot]["status"] for slot in runs if slot >= at("2026-11-25T08:03:30")]
    assert after and set(after) == {"pending"}
    inside = [r for slot, r in runs.items() if at("2026-11-25T08:00:30") <= slot < at("2026-11-25T08:03:00")]
    assert inside and {(r["status"], r["note"]) for r in inside} == {("skipped", NOTE_PAUSED)}


def test_with_a_queue_a_slot_already_dispatched_ahead_is_not_run_once_paused(agent_factory):
    """Queue mode: the tick sends the message of a slot within the lookahead at once, delayed to
    its slot. Pausing records that run skipped; when its message comes, it is stale and ignored."""
    from shared.messaging.memory import MemoryQueue

    clock = Clock(at("2026-11-25T08:00:40"))
    queue = MemoryQueue(clock=lambda: clock.now.timestamp())
    agent = agent_factory({"often": {"SCHEDULE": EVERY_MINUTE, "COMMAND": "SELECT 1"}}, clock=clock, queue=queue)
    agent.tick()
    slot = at("2026-11-25T08:01:00")
    assert runs_of(agent, "often")[slot]["status"] == "queued"
    clock.advance(10)
    assert pause_job(agent.store(), "often", now=clock.now).runs_skipped == 1
    clock.now = at("2026-11-25T08:01:05")
    work(agent)
    run = runs_of(agent, "often")[slot]
    assert (run["status"], run["note"], run["attempt"]) == ("skipped", NOTE_PAUSED, 0)
    assert queue.run_messages() == 0


# ---------------------------------------------------------------- issue 34: what a pause decided, decided again

EVERY_5_SECONDS = "*/5 * * * * *"


def decided(agent, job: str, since: datetime) -> dict[datetime, tuple]:
    """Each slot of the job from ``since`` on: (status, note)."""
    return {slot: (run["status"], run["note"]) for slot, run in sorted(runs_of(agent, job).items()) if slot >= since}


def test_pause_then_resume_at_once_loses_no_slot_and_the_next_slot_runs_with_no_tick(agent_factory):
    """Issue 34 item 5: pause recorded every slot claimed ahead skipped, and a skipped slot is
    never claimed again, so the slots after an immediate resume never ran."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"five": {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1"}}, clock=clock)
    agent.tick()                                         # claims every slot up to the next tick (+ margin)
    clock.advance(1)
    pause = pause_job(agent.store(), "five", now=clock.now)
    assert pause.runs_skipped >= 12
    clock.advance(0.5)
    resumed = resume_job(agent.store(), "five", now=clock.now)
    after = decided(agent, "five", clock.now)
    assert len(after) == pause.runs_skipped and set(after.values()) == {("pending", None)}, after
    assert (resumed.runs_resumed, resumed.runs_caught_up) == (pause.runs_skipped, 0)
    # No tick: each slot runs at its time.
    for second in (5, 10, 15):
        clock.now = at(f"2026-11-25T08:00:{second:02d}")
        work(agent)
        assert runs_of(agent, "five")[clock.now]["status"] == "succeeded", second
    events = [e["kind"] for e in history_view(agent.store(), "five", 50)["job_events"]]
    assert events.count("paused") == 1 and events.count("resumed") == 1


def test_resume_after_a_long_pause_runs_the_next_slot_at_its_time_with_no_tick(agent_factory):
    """Item 6: the ticks of a pause record its slots skipped ahead, up to their horizon, as the
    pause records those claimed before it; a resume brings back the ones after it at once."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"five": {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock)
    agent.tick()
    clock.advance(1)
    pause_job(agent.store(), "five", now=clock.now)
    for minute in (1, 2, 3):
        clock.now = at(f"2026-11-25T08:0{minute}:00")
        agent.tick()
    clock.now = at("2026-11-25T08:03:01")
    resume_job(agent.store(), "five", now=clock.now)
    clock.now = at("2026-11-25T08:03:05")
    work(agent)                                          # no tick since 08:03:00
    runs = runs_of(agent, "five")
    assert runs[clock.now]["status"] == "succeeded"
    inside = decided(agent, "five", at("2026-11-25T08:00:05"))
    assert {value for slot, value in inside.items() if slot < at("2026-11-25T08:03:01")} == {("skipped", NOTE_PAUSED)}


def test_every_change_of_a_pause_decides_its_slots_again(agent_factory):
    """Item 5, the state machine: a pause with --until, the same pause lengthened, shortened,
    made open-ended, resumed, resumed twice; after each change the slots it holds are skipped
    "paused" and the others pending, whatever was decided before."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"five": {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                          clock=clock)
    agent.tick()
    start = at("2026-11-25T08:00:05")
    clock.advance(1)
    store = agent.store()

    def expect(end: datetime | None) -> None:
        for slot, value in decided(agent, "five", start).items():
            held = end is None or slot < end
            assert value == (("skipped", NOTE_PAUSED) if held else ("pending", None)), (slot, end, value)

    first = pause_job(store, "five", now=clock.now, until=at("2026-11-25T08:00:40"))
    expect(at("2026-11-25T08:00:40"))
    longer = pause_job(store, "five", now=clock.now, until=at("2026-11-25T08:01:00"))
    assert longer.paused_at == first.paused_at and longer.runs_skipped == 4       # 08:00:40 .. 08:00:55
    expect(at("2026-11-25T08:01:00"))
    shorter = pause_job(store, "five", now=clock.now, until=at("2026-11-25T08:00:20"))
    assert shorter.runs_skipped == 0
    expect(at("2026-11-25T08:00:20"))                  # 08:00:20 .. 08:00:55 run again
    pause_job(store, "five", now=clock.now)            # until resumed
    expect(None)
    clock.advance(1)
    resume_job(store, "five", now=clock.now)
    expect(clock.now)
    with pytest.raises(UsageError, match="is not paused"):
        resume_job(store, "five", now=clock.now)
    expect(clock.now)
    # And the runs go: the first slot after the resume runs at its time.
    clock.now = start
    work(agent)
    assert runs_of(agent, "five")[start]["status"] == "succeeded"


def test_a_schedule_changed_while_paused_does_not_bring_back_the_old_slots(agent_factory):
    clock = Clock(at("2026-11-25T08:00:00"))
    old = agent_factory({"five": {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1"}}, clock=clock)
    old.tick()
    clock.advance(1)
    pause_job(old.store(), "five", now=clock.now)
    changed = agent_factory({"five": {"SCHEDULE": "2/10 * * * * *", "COMMAND": "SELECT 1"}}, clock=clock)
    clock.advance(1)
    changed.tick()                                     # sync: the old slots ahead are the old schedule's
    clock.advance(1)
    resume_job(changed.store(), "five", now=clock.now)
    pending = sorted(slot for slot, value in decided(changed, "five", clock.now).items() if value[0] == "pending")
    assert pending and {slot.second % 10 for slot in pending} == {2}, pending


@pytest.mark.parametrize("misfire", ["skip", "run-once"])
def test_until_claims_the_slots_after_the_pause_ahead_so_they_run_at_their_time(agent_factory, misfire):
    """Item 6: the tick before --until comes claims the slots after it, runnable at their time;
    none runs before the end, and no tick after it is needed. Under run-once the last slot the
    pause held is caught up once, at the end."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = agent_factory({"five": {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1", "MISFIRE": misfire}},
                          clock=clock)
    agent.tick()
    clock.advance(1)
    end = datetime.fromisoformat("2026-11-25T08:02:02.500000+00:00")
    pause_job(agent.store(), "five", now=clock.now, until=end)
    for minute in (1, 2):
        clock.now = at(f"2026-11-25T08:0{minute}:00")
        agent.tick()                                   # the last tick before the end
    runs = runs_of(agent, "five")
    last_held = at("2026-11-25T08:02:00")
    first_after = at("2026-11-25T08:02:05")
    assert (runs[first_after]["status"], runs[first_after]["note"]) == ("pending", None)
    if misfire == "run-once":
        assert (runs[last_held]["status"], runs[last_held]["note"]) == ("pending", NOTE_CATCH_UP)
    else:
        assert (runs[last_held]["status"], runs[last_held]["note"]) == ("skipped", NOTE_PAUSED)
    clock.now = at("2026-11-25T08:02:02")               # still paused: nothing runs
    work(agent)
    assert [r for r in runs_of(agent, "five").values() if r["status"] == "succeeded"] == []
    clock.now = at("2026-11-25T08:02:03")               # the end has come
    work(agent)
    caught = runs_of(agent, "five")[last_held]["status"]
    assert caught == ("succeeded" if misfire == "run-once" else "skipped")
    clock.now = first_after
    work(agent)
    assert runs_of(agent, "five")[first_after]["status"] == "succeeded"


def _started_late_by(agent, job: str, after: datetime) -> list[float]:
    rows = query(agent, f"SELECT scheduled_for, started_at FROM {runs_table(agent)} WHERE job_name = '{job}' "
                        f"AND status = 'succeeded' AND scheduled_for > '{after.replace(tzinfo=None).isoformat(sep=' ')}' "
                        "ORDER BY scheduled_for")
    return [(started - slot).total_seconds() for slot, started in rows]


@pytest.mark.parametrize("how", ["command", "tsql"])
def test_a_job_every_5_seconds_paused_and_resumed_at_once_runs_its_next_slot_on_time(pg_url, how):
    """Item 6, measured with the local runner on the database's clock: pause and resume at once
    (the command line's operations, or agent.pause_job / agent.resume_job from another session);
    the next slots start within a couple of seconds of their time (generous for CI load)."""
    import threading

    from shared.engine.runner import LocalRunner
    from tests.support.tsql_caller import connect

    agent = make_agent(pg_url, {"five": {"SCHEDULE": EVERY_5_SECONDS, "COMMAND": "SELECT 1", "MISFIRE": "skip"}},
                       simulated_time=False)
    runner = LocalRunner(agent, concurrency=2)          # AGENT_POLL_SECONDS as configured (10 s)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    connection = connect(pg_url) if how == "tsql" else None
    try:
        deadline = time.monotonic() + 30
        while not _started_late_by(agent, "five", datetime(2000, 1, 1, tzinfo=UTC)) and time.monotonic() < deadline:
            time.sleep(0.2)
        resumed_at = agent.clock()
        if how == "tsql":
            call(connection, "pause_job", job_name="five")
            call(connection, "resume_job", job_name="five")
        else:
            pause_job(agent.store(), "five", now=agent.clock())
            resume_job(agent.store(), "five", now=agent.clock())
        time.sleep(12)
    finally:
        runner.stop()
        thread.join(30)
        if connection is not None:
            connection.close()
    late = _started_late_by(agent, "five", resumed_at)
    assert len(late) >= 2, late                          # every slot after the resume ran
    assert max(late) < 2.5, late
    skipped = query(agent, f"SELECT COUNT(*) FROM agent.runs WHERE job_name = 'five' AND status = 'skipped' "
                           f"AND scheduled_for > '{resumed_at.replace(tzinfo=None).isoformat(sep=' ')}'")
    assert skipped == [(0,)]


def test_the_catch_up_of_a_far_end_is_claimed_when_the_end_is_near_and_run_now_is_not_held(agent_factory):
    """Run-once, a pause until far ahead: the last slot it holds waits unclaimed (the job's next
    slot) until the tick whose horizon reaches the end claims it, runnable at the end; meanwhile
    a run-now of the paused job (overlap queue) is not held back behind a pending catch-up."""
    clock = Clock(at("2026-11-25T09:30:00"))
    agent = agent_factory({"hourly": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "OVERLAP": "queue"}}, clock=clock)
    agent.tick()
    end = at("2026-11-25T10:59:30")
    pause_job(agent.store(), "hourly", now=clock.advance(60), until=end)
    clock.now = at("2026-11-25T10:00:30")
    agent.tick()
    last_held = at("2026-11-25T10:00:00")
    assert last_held not in runs_of(agent, "hourly")            # held back, unclaimed
    assert agent.request_run_now("hourly")["status"] == "pending"
    work(agent)
    assert [r["status"] for r in runs_of(agent, "hourly").values() if r["kind"] == "manual"] == ["succeeded"]
    clock.now = at("2026-11-25T10:58:30")
    agent.tick()                                                  # its horizon reaches the end
    caught = runs_of(agent, "hourly")[last_held]
    assert (caught["status"], caught["note"]) == ("pending", NOTE_CATCH_UP)
    clock.now = at("2026-11-25T10:59:00")
    work(agent)
    assert runs_of(agent, "hourly")[last_held]["status"] == "pending"     # not before the end
    clock.now = at("2026-11-25T10:59:31")
    work(agent)
    assert runs_of(agent, "hourly")[last_held]["status"] == "succeeded"
    agent.tick()
    assert runs_of(agent, "hourly")[at("2026-11-25T11:00:00")]["status"] == "pending"


@pytest.mark.parametrize("dialect", ["postgres"] + (["mssql"] if MSSQL_BASE else []))
def test_tsql_pause_a_redefinition_and_resume_bring_back_only_the_new_definitions_slots(dialect):
    """agent.pause_job, agent.add_scheduled_job (a new schedule) and agent.resume_job on a real
    server: the slots the pause recorded ahead for the old schedule stay skipped (their note says
    the job was redefined); the new schedule's slots, recorded 'paused' by the tick while the job
    was paused, come back at the resume."""
    from tests.support.harness import fresh_database
    from tests.support.tsql_caller import connect

    with fresh_database(dialect) as url:
        agent = make_agent(url, simulated_time=False)
        connection = connect(url)
        try:
            call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule=EVERY_5_SECONDS)
            agent.tick()                                  # plans it and claims its slots ahead
            (paused,) = call(connection, "pause_job", job_name="five")
            assert paused["runs_skipped"] >= 1
            call(connection, "add_scheduled_job", name="five", sql="SELECT 1", schedule="2/10 * * * * *")
            agent.tick()                                  # plans the new schedule: its slots held, ahead
            call(connection, "resume_job", job_name="five")
            now = agent.clock()
            rows = select(connection, "SELECT scheduled_for, status, note FROM agent.runs WHERE job_name = 'five' "
                                      "AND kind = 'scheduled' ORDER BY scheduled_for")
            ahead = [(r["scheduled_for"], r["status"], r["note"]) for r in rows
                     if r["scheduled_for"].replace(tzinfo=UTC) > now]
            pending = [slot for slot, status, _ in ahead if status == "pending"]
            assert pending and {slot.second % 10 for slot in pending} == {2}, ahead
            old = [(status, note) for slot, status, note in ahead if slot.second % 10 != 2]
            assert old and {status for status, _ in old} == {"skipped"}
            assert all("redefined" in note for _, note in old), old
            events = select(connection, "SELECT detail FROM agent.job_events WHERE job_name = 'five' AND kind = 'resumed'")
            assert len(events) == 1 and "slot(s) claimed ahead run at their time" in events[0]["detail"]
        finally:
            connection.close()
            agent.close()
