"""Step output (issue 15) from the real drivers: SQLite's rows affected, PostgreSQL's notices
(RAISE NOTICE, through pyodbc's cursor.messages), kept with each step attempt, capped by
AGENT_STEP_OUTPUT_MAX_BYTES with a note, shown by `history --job NAME --output`, and sent to
Application Insights as a property of the step events."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from shared.cli.commands import main as cli
from shared.jobs.steps import cap_output
from tests.support.appinsights_endpoint import appinsights_endpoint  # noqa: F401 (fixture)
from tests.support.harness import execute, make_agent, sql_for, work

UTC = timezone.utc


def _once() -> str:
    return "@once " + datetime.now(UTC).isoformat()


def _outputs(agent, job):
    store = agent.store()
    (run,) = store.execute("list_history", job_name=job, limit=5).rows
    attempts = store.execute("list_attempts", run_ids=[run["run_id"]]).rows
    outputs = {row["attempt"]: row["output"] for row in store.execute("list_attempt_output",
                                                                         run_ids=[run["run_id"]]).rows}
    return run, [(a["step"], a["outcome"], outputs.get(a["attempt"])) for a in attempts]


def _notice_step(db_url: str, text: str) -> str:
    return sql_for(db_url, "UPDATE items SET n = n + 1",
                   f"DO $$ BEGIN RAISE NOTICE '{text}'; END $$; UPDATE items SET n = n + 1",
                   f"PRINT '{text}'; UPDATE items SET n = n + 1")


def test_output_of_each_step_attempt_is_kept_and_shown(agent_factory, db_url, capsys):
    agent = agent_factory({"nightly": {"SCHEDULE": _once(),
                                       "STEPS__1__COMMAND": _notice_step(db_url, "rebuilt 3 indexes"),
                                       "STEPS__2__COMMAND": "SELECT * FROM no_such_table",
                                       "STEPS__2__MAX_ATTEMPTS": "1"}})
    execute(agent, "CREATE TABLE items (n INT)")
    execute(agent, "INSERT INTO items VALUES (1)")
    execute(agent, "INSERT INTO items VALUES (2)")
    agent.tick(datetime.now(UTC))
    work(agent, concurrency=1)
    run, attempts = _outputs(agent, "nightly")
    assert run["status"] == "failed" and run["failed_step"] == 2
    (step1, step2) = attempts
    assert step1[:2] == (1, "succeeded") and "(2 row(s) affected)" in step1[2]
    if agent.target.dialect == "postgres":
        assert "rebuilt 3 indexes" in step1[2]   # the server's notice, as pyodbc reported it
    assert step2[:2] == (2, "failed")
    assert cli(["--db", db_url, "history", "--job", "nightly", "--output"]) == 0
    shown = capsys.readouterr().out
    assert "failed at step 2" in shown
    assert "attempt 1 step 1 succeeded" in shown and "| (2 row(s) affected)" in shown
    assert "attempt 2 step 2 failed" in shown and "no_such_table" in shown
    assert cli(["--db", db_url, "history", "--job", "nightly", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (listed,) = document["runs"]
    assert [a["step"] for a in listed["attempts"]] == [1, 2]
    assert "(2 row(s) affected)" in listed["attempts"][0]["output"]


def test_one_step_jobs_keep_their_output_too(agent_factory, db_url):
    agent = agent_factory({"plain": {"SCHEDULE": _once(), "COMMAND": _notice_step(db_url, "one step")}})
    execute(agent, "CREATE TABLE items (n INT)")
    execute(agent, "INSERT INTO items VALUES (1)")
    agent.tick(datetime.now(UTC))
    work(agent)
    run, ((step, outcome, output),) = _outputs(agent, "plain")
    assert run["status"] == "succeeded" and step is None and outcome == "succeeded"
    assert "(1 row(s) affected)" in output


def test_output_before_an_error_is_kept_on_sqlite(tmp_path):
    """SQLite runs a script statement by statement: what ran before the error said its piece."""
    agent = make_agent(f"sqlite:///{tmp_path / 'agent.db'}",
                       {"partial": {"SCHEDULE": _once(), "MAX_ATTEMPTS": "1",
                                    "COMMAND": "INSERT INTO items VALUES (1); SELECT * FROM no_such_table"}})
    try:
        execute(agent, "CREATE TABLE items (n INT)")
        agent.tick(datetime.now(UTC))
        work(agent)
        run, ((_, outcome, output),) = _outputs(agent, "partial")
        assert outcome == "failed" and output == "(1 row(s) affected)"
    finally:
        agent.close()


def test_output_is_capped_with_a_note(agent_factory, db_url):
    updates = "; ".join(["UPDATE items SET n = n + 1"] * 20)
    # T-SQL: twenty PRINTs. A job's T-SQL runs in sp_executesql, and of the row counts of its
    # statements FreeTDS's ODBC driver reported only the last one (measured on Babelfish);
    # messages come one by one through every driver, so the output exceeds the cap on each.
    many = sql_for(db_url, updates, updates, "; ".join(["PRINT 'one more row'"] * 20))
    first = sql_for(db_url, "(1 row(s) affected)", "(1 row(s) affected)", "one more row")
    agent = agent_factory({"chatty": {"SCHEDULE": _once(), "STEPS__1__COMMAND": many}},
                          AGENT_STEP_OUTPUT_MAX_BYTES="50")
    execute(agent, "CREATE TABLE items (n INT)")
    execute(agent, "INSERT INTO items VALUES (1)")
    agent.tick(datetime.now(UTC))
    work(agent)
    _, ((_, _, output),) = _outputs(agent, "chatty")
    kept, note = output.rsplit("\n", 1)
    assert len(kept.encode()) <= 50 and kept.startswith(first)
    assert note.startswith("[output cut at 50 bytes of ")


def test_cap_never_splits_a_character():
    text = cap_output(["é" * 10], 5)
    assert text.splitlines()[0] == "éé" and text.endswith("[output cut at 5 bytes of 20]")
    assert cap_output([], 10) is None and cap_output(["ok"], 10) == "ok"


def test_step_events_carry_the_step_and_its_output(db_url, appinsights_endpoint):
    agent = make_agent(db_url, {"nightly": {"SCHEDULE": _once(), "STEPS__1__COMMAND": "UPDATE items SET n = n + 1",
                                            "STEPS__2__COMMAND": "SELECT * FROM no_such_table",
                                            "STEPS__2__MAX_ATTEMPTS": "1",
                                            "STEPS__2__ON_FAILURE": "quit_success"}},
                       APPLICATIONINSIGHTS_CONNECTION_STRING=appinsights_endpoint.connection_string)
    try:
        execute(agent, "CREATE TABLE items (n INT)")
        execute(agent, "INSERT INTO items VALUES (1)")
        agent.tick(datetime.now(UTC))
        work(agent)
        agent.telemetry.flush()
        events = appinsights_endpoint.events()
        named = {name: [e["data"]["baseData"]["properties"] for e in events
                        if e["data"]["baseData"].get("name") == name]
                 for name in ("StepSucceeded", "StepFailed", "RunSucceeded")}
        (succeeded,) = named["StepSucceeded"]
        assert succeeded["step"] == "1" and succeeded["output"] == "(1 row(s) affected)"
        (failed,) = named["StepFailed"]
        assert failed["step"] == "2" and "no_such_table" in failed["error_message"]
        assert len(named["RunSucceeded"]) == 1   # the flow's outcome: quit_success on failure
    finally:
        agent.close()


def test_notices_the_postgresql_driver_cuts_are_recorded_as_cut(pg_url):
    """psqlODBC keeps about 32 KB of one statement's notices (a 16-bit length) and drops the rest
    without an error: a step whose notices reach that size says its output was cut, and one that
    stays under it does not."""
    chatty = "DO $$ BEGIN FOR i IN 1..{n} LOOP RAISE NOTICE '%', repeat('x', 100); END LOOP; END $$"
    agent = make_agent(pg_url, {"big": {"SCHEDULE": _once(), "COMMAND": chatty.format(n=300)},
                                "small": {"SCHEDULE": _once(), "COMMAND": chatty.format(n=30)}},
                       AGENT_STEP_OUTPUT_MAX_BYTES="1000000")
    try:
        agent.tick(datetime.now(UTC))
        work(agent)
        _, ((_, outcome, big),) = _outputs(agent, "big")
        assert outcome == "succeeded"
        assert any(line.startswith("[output cut by the PostgreSQL ODBC driver after 3") for line in big.splitlines())
        assert big.count("NOTICE:") >= 250
        _, ((_, _, small),) = _outputs(agent, "small")
        assert small.count("NOTICE:") == 30 and "output cut" not in small
    finally:
        agent.close()
