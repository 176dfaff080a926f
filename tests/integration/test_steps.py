"""Job steps (SQL Agent parity, issue 15) on SQLite and PostgreSQL: the flow actions (next,
quit_success, quit_failure, goto, including a goto back with an exit), a step's retries at its
interval, every step attempt a history row, the next step started at once, a crash inside
step 2 resuming at step 2 with step 1 not rerun, and the validation at sync."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.jobs.from_settings import parse_jobs
from shared.messaging.memory import MemoryQueue
from tests.support.harness import Clock, execute, query, sql_for, tsql_delay, work

UTC = timezone.utc


def once(**settings: str) -> dict[str, str]:
    return {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), **settings}


def steps(*commands: str, **extra: str) -> dict[str, str]:
    """A one-time job due now with these steps; ``extra`` as {"2__ON_FAILURE": "goto:3", ...}."""
    job = once()
    for number, command in enumerate(commands, start=1):
        job[f"STEPS__{number}__COMMAND"] = command
    for key, value in extra.items():
        job[f"STEPS__{key}"] = value
    return job


def the_run(agent, job):
    (run,) = agent.store().execute("list_history", job_name=job, limit=10).rows
    return run


def attempts(agent, run_id):
    return agent.store().execute("list_attempts", run_ids=[run_id]).rows


def marks(agent) -> list[str]:
    return [label for (label,) in query(agent, "SELECT label FROM marks ORDER BY id")]


def mark(label: str) -> str:
    return f"INSERT INTO marks (label) VALUES ('{label}')"


def fail_sql(db_url: str) -> str:
    """SQL that always fails with an error in the job's SQL (permanent)."""
    return "SELECT * FROM no_such_table"


def setup_marks(agent) -> None:
    if agent.target.dialect == "sqlite":
        execute(agent, "CREATE TABLE marks (id INTEGER PRIMARY KEY AUTOINCREMENT, label VARCHAR(20))")
    elif agent.target.dialect == "mssql":
        execute(agent, "CREATE TABLE marks (id INT IDENTITY PRIMARY KEY, label VARCHAR(20))")
    else:
        execute(agent, "CREATE TABLE marks (id SERIAL PRIMARY KEY, label VARCHAR(20))")


@pytest.fixture(params=["direct", "queue"])
def mode(request):
    return request.param


def build(agent_factory, mode, jobs, **kwargs):
    if mode == "queue":
        kwargs.setdefault("queue", MemoryQueue())
    agent = agent_factory(jobs, **kwargs)
    setup_marks(agent)
    agent.tick(datetime.now(UTC))
    return agent


def test_steps_run_in_order_each_attempt_its_own_row_and_the_next_step_starts_at_once(agent_factory, db_url, mode):
    agent = build(agent_factory, mode, {"nightly": steps(mark("one"), mark("two"), mark("three"))})
    started = time.monotonic()
    work(agent, concurrency=1)
    # No wait for a tick, a poll or a message between steps.
    assert time.monotonic() - started < 10
    run = the_run(agent, "nightly")
    assert run["status"] == "succeeded" and run["step"] == 3 and run["failed_step"] is None
    assert marks(agent) == ["one", "two", "three"]
    rows = attempts(agent, run["run_id"])
    assert [(a["step"], a["outcome"], a["attempt"]) for a in rows] == [
        (1, "succeeded", 1), (2, "succeeded", 2), (3, "succeeded", 3)]
    assert all(a["finished_at"] >= a["started_at"] for a in rows)
    assert run["attempt"] == 3


def test_on_failure_goto_a_report_step_that_quits_with_failure(agent_factory, db_url, mode):
    """SQL Agent's nightly: rebuild, then statistics; on failure of step 1 go to step 3 (report),
    which quits reporting failure. Step 2 never runs."""
    agent = build(agent_factory, mode, {"nightly": steps(
        fail_sql(db_url), mark("stats"), mark("report"),
        **{"1__MAX_ATTEMPTS": "1", "1__ON_FAILURE": "goto:3", "2__ON_SUCCESS": "quit_success",
           "3__ON_SUCCESS": "quit_failure"})})
    work(agent, concurrency=1)
    run = the_run(agent, "nightly")
    assert run["status"] == "failed" and run["failed_step"] == 1, run
    assert run["finished_at"] is not None
    assert marks(agent) == ["report"]
    rows = attempts(agent, run["run_id"])
    assert [(a["step"], a["outcome"]) for a in rows] == [(1, "failed"), (3, "succeeded")]
    assert "no_such_table" in rows[0]["error_message"]


def test_quit_success_on_failure_and_quit_failure_on_success(agent_factory, db_url):
    agent = build(agent_factory, "direct", {
        "tolerant": steps(fail_sql(db_url), mark("never"), **{"1__MAX_ATTEMPTS": "1", "1__ON_FAILURE": "quit_success"}),
        "strict": steps(mark("checked"), mark("never"), **{"1__ON_SUCCESS": "quit_failure"})})
    work(agent, concurrency=1)
    tolerant, strict = the_run(agent, "tolerant"), the_run(agent, "strict")
    assert tolerant["status"] == "succeeded" and tolerant["step"] == 1
    assert strict["status"] == "failed" and strict["failed_step"] == 1
    assert marks(agent) == ["checked"]
    assert [a["outcome"] for a in attempts(agent, strict["run_id"])] == ["succeeded"]


def test_goto_back_with_an_exit(agent_factory, db_url, mode):
    """Step 2 fails until step 1 ran three times; its ON_FAILURE goes back to step 1, its
    ON_SUCCESS quits with success: 1, 2, 1, 2, 1, 2."""
    check = sql_for(db_url,
                    "SELECT json(CASE WHEN COUNT(*) < 3 THEN 'not json' ELSE '1' END) FROM marks",
                    "SELECT 1 / (CASE WHEN COUNT(*) < 3 THEN 0 ELSE 1 END) FROM marks",
                    "SELECT 1 / (CASE WHEN COUNT(*) < 3 THEN 0 ELSE 1 END) FROM marks")
    agent = build(agent_factory, mode, {"loop": steps(
        mark("again"), check, **{"1__ON_SUCCESS": "next", "2__MAX_ATTEMPTS": "1", "2__ON_FAILURE": "goto:1",
                                 "2__ON_SUCCESS": "quit_success"})})
    work(agent, concurrency=1)
    run = the_run(agent, "loop")
    assert run["status"] == "succeeded", run
    assert marks(agent) == ["again"] * 3
    assert [(a["step"], a["outcome"]) for a in attempts(agent, run["run_id"])] == [
        (1, "succeeded"), (2, "failed"), (1, "succeeded"), (2, "failed"), (1, "succeeded"), (2, "succeeded")]
    # The failure along the way is remembered; the run's outcome is the flow's.
    assert run["failed_step"] == 2 and run["last_error"] is None


def test_a_step_is_retried_after_its_interval_and_earlier_steps_are_not_rerun(agent_factory, db_url, mode):
    clock = Clock(datetime.now(UTC))
    kwargs = {"clock": clock}
    if mode == "queue":
        kwargs["queue"] = MemoryQueue(clock=lambda: clock.now.timestamp())
    # Step 2 fails on its first attempt (one mark so far), succeeds on its second.
    flaky = sql_for(db_url,
                    "SELECT json(CASE WHEN COUNT(*) < 2 THEN 'not json' ELSE '1' END) FROM marks",
                    "SELECT 1 / (CASE WHEN COUNT(*) < 2 THEN 0 ELSE 1 END) FROM marks",
                    "SELECT 1 / (CASE WHEN COUNT(*) < 2 THEN 0 ELSE 1 END) FROM marks")
    agent = agent_factory({"flaky": {"SCHEDULE": "@once " + clock.now.isoformat(),
                                     "STEPS__1__COMMAND": mark("one"),
                                     "STEPS__2__COMMAND": flaky, "STEPS__2__MAX_ATTEMPTS": "2",
                                     "STEPS__2__RETRY_INTERVAL_SECONDS": "45"}},
                          AGENT_RETRY_BACKOFF_SECONDS="600", **kwargs)
    setup_marks(agent)
    agent.tick()
    work(agent, concurrency=1)
    run = the_run(agent, "flaky")
    # Waiting for its retry (in queue mode with its delayed message already sent).
    assert run["status"] in ("pending", "queued") and run["step"] == 2 and run["failures"] == 1
    failed = attempts(agent, run["run_id"])[-1]
    assert failed["step"] == 2 and failed["outcome"] == "failed"
    # Not before its interval (45 s, the step's own; not the 600 s backoff).
    execute(agent, mark("extra"))
    clock.advance(30)
    if mode == "queue":
        agent.tick()
    work(agent, concurrency=1)
    assert the_run(agent, "flaky")["status"] in ("pending", "queued")
    clock.advance(16)
    agent.tick()
    work(agent, concurrency=1)
    run = the_run(agent, "flaky")
    assert run["status"] == "succeeded", run
    assert [(a["step"], a["outcome"]) for a in attempts(agent, run["run_id"])] == [
        (1, "succeeded"), (2, "failed"), (2, "succeeded")]
    assert marks(agent) == ["one", "extra"]


def test_one_step_jobs_keep_todays_rows(agent_factory, db_url):
    agent = build(agent_factory, "direct", {"plain": once(COMMAND=mark("plain"))})
    work(agent)
    run = the_run(agent, "plain")
    assert run["status"] == "succeeded" and run["step"] == 1
    (attempt,) = attempts(agent, run["run_id"])
    assert attempt["step"] is None and attempt["outcome"] == "succeeded"
    assert agent.store().execute("get_run", run_id=run["run_id"]).one()["steps"] is None


def test_a_redefinition_reaches_a_run_claimed_ahead_that_never_started(agent_factory, db_url):
    """Steps are copied onto the run when its slot is claimed; a change of the settings before
    the run starts reaches it (SQL Server Agent too reads a job's steps when the job starts)."""
    old = steps(mark("old-1"), mark("old-2"))
    agent = build(agent_factory, "direct", {"nightly": old})
    new = {**old, "STEPS__1__COMMAND": mark("new-1"), "STEPS__2__COMMAND": mark("new-2")}
    changed = agent_factory({"nightly": new})
    changed.tick(datetime.now(UTC) + timedelta(seconds=1))
    work(changed, concurrency=1)
    assert marks(agent) == ["new-1", "new-2"]
    assert the_run(agent, "nightly")["status"] == "succeeded"


def test_a_redefinition_never_changes_a_run_in_flight(agent_factory, db_url):
    """A run that started keeps the steps it started with, through a retry of a later step."""
    clock = Clock(datetime.now(UTC))
    flaky = sql_for(db_url,
                    "SELECT json(CASE WHEN COUNT(*) < 2 THEN 'not json' ELSE '1' END) FROM marks",
                    "SELECT 1 / (CASE WHEN COUNT(*) < 2 THEN 0 ELSE 1 END) FROM marks",
                    "SELECT 1 / (CASE WHEN COUNT(*) < 2 THEN 0 ELSE 1 END) FROM marks")
    old = {"SCHEDULE": "@once " + clock.now.isoformat(), "STEPS__1__COMMAND": mark("old-1"),
           "STEPS__2__COMMAND": flaky, "STEPS__2__MAX_ATTEMPTS": "2",
           "STEPS__2__RETRY_INTERVAL_SECONDS": "45"}
    agent = agent_factory({"nightly": old}, clock=clock, AGENT_RETRY_BACKOFF_SECONDS="600")
    setup_marks(agent)
    agent.tick()
    work(agent, concurrency=1)
    run = the_run(agent, "nightly")
    assert run["status"] == "pending" and run["step"] == 2 and run["failures"] == 1   # in flight
    execute(agent, mark("extra"))   # step 2's retry succeeds
    new = {**old, "STEPS__1__COMMAND": mark("new-1"), "STEPS__2__COMMAND": mark("new-2")}
    changed = agent_factory({"nightly": new}, clock=clock, AGENT_RETRY_BACKOFF_SECONDS="600")
    changed.tick()
    clock.advance(46)
    changed.tick()
    work(changed, concurrency=1)
    assert the_run(agent, "nightly")["status"] == "succeeded"
    assert marks(agent) == ["old-1", "extra"]
    jobs = {row["job_name"]: row for row in agent.store().execute("list_jobs").rows}
    assert jobs["nightly"]["valid"] == 1   # the new definition was synced; the started run kept the old one


# ---------------------------------------------------------------- validation at sync


def _errors(env: dict[str, str]) -> dict[str, str]:
    valid, invalid = parse_jobs(env)
    return {bad.name: bad.message for bad in invalid} | {job.name: "" for job in valid}


def test_step_validation_one_clear_line_and_that_job_alone_invalid():
    base = {"SCHEDULE": "0 0 3 * * *"}
    jobs = {
        "good": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__2__COMMAND": "SELECT 2"},
        "both": {**base, "COMMAND": "SELECT 1", "STEPS__1__COMMAND": "SELECT 1"},
        "gap": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__3__COMMAND": "SELECT 3"},
        "missing": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__1__ON_FAILURE": "goto:4"},
        "cycle": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__1__ON_SUCCESS": "goto:2",
                  "STEPS__1__ON_FAILURE": "goto:2", "STEPS__2__COMMAND": "SELECT 2",
                  "STEPS__2__ON_SUCCESS": "goto:1", "STEPS__2__ON_FAILURE": "goto:1"},
        "action": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__1__ON_SUCCESS": "continue"},
        "empty": {**base, "STEPS__1__COMMAND": " "},
        "number": {**base, "STEPS__one__COMMAND": "SELECT 1"},
        "unknown": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__1__RETRIES": "2"},
        "attempts": {**base, "STEPS__1__COMMAND": "SELECT 1", "STEPS__1__MAX_ATTEMPTS": "0"},
    }
    env = {f"JOB__{name}__{key}": value for name, settings in jobs.items() for key, value in settings.items()}
    errors = _errors(env)
    assert errors["good"] == ""
    assert errors["both"] == ("JOB__both__COMMAND and JOB__both__STEPS__<n>__COMMAND are both set: a job has "
                              "either one COMMAND or STEPS, not both")
    assert "without gaps" in errors["gap"] and "missing 2" in errors["gap"]
    assert "JOB__missing__STEPS__1__ON_FAILURE='goto:4'" in errors["missing"] and "no step 4" in errors["missing"]
    assert "a loop that can never end" in errors["cycle"] and "1, 2" in errors["cycle"]
    assert "JOB__action__STEPS__1__ON_SUCCESS='continue'" in errors["action"]
    assert "next or quit_success or quit_failure or goto:<n>" in errors["action"]
    assert "JOB__empty__STEPS__1__COMMAND" in errors["empty"]
    assert "a step number from 1 to 100" in errors["number"]
    assert "unknown step setting 'RETRIES'" in errors["unknown"]
    assert "JOB__attempts__STEPS__1__MAX_ATTEMPTS='0'" in errors["attempts"]
    for name, message in errors.items():
        assert "\n" not in message, name


def test_flow_defaults_are_sql_agents():
    valid, _ = parse_jobs({"JOB__n__SCHEDULE": "0 0 3 * * *", "JOB__n__MAX_ATTEMPTS": "2",
                           "JOB__n__STEPS__1__COMMAND": "SELECT 1", "JOB__n__STEPS__2__COMMAND": "SELECT 2",
                           "JOB__n__STEPS__2__DATABASE": "sales", "JOB__n__STEPS__2__TIMEOUT_SECONDS": "60"})
    (job,) = valid
    first, last = job.steps
    assert (first.on_success, first.on_failure) == ("goto:2", "quit_failure")
    assert (last.on_success, last.on_failure) == ("quit_success", "quit_failure")
    assert (first.max_attempts, first.timeout_seconds, first.database) == (2, 1800, None)
    assert (last.timeout_seconds, last.database, last.retry_interval_seconds) == (60, "sales", None)
    assert job.command == "SELECT 1"


def test_steps_enter_the_settings_hash():
    from shared.settings import load_settings

    one = load_settings(environ={"JOB__n__SCHEDULE": "0 0 3 * * *", "JOB__n__STEPS__1__COMMAND": "SELECT 1",
                                 "JOB__n__STEPS__2__COMMAND": "SELECT 2"})
    two = load_settings(environ={"JOB__n__SCHEDULE": "0 0 3 * * *", "JOB__n__STEPS__1__COMMAND": "SELECT 1",
                                 "JOB__n__STEPS__2__COMMAND": "SELECT 2", "JOB__n__STEPS__2__ON_FAILURE": "goto:1"})
    assert one.config_hash != two.config_hash


def test_invalid_steps_are_recorded_at_sync_and_the_other_jobs_run(agent_factory, db_url):
    agent = build(agent_factory, "direct", {"ok": once(COMMAND=mark("ok")),
                                           "bad": steps(mark("bad"), **{"1__ON_SUCCESS": "goto:9"})})
    work(agent)
    assert marks(agent) == ["ok"]
    jobs = {row["job_name"]: row for row in agent.store().execute("list_jobs").rows}
    assert jobs["bad"]["valid"] == 0 and "goto:9" in jobs["bad"]["config_error"]


# ---------------------------------------------------------------- a crash inside step 2


def test_a_worker_killed_inside_step_2_resumes_at_step_2_and_step_1_is_not_rerun(agent_factory, db_url):
    from tests.support.faults import clean_env, kill9, start_cli, wait_until

    slow = sql_for(db_url, "SELECT agent_sleep(CASE WHEN EXISTS (SELECT 1 FROM slow_flag) THEN 60 ELSE 0 END)",
                   "SELECT pg_sleep(CASE WHEN EXISTS (SELECT 1 FROM slow_flag) THEN 60 ELSE 0 END)",
                   f"IF EXISTS (SELECT 1 FROM slow_flag) {tsql_delay(60)}")
    agent = build(agent_factory, "direct", {"nightly": {**steps(mark("one"), f"{slow}; {mark('two')}"),
                                                        "LEASE_SECONDS": "6"}})
    execute(agent, "CREATE TABLE slow_flag (x INT)")
    execute(agent, "INSERT INTO slow_flag VALUES (1)")
    worker = start_cli(db_url, "work", "--until-idle", env=clean_env())
    try:
        def in_step_2():
            run = the_run(agent, "nightly")
            return run["status"] == "running" and run["step"] == 2

        wait_until(in_step_2, 30, "the worker reaches step 2")
        time.sleep(0.5)   # inside step 2's statement
        kill9(worker)
    finally:
        kill9(worker)
    execute(agent, "DELETE FROM slow_flag")
    run = the_run(agent, "nightly")
    assert run["status"] == "running" and run["step"] == 2 and marks(agent) == ["one"]
    # The lease lapses (6 s); the tick takes the run back; a worker resumes it at step 2.
    run_id = run["run_id"]
    wait_until(lambda: agent.store().execute("get_run", run_id=run_id).one()["lease_expires_at"] < datetime.now(UTC),
               15, "the lease lapses")
    # A tick takes it back (ticks again if one could not: a loaded machine's SQLite can be busy).
    wait_until(lambda: (agent.tick(datetime.now(UTC)), the_run(agent, "nightly")["status"] != "running")[1], 15,
               "a tick takes the run back")
    run = the_run(agent, "nightly")
    assert run["status"] == "pending" and run["step"] == 2 and run["lapses"] == 1
    work(agent, concurrency=1)
    run = the_run(agent, "nightly")
    assert run["status"] == "succeeded", run
    assert marks(agent) == ["one", "two"]   # step 1, committed, never ran again
    assert [(a["step"], a["outcome"]) for a in attempts(agent, run["run_id"])] == [
        (1, "succeeded"), (2, "lease_expired"), (2, "succeeded")]
