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


# A DO block raising notices: n of `width` characters (after a numbered "small" ones when given).
def _chatty(n: int, width: int, small: int = 0) -> str:
    return ("DO $$ BEGIN FOR i IN 1..%d LOOP RAISE NOTICE 'small %%', i; END LOOP; "
            "FOR i IN 1..%d LOOP RAISE NOTICE '%%', rpad(i::text, %d, 'x'); END LOOP; END $$") % (small, n, width)


# (job SQL, notices that arrive whole (None: some are cut), whether the note is expected)
NOTICE_CASES = {
    # psqlODBC's 16-bit length wraps: 600 notices (65,399 characters) arrive as none or a few.
    "600 notices": (_chatty(600, 100), None, True),
    # One notice past 32 KB: nothing arrives (40,000) or its first 4,472 characters (70,000).
    "one 40,000-character notice": (_chatty(1, 40_000), None, True),
    "one 70,000-character notice": (_chatty(1, 70_000), None, True),
    "many small and one big": (_chatty(1, 40_000, small=50), None, True),
    # A procedure's, and a batch's last statement's.
    "a procedure's 600 notices": ("CALL chatty_procedure(600)", None, True),
    "after other statements": ("CREATE TEMP TABLE scratch (x int); INSERT INTO scratch VALUES (1); "
                               + _chatty(600, 100), None, True),
    # Just under the driver's limit (32,699 characters): every notice arrives, nothing to say.
    "300 notices": (_chatty(300, 100), 300, False),
    "30 notices": (_chatty(30, 100), 30, False),
}


def _job(case: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in case)


def test_notices_the_postgresql_driver_drops_are_recorded_as_cut_with_what_was_kept(pg_url):
    """psqlODBC drops a statement's notices past 32 KB without an error, and its length field wraps,
    so the size of what arrived says nothing (600 notices arrive as 2, or none): the agent ends the
    batch with a notice of its own, and when that did not arrive says the output was cut and how
    many notices and characters it kept (issue 34, item 10). Each notice is one line."""
    agent = make_agent(pg_url, {_job(name): {"SCHEDULE": _once(), "COMMAND": sql}
                                for name, (sql, _, _) in NOTICE_CASES.items()},
                       AGENT_STEP_OUTPUT_MAX_BYTES="1000000")
    execute(agent, "CREATE PROCEDURE chatty_procedure(n int) LANGUAGE plpgsql AS $$ BEGIN FOR i IN 1..n LOOP "
                   "RAISE NOTICE '%', rpad(i::text, 100, 'x'); END LOOP; END $$")
    try:
        agent.tick(datetime.now(UTC))
        work(agent)
        for name, (_, whole, cut) in NOTICE_CASES.items():
            run, ((_, outcome, output),) = _outputs(agent, _job(name))
            assert outcome == "succeeded", (name, run)
            lines = (output or "").splitlines()
            notices = [line for line in lines if line.startswith("NOTICE: ")]
            notes = [line for line in lines if line.startswith("[output cut")]
            assert not any("agent-output-end" in line for line in lines), name
            if cut:
                (note,) = notes
                assert note.startswith("[output cut by the PostgreSQL ODBC driver"), (name, note)
                kept = sum(len(line) for line in notices)
                assert f" {len(notices)} notice(s) of {kept} characters kept" in note, (name, note, len(notices))
                assert lines[-1] == note, name
            else:
                assert notes == [] and len(notices) == whole, (name, len(notices), notes)
                assert notices[-1].startswith(f"NOTICE: {whole}x") and len(notices[-1]) == len("NOTICE: ") + 100
    finally:
        agent.close()


def test_a_job_run_as_its_owner_says_when_its_notices_were_cut(pg_url):
    """The same for a job that runs as the principal that defined it (its SQL runs inside a
    function of that owner's): 600 notices get the note, 30 arrive whole without it."""
    import uuid

    from tests.support.harness import pg_admin_connection

    agent = make_agent(pg_url, AGENT_STEP_OUTPUT_MAX_BYTES="1000000")
    role = f"owner_{uuid.uuid4().hex[:8]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{role}"')
    try:
        store = agent.store()
        for sql, cut, whole in ((_chatty(600, 100), True, None), (_chatty(30, 100), False, 30)):
            with store.transaction(immediate=False):
                output = store.run_script(sql, owner=role)
            notices = [line for line in output if line.startswith("NOTICE: ")]
            notes = [line for line in output if line.startswith("[output cut")]
            if cut:
                assert len(notes) == 1 and notes[0].startswith("[output cut by the PostgreSQL ODBC driver"), output[-3:]
            else:
                assert notes == [] and len(notices) == whole, output[-3:]
    finally:
        agent.close()
        execute(make_agent(pg_url), f'DROP OWNED BY "{role}"')
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{role}"')
        admin.close()


def test_output_exactly_at_the_cap_is_whole_and_one_byte_over_is_cut(db_url):
    """AGENT_STEP_OUTPUT_MAX_BYTES: output of exactly that many bytes is kept without a note; one
    byte more is cut with `[output cut at N bytes of M]`, on every dialect (SQLite's row counts,
    PostgreSQL's notices and row counts)."""
    # (Not a DO block on PostgreSQL: psqlODBC reports a DO's row count as whatever its memory held.)
    command = sql_for(db_url, "UPDATE items SET n = n + 1; UPDATE items SET n = n + 1",
                      "SELECT say('héllo ✓'); UPDATE items SET n = n + 1",
                      "PRINT N'héllo ✓'; UPDATE items SET n = n + 1")
    measured = make_agent(db_url, {"measure": {"SCHEDULE": _once(), "COMMAND": command}})
    if measured.target.dialect == "postgres":
        execute(measured, "CREATE FUNCTION say(t text) RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
                          "RAISE NOTICE '%', t; RETURN 1; END $$")
    execute(measured, "CREATE TABLE items (n INT)")
    execute(measured, "INSERT INTO items VALUES (1)")
    measured.tick(datetime.now(UTC))
    work(measured)
    _, ((_, _, whole),) = _outputs(measured, "measure")
    size = len(whole.encode("utf-8"))
    assert "[output cut" not in whole and size > 10
    if measured.target.dialect == "postgres":
        assert "NOTICE: héllo ✓" in whole.splitlines()
    measured.close()
    for cap, cut in ((size, False), (size - 1, True)):
        agent = make_agent(db_url, {f"cap_{cap}": {"SCHEDULE": _once(), "COMMAND": command}},
                           AGENT_STEP_OUTPUT_MAX_BYTES=str(cap))
        agent.tick(datetime.now(UTC))
        work(agent)
        _, ((_, _, output),) = _outputs(agent, f"cap_{cap}")
        if cut:
            assert output.endswith(f"\n[output cut at {cap} bytes of {size}]"), output
        else:
            assert output == whole
        agent.close()
