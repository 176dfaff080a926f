"""Quiet ticks (issue 31 items 1 and 2): the timer does not connect to the control database while
nothing can come due, measured by counting the connections the tick takes, in simulated time."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine import quiet
from shared.errors import ConfigError
from shared.settings import load_settings
from tests.support.azurite import azurite, azurite_server  # noqa: F401  (pytest fixtures)
from tests.support.harness import Clock, execute, query, runs_table, work

UTC = timezone.utc
MAX_MINUTES = 30


def _nightly_profile(base: datetime) -> dict[str, dict[str, str]]:
    """Two jobs once a day ("nightly") at base+10 min and base+20 min."""
    return {"index_upkeep": {"SCHEDULE": f"0 10 {base.hour} * * *", "COMMAND": "SELECT 1"},
            "purge_staging": {"SCHEDULE": f"0 20 {base.hour} * * *", "COMMAND": "SELECT 2"}}


class Counted:
    """Counts the connections the agent's pool hands out (every statement's session with the
    control database) and the connections it opens: the store's connect hook."""

    def __init__(self, agent) -> None:
        self.takes = 0
        self.opened = 0
        pool = agent.pool
        take, connect = pool.take, pool._connect

        def counted_take(*args, **kwargs):
            self.takes += 1
            return take(*args, **kwargs)

        def counted_connect():
            self.opened += 1
            return connect()

        pool.take = counted_take
        pool._connect = counted_connect


def _hour_of_ticks(agent, clock: Clock, record, counter: Counted, minutes: int = 60):
    """One timer tick a minute, as the function app does (tick, record, release), and the due
    runs worked as the queue trigger would; returns per minute: (time, connected, connections)."""
    out = []
    for _ in range(minutes):
        before = counter.takes
        decision, report = quiet.timer_tick(agent, clock.now, record)
        agent.release()
        if report is not None:
            work(agent)
            agent.release()
        out.append((clock.now, report is not None, counter.takes - before, decision.reason))
        clock.advance(60)
    return out


def test_nightly_jobs_an_hour_of_ticks_connects_only_around_the_runs(agent_factory, tmp_path):
    # In the past by three hours: the runs are runnable by the database's real clock when worked.
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    clock = Clock(base)
    agent = agent_factory(_nightly_profile(base), clock=clock, AGENT_QUIET_MAX_MINUTES=str(MAX_MINUTES))
    record = quiet.FileRecord(tmp_path / "horizon.json")
    agent.release()
    counter = Counted(agent)
    minutes = _hour_of_ticks(agent, clock, record, counter)
    connected = [moment for moment, did, _, _ in minutes if did]
    # Each job's run: the ticks from one claim span and one period before its slot to the run's end.
    assert base in connected                                  # no record yet: the first tick connects
    for slot in (base + timedelta(minutes=10), base + timedelta(minutes=20)):
        assert any(slot - timedelta(minutes=3) <= moment <= slot for moment in connected), (slot, connected)
    statuses = query(agent, f"SELECT job_name, status FROM {runs_table(agent)} ORDER BY job_name")
    assert statuses == [("index_upkeep", "succeeded"), ("purge_staging", "succeeded")]
    # After the last run: zero connections until the horizon (now + AGENT_QUIET_MAX_MINUTES, the
    # next slot being tomorrow), then one tick connects and records the next horizon.
    last_run = base + timedelta(minutes=20)
    after = [(moment, did, taken) for moment, did, taken, _ in minutes if moment > last_run + timedelta(minutes=1)]
    quiet_ticks = [moment for moment, did, taken in after if not did]
    assert all(taken == 0 for _, did, taken in after if not did)
    woke = [moment for moment, did, _ in after if did]
    assert len(woke) == 1 and woke[0] - last_run <= timedelta(minutes=MAX_MINUTES + 2), woke
    assert len(quiet_ticks) >= 30
    assert len(connected) <= 12, connected
    # The figure the report gives: connections per hour for this profile (ticks that connected).
    print(f"nightly profile: {len(connected)} of 60 ticks connected, {counter.takes} connections taken, "
          f"{counter.opened} opened")


def test_quiet_max_bounds_work_submitted_behind_the_agents_back(agent_factory, tmp_path, db_url):
    """Work inserted from T-SQL (agent.exec_async on PostgreSQL, a plain INSERT on SQLite) is
    invisible to a quiet tick: it runs at the first tick at or after the recorded wake time,
    within AGENT_QUIET_MAX_MINUTES of the last connected tick."""
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    clock = Clock(base)
    agent = agent_factory({"weekly": {"SCHEDULE": "0 0 0 * * 0", "COMMAND": "SELECT 1"}}, clock=clock,
                          AGENT_QUIET_MAX_MINUTES=str(MAX_MINUTES))
    record = quiet.FileRecord(tmp_path / "horizon.json")
    decision, report = quiet.timer_tick(agent, clock.now, record)
    assert report is not None
    agent.release()
    last_connected = clock.now
    clock.advance(60)
    decision, report = quiet.timer_tick(agent, clock.now, record)
    assert report is None and not decision.connect
    if agent.store().dialect == "postgres":
        execute(agent, "SELECT agent.exec_async('SELECT 42')")
    else:   # the embedded database has no T-SQL interface: another process's submit, unannounced
        from shared.engine.operations import submit

        other = agent_factory({}, clock=clock)
        submit(other, "SELECT 42", order=None, max_attempts=1, timeout_seconds=60)
        other.release()
    agent.release()
    ran_at = None
    for _ in range(MAX_MINUTES + 2):
        clock.advance(60)
        decision, report = quiet.timer_tick(agent, clock.now, record)
        agent.release()
        if report is not None:
            work(agent)
            agent.release()
            done = query(agent, f"SELECT status FROM {runs_table(agent)} WHERE kind = 'task'")
            if done and done[0][0] == "succeeded":
                ran_at = clock.now
                break
    assert ran_at is not None and ran_at - last_connected <= timedelta(minutes=MAX_MINUTES), (ran_at, last_connected)


def _settings(**extra: str):
    env = {"AGENT_QUIET_MAX_MINUTES": str(MAX_MINUTES), "AGENT_DB": "sqlite:///x.db"}
    env.update(extra)
    return load_settings(environ=env)


def _text(settings, wake_at, written_at, **over):
    document = {"version": quiet.RECORD_VERSION, "wake_at": wake_at.isoformat(), "written_at": written_at.isoformat(),
                "fingerprint": quiet.fingerprint(settings)}
    document.update(over)
    return json.dumps(document)


def test_a_hostile_record_never_keeps_the_timer_away():
    settings = _settings()
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    sound = _text(settings, now + timedelta(minutes=10), now - timedelta(minutes=1))
    assert not quiet.decide(settings, sound, now).connect
    hostile = {
        "missing": None, "empty": "", "not json": "{", "a list": "[]", "NUL": "\x00",
        "other version": _text(settings, now + timedelta(minutes=10), now, version=99),
        "no offset": _text(settings, now + timedelta(minutes=10), now).replace("+00:00", ""),
        "far future wake": _text(settings, now + timedelta(days=3650), now),
        "future-dated": _text(settings, now + timedelta(hours=2, minutes=10), now + timedelta(hours=2)),
        "wake before written": _text(settings, now - timedelta(minutes=5), now),
        "other settings": _text(settings, now + timedelta(minutes=10), now, fingerprint="0" * 64),
        "invalidated": json.dumps({"version": quiet.RECORD_VERSION, "invalidated": "sql-agent run-now"}),
        "year 9999": _text(settings, now, now).replace("2026-11-26T12:00:00", "9999-12-31T23:59:59"),
        "huge": _text(settings, now + timedelta(minutes=10), now, padding="x" * 10_000_000),
        "numbers": json.dumps({"version": 1, "wake_at": 1e308, "written_at": -1, "fingerprint": None}),
    }
    for name, text in hostile.items():
        assert quiet.decide(settings, text, now).connect, name
    # A clock that jumps: forward past the wake time, or back before the record was written.
    assert quiet.decide(settings, sound, now + timedelta(minutes=10)).connect
    assert quiet.decide(settings, sound, now - timedelta(hours=1)).connect
    # Another job definition, or quiet ticks turned off: connect.
    changed = _settings(**{"JOB__x__SCHEDULE": "0 0 1 * * *", "JOB__x__COMMAND": "SELECT 1"})
    assert quiet.decide(changed, sound, now).connect
    assert quiet.decide(_settings(AGENT_QUIET_MAX_MINUTES="0"), sound, now).connect


def test_an_unreadable_record_store_connects(tmp_path):
    settings = _settings()

    class Broken:
        def read(self):
            raise OSError("storage account unreachable")

    decision = quiet.should_connect(settings, datetime.now(UTC), Broken())
    assert decision.connect and "unreachable" in decision.reason
    # A record file that is a directory (unreadable as a file): connect.
    (tmp_path / "dir.json").mkdir()
    assert quiet.should_connect(settings, datetime.now(UTC), quiet.FileRecord(tmp_path / "dir.json")).connect


def test_run_now_and_submit_from_the_cli_invalidate_the_record(tmp_path, monkeypatch):
    from shared.cli.commands import main as cli

    db = f"sqlite:///{tmp_path / 'agent.db'}"
    monkeypatch.setenv("AGENT_QUIET_MAX_MINUTES", str(MAX_MINUTES))
    monkeypatch.setenv("JOB__adhoc__COMMAND", "SELECT 1")
    assert cli(["--db", db, "init-db"]) == 0
    settings = replace(load_settings(), agent=replace(load_settings().agent, db=db))
    record = quiet.record_store(settings)
    assert isinstance(record, quiet.FileRecord) and record.path == tmp_path / "agent.db.quiet.json"
    now = datetime.now(UTC)
    for command in (["tick"], ["run-now", "adhoc"], ["submit", "--sql", "SELECT 2"]):
        record.write(_text(settings, now + timedelta(minutes=10), now))
        assert not quiet.decide(settings, record.read(), now).connect
        assert cli(["--db", db, *command]) == 0
        changed = command[0] != "tick"
        assert quiet.decide(settings, record.read(), now).connect == changed, command


@pytest.mark.parametrize("value", ["-1", "1441", "ten", "1e3", "2.5"])
def test_quiet_max_minutes_is_validated(value):
    with pytest.raises(ConfigError) as caught:
        _settings(AGENT_QUIET_MAX_MINUTES=value)
    message = str(caught.value)
    assert "AGENT_QUIET_MAX_MINUTES" in message and value in message and "0 to 1440" in message
    assert _settings(AGENT_QUIET_MAX_MINUTES="").agent.quiet_max_minutes == 0


def test_in_azure_the_record_is_metadata_of_a_queue_of_the_apps_storage(azurite):
    """The record lives in the app's own storage account (the queue SDK the app already uses):
    written by a connected tick, read by the next without the database, invalidated by the CLI."""
    name = azurite.unique_name()
    env = {**azurite.settings(), "AGENT_QUIET_MAX_MINUTES": str(MAX_MINUTES), "AGENT_QUEUE_NAME": name}
    settings = load_settings(environ=env)
    store = quiet.record_store(settings)
    assert isinstance(store, quiet.QueueMetadataRecord)
    now = datetime.now(UTC)
    assert store.read() is None and quiet.should_connect(settings, now, store).connect   # no queue yet
    quiet.record(settings, now + timedelta(minutes=10), now, "next_slot_at", store)
    decision = quiet.should_connect(settings, now + timedelta(minutes=1), store)
    assert not decision.connect and decision.wake_at == now + timedelta(minutes=10)
    assert quiet.invalidate(settings, "sql-agent run-now", store)
    assert quiet.should_connect(settings, now + timedelta(minutes=1), store).connect
    # Storage away: the tick connects to the database instead of sleeping.
    azurite.stop()
    try:
        decision = quiet.should_connect(settings, now + timedelta(minutes=1), quiet.record_store(settings))
        assert decision.connect and "unreadable" in decision.reason
    finally:
        azurite.start()


def test_a_new_measurement_of_the_nightly_profile_gives_docs_cost_figures():
    """bench/cost.py's stored figures (docs/cost.md) are what the engine does today."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "cost.py"
    spec = importlib.util.spec_from_file_location("bench_cost", path)
    cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cost)
    stored = json.loads(cost.MEASURED.read_text(encoding="utf-8"))
    name = "nightly jobs only (3 a night)"
    fresh = cost.measure_profile(cost.profiles()[name], stored["quiet_max_minutes"])
    for key in ("ticks", "connected_ticks", "runs", "active_minutes"):
        assert fresh[key] == stored["profiles"][name][key], key


def test_the_horizon_is_recorded_on_the_instances_clock(agent_factory, tmp_path):
    """Computed on the database's clock, recorded on the instance's: an instance 200 s behind
    the database wakes 200 s earlier by its own clock, not 200 s late; one beyond the allowed
    skew records nothing that could keep it away."""
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    clock = Clock(base)
    agent = agent_factory(_nightly_profile(base), clock=clock, AGENT_QUIET_MAX_MINUTES=str(MAX_MINUTES))
    record = quiet.FileRecord(tmp_path / "horizon.json")
    report = agent.tick(base)
    in_step = quiet.after_tick(agent, report, record, base)
    behind = quiet.after_tick(agent, report, record, base - timedelta(seconds=200))
    assert behind.wake_at == in_step.wake_at          # the decision, on the database's clock
    written = json.loads(record.read())
    assert quiet._time(written["wake_at"]) == in_step.wake_at - timedelta(seconds=200)
    assert quiet._time(written["written_at"]) == base - timedelta(seconds=200)
    far = agent.settings.agent.max_clock_skew_seconds + 1
    assert quiet.after_tick(agent, report, record, base - timedelta(seconds=far)) is None
    assert quiet.decide(agent.settings, record.read(), base - timedelta(seconds=far)).connect


@pytest.mark.parametrize("quiet_minutes", ["0", str(MAX_MINUTES)])
def test_with_quiet_ticks_the_notifier_does_not_keep_polling_the_database(agent_factory, quiet_minutes):
    """A process that stays up between ticks (a warm Functions instance): with quiet ticks on, the
    notifier's thread ends after a pass that found nothing due (it would otherwise look every
    few seconds and keep a serverless database awake); a wake starts it again. Off: as before."""
    import time

    agent = agent_factory({}, AGENT_QUIET_MAX_MINUTES=quiet_minutes)
    notifier = agent.notifier
    notifier.poll_seconds = 0.05
    agent.release()
    counter = Counted(agent)
    notifier.wake()
    deadline = time.monotonic() + (0.5 if quiet_minutes == "0" else 5)
    while notifier._thread is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    if quiet_minutes == "0":
        assert notifier._thread is not None and notifier._thread.is_alive()
        assert counter.takes >= 2          # it keeps looking
        return
    assert notifier._thread is None, "the notifier's thread is still running"
    taken = counter.takes
    assert taken >= 1                      # the one pass it made
    time.sleep(0.3)                        # six poll periods: nothing more
    assert counter.takes == taken
    notifier.wake()
    assert notifier._thread is not None
    deadline = time.monotonic() + 5
    while counter.takes == taken and time.monotonic() < deadline:
        time.sleep(0.02)
    assert counter.takes > taken           # woken: it looked again


def test_the_lease_renewal_gives_its_connection_back_when_it_holds_no_run(agent_factory, db_url):
    """An open session keeps a serverless database from pausing: after a run whose lease was
    renewed, the lease thread's connection is back in the pool (which closes it when idle), not
    checked out for as long as the process lives (a warm instance between quiet ticks)."""
    import time

    from tests.support.harness import sql_for

    slow = sql_for(db_url, "SELECT agent_sleep(3)", "SELECT pg_sleep(3)")
    agent = agent_factory({"slow": {"COMMAND": slow, "LEASE_SECONDS": "6"}})
    agent.tick()
    run = agent.request_run_now("slow")
    assert run is not None
    work(agent, concurrency=1, max_seconds=30)
    assert query(agent, f"SELECT status FROM {runs_table(agent)}") == [("succeeded",)]
    agent.release()
    renewed = query(agent, f"SELECT heartbeat_at FROM {runs_table(agent)}")[0][0]
    assert renewed is not None                        # the lease was renewed: the thread had a connection
    deadline = time.monotonic() + 5
    pool = agent.pool
    while pool._open["lease"] != len(pool._idle["lease"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool._open["lease"] == len(pool._idle["lease"]), "the lease connection is still checked out"


def test_the_timer_function_stays_quiet_until_the_cli_invalidates(db_url, azurite, monkeypatch):
    """The function app's own path (the real timer function, azure.functions' TimerRequest, the
    record in Azurite): the first tick connects and records the horizon, the next does not
    connect, a `submit` from the CLI (same storage settings) makes the next one connect."""
    import os

    from azure.functions.timer import TimerRequest

    from functions import timer_trigger
    from shared.cli.commands import main as cli
    from shared.engine.agent import default_agent, reset_default_agent

    for key in [k for k in list(os.environ) if k.startswith(("JOB__", "AGENT_"))]:
        monkeypatch.delenv(key)
    name = azurite.unique_name()
    for key, value in {**azurite.settings(), "AGENT_DB": db_url, "AGENT_QUEUE_NAME": name,
                       "AGENT_QUIET_MAX_MINUTES": str(MAX_MINUTES),
                       "JOB__later__SCHEDULE": "0 0 3 1 1 *", "JOB__later__COMMAND": "SELECT 1"}.items():
        monkeypatch.setenv(key, value)
    reset_default_agent()
    try:
        azurite.queue(name).ensure_exists()
        assert cli(["init-db"]) == 0
        agent = default_agent()
        counter = Counted(agent)
        tick = timer_trigger.agent_tick.build().get_user_function()
        tick(TimerRequest(past_due=False))
        first = counter.takes
        assert first >= 1
        tick(TimerRequest(past_due=False))
        assert counter.takes == first, "a quiet tick connected to the control database"
        assert cli(["submit", "--sql", "SELECT 1"]) == 0
        tick(TimerRequest(past_due=False))
        assert counter.takes > first, "the tick after a submit did not connect"
    finally:
        reset_default_agent()
