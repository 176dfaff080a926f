"""A job's (or a step's) SQL may not end the transaction the agent runs it in (issue 23): a
COMMIT in a failing step committed its work once per attempt on PostgreSQL. Refused on every
dialect, before it takes effect: SQLite by an authorizer (its own parser decides), PostgreSQL by
reading the script with PostgreSQL's lexical rules (and a check afterwards that the transaction
is still the agent's), SQL Server by one more nested transaction (a COMMIT only decrements
@@TRANCOUNT; parse-level test here, no SQL Server on this machine). Nothing the refused attempts
did is kept, whatever the spelling."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from shared.control.store import mssql_job_batch
from shared.control.transaction_control import postgres_transaction_statement
from tests.support.harness import db_dialect, execute, make_agent, query, sql_for, work

UTC = timezone.utc

# Spellings of a statement that ends (or takes over) the transaction, per dialect; each with an
# INSERT before it and an error after it, as the failing step of the issue.
COMMON_ENDINGS = ["COMMIT", "commit", "END", "END TRANSACTION", "/* the end */ COMMIT", "-- done\nCOMMIT",
                  "ROLLBACK", "BEGIN", "COMMIT TRANSACTION"]
ENDINGS = {"sqlite": COMMON_ENDINGS + ["BEGIN IMMEDIATE", "ROLLBACK TRANSACTION"],
           "postgres": COMMON_ENDINGS + ["commit work", "ABORT", "COMMIT AND CHAIN", "START TRANSACTION",
                                         "PREPARE TRANSACTION 'x'"],
           # T-SQL: the job runs nested one transaction deeper (mssql_job_batch), so a COMMIT only
           # decrements @@TRANCOUNT, a ROLLBACK undoes the job's work with the agent's.
           "mssql": ["COMMIT", "commit", "COMMIT TRANSACTION", "COMMIT TRAN", "COMMIT WORK", "/* the end */ COMMIT",
                     "-- done\nCOMMIT", "ROLLBACK", "ROLLBACK TRANSACTION", "BEGIN TRANSACTION"]}


def _table(agent) -> None:
    execute(agent, "CREATE TABLE items (n INT)")


def test_a_step_that_commits_then_fails_keeps_nothing_on_any_attempt(agent_factory, db_url):
    dialect = db_dialect(db_url)
    endings = ENDINGS[dialect]
    jobs = {f"j{i}": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "2",
                      "STEPS__1__COMMAND": f"INSERT INTO items (n) VALUES ({i});\n{ending};\nSELECT * FROM no_such_table",
                      "STEPS__1__MAX_ATTEMPTS": "2", "STEPS__1__RETRY_INTERVAL_SECONDS": "0"}
            for i, ending in enumerate(endings)}
    agent = agent_factory(jobs, AGENT_RETRY_BACKOFF_SECONDS="0")
    _table(agent)
    agent.tick(datetime.now(UTC))
    work(agent, concurrency=2)
    assert query(agent, "SELECT COUNT(*) FROM items") == [(0,)], query(agent, "SELECT n FROM items")
    runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=50).rows}
    for i, ending in enumerate(endings):
        run = runs[f"j{i}"]
        assert run["status"] == "failed", (ending, run)
        if dialect != "mssql":
            # Refused before it runs. T-SQL runs it nested (the COMMIT commits nothing) and fails
            # on the error after it: nothing kept all the same (the count above).
            assert "may not end the agent's transaction" in (run["last_error"] or ""), (ending, run["last_error"])


def test_a_step_that_commits_and_ends_well_fails_naming_the_rule(agent_factory, db_url):
    """A job whose last statement ends or begins a transaction, with no error after it, fails with
    the rule in words and keeps nothing: refused before it runs on PostgreSQL and SQLite; on T-SQL
    caught when sp_executesql returns with another @@TRANCOUNT (SQL Server's error 266, Babelfish's
    words for it), the job having run one transaction deeper."""
    jobs = {f"j{i}": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1",
                      "COMMAND": f"INSERT INTO items (n) VALUES ({i});\n{ending}"}
            for i, ending in enumerate(["COMMIT", "COMMIT TRANSACTION", "ROLLBACK", "BEGIN TRANSACTION"])}
    agent = agent_factory(jobs)
    _table(agent)
    agent.tick(datetime.now(UTC))
    work(agent, concurrency=2)
    assert query(agent, "SELECT COUNT(*) FROM items") == [(0,)], query(agent, "SELECT n FROM items")
    runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=50).rows}
    for name in jobs:
        assert runs[name]["status"] == "failed", runs[name]
        assert "may not end the agent's transaction" in (runs[name]["last_error"] or ""), runs[name]["last_error"]


def test_savepoints_stay_allowed_and_a_clean_step_commits_with_the_agent(agent_factory, db_url):
    savepoints = ("INSERT INTO items (n) VALUES (1);\nSAVEPOINT s;\nINSERT INTO items (n) VALUES (2);\n"
                  "ROLLBACK TO SAVEPOINT s;\nRELEASE SAVEPOINT s;\nINSERT INTO items (n) VALUES (3)")
    command = sql_for(db_url, savepoints, savepoints,
                      mssql="INSERT INTO items (n) VALUES (1);\nSAVE TRANSACTION s;\nINSERT INTO items (n) VALUES (2);\n"
                            "ROLLBACK TRANSACTION s;\nINSERT INTO items (n) VALUES (3)")
    agent = agent_factory({"fine": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": command}})
    _table(agent)
    agent.tick(datetime.now(UTC))
    work(agent)
    assert sorted(query(agent, "SELECT n FROM items")) == [(1,), (3,)]
    (run,) = agent.store().execute("list_history", job_name="fine", limit=1).rows
    assert run["status"] == "succeeded"


def test_a_job_that_changes_its_session_settings_is_not_taken_for_one_that_ended_its_transaction(pg_url):
    agent = make_agent(pg_url, {"settings": {
        "SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1",
        "COMMAND": "SET TIME ZONE 'Pacific/Chatham'; SET DateStyle = 'German, DMY'; SET extra_float_digits = -15; "
                   "SET intervalstyle = 'sql_standard'; INSERT INTO items VALUES (1)"}})
    try:
        _table(agent)
        agent.tick(datetime.now(UTC))
        work(agent)
        (run,) = agent.store().execute("list_history", job_name="settings", limit=1).rows
        assert run["status"] == "succeeded", run["last_error"]
        assert query(agent, "SELECT n FROM items") == [(1,)]
    finally:
        agent.close()


def test_the_refusal_comes_before_any_of_the_sql_runs_and_text_that_only_mentions_commit_runs(agent_factory, db_url):
    quoted = sql_for(db_url, "INSERT INTO items (n) SELECT length('; COMMIT') /* COMMIT; */",
                     "INSERT INTO items (n) SELECT length($q$; COMMIT$q$) + length(E'\\'; COMMIT') /* COMMIT; /* nested; COMMIT */ */",
                     mssql="INSERT INTO items (n) SELECT LEN(N'; COMMIT') /* COMMIT; /* nested; COMMIT */ */")
    agent = agent_factory({
        "mentions": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": quoted},
        "ends": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1",
                 "COMMAND": "INSERT INTO items (n) VALUES (100); COMMIT"},
    })
    _table(agent)
    agent.tick(datetime.now(UTC))
    work(agent)
    runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=5).rows}
    assert runs["mentions"]["status"] == "succeeded", runs["mentions"]
    # PostgreSQL and SQLite refuse it before it runs; T-SQL runs it nested and fails the attempt.
    refusal = "may not end the agent's transaction" if db_dialect(db_url) == "mssql" else "'COMMIT' is refused"
    assert runs["ends"]["status"] == "failed" and refusal in runs["ends"]["last_error"]
    assert 100 not in [n for (n,) in query(agent, "SELECT n FROM items")]


def test_postgres_procedures_and_do_blocks_cannot_commit_the_agents_transaction(pg_url):
    agent = make_agent(pg_url, {"proc": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1",
                                    "COMMAND": "CALL commits_inside()"},
                           "do": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1",
                                  "COMMAND": "DO $$ BEGIN INSERT INTO items VALUES (6); COMMIT; END $$"},
                           "dyn": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1",
                                   "COMMAND": "DO $$ BEGIN INSERT INTO items VALUES (7); EXECUTE 'COMMIT'; END $$"}})
    _table(agent)
    try:
        execute(agent, "CREATE PROCEDURE commits_inside() LANGUAGE plpgsql AS $$ BEGIN "
                       "INSERT INTO items VALUES (5); COMMIT; END $$")
        agent.tick(datetime.now(UTC))
        work(agent)
        assert query(agent, "SELECT COUNT(*) FROM items") == [(0,)]
        runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=5).rows}
        for name in ("proc", "do"):
            assert runs[name]["status"] == "failed" and "invalid transaction termination" in runs[name]["last_error"]
        assert runs["dyn"]["status"] == "failed"
        assert "EXECUTE of transaction commands is not implemented" in runs["dyn"]["last_error"]
    finally:
        agent.close()


@pytest.mark.parametrize("sql, refused", [
    ("SELECT 1", None),
    ("COMMIT", "COMMIT"),
    ("select 1; commit;", "commit"),
    ("END TRANSACTION", "END TRANSACTION"),
    ("ROLLBACK PREPARED 'x'", "ROLLBACK PREPARED '"),
    ("ROLLBACK TO SAVEPOINT s", None),
    ("ROLLBACK WORK TO s", None),
    ("PREPARE q AS SELECT 1", None),
    ("PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION '"),
    ("START TRANSACTION ISOLATION LEVEL SERIALIZABLE", "START TRANSACTION ISOLATION"),
    ("SELECT 'it''s; COMMIT'", None),
    ("SELECT E'\\'; COMMIT; '", None),
    ("SELECT \"COMMIT\" FROM t; ", None),
    ("SELECT $$;COMMIT;$$, $tag$ $$ ; COMMIT $tag$", None),
    ("SELECT 1 /* a /* nested; */ COMMIT; */; SELECT 2", None),
    ("SELECT 1 -- ; COMMIT\n; SELECT 2", None),
    ("SELECT $1; COMMIT", "COMMIT"),
    ("SELECT 1\n/* x */ COMMIT", None),            # one statement: SELECT 1 COMMIT (an alias): not a COMMIT
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT CASE WHEN true THEN 2 END; END; SELECT f()", None),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; END", "END"),
    ("DO $$ BEGIN COMMIT; END $$", None),            # the server refuses it inside the agent's transaction
    ("ABORT", "ABORT"),
    ("BEGIN; SELECT 1", "BEGIN"),
    ("\ufeffCOMMIT", None),                          # not a keyword to PostgreSQL either: a syntax error there
])
def test_the_postgres_reader_finds_top_level_transaction_statements_only(sql, refused):
    assert postgres_transaction_statement(sql) == refused


def test_the_tsql_batch_nests_the_job_and_parses():
    from sqlfluff.core import FluffConfig, Linter

    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql", "large_file_skip_byte_limit": 0}))
    for principal in (None, "agent_jobs"):
        batch = mssql_job_batch(principal)
        # The job's one parameter, as sp_executesql receives it; the nesting around it.
        assert batch.count("?") == 1
        # The job's SQL runs with NOCOUNT OFF (its row counts are its output) in a scope of its
        # own, which ends with the call: the agent's statements after it keep NOCOUNT ON.
        before, after = batch.split("EXEC sp_executesql N'SET NOCOUNT OFF; EXEC sp_executesql @agent_job;', "
                                    "N'@agent_job NVARCHAR(MAX)', @agent_job = ?;")
        assert "BEGIN TRANSACTION;" in before and "SET @agent_trancount = @@TRANCOUNT;" in before
        assert after.index("IF @@TRANCOUNT <> @agent_trancount THROW 50002") < after.index("COMMIT TRANSACTION;")
        # sqlfluff knows no EXECUTE AS ... WITH COOKIE / REVERT WITH COOKIE: the rest must parse.
        lines = [line for line in batch.replace("?", "@job_sql").splitlines()
                 if not line.startswith(("EXECUTE AS USER", "REVERT WITH COOKIE"))]
        parsed = linter.parse_string("\n".join(lines))
        assert not parsed.violations and "unparsable" not in parsed.tree.stringify(), parsed.violations


# What a job may write to end the agent's transaction in one message, were the reader blind to
# it: the check must tell each from a job that ran in the agent's transaction to its end. A
# transaction chained to the one the job ended starts at the same statement time (one message).
PAST_THE_READER = {"commit": ("COMMIT", [(1,), (2,)]), "rollback": ("ROLLBACK", [(2,)]),
                   "commit_and_chain": ("COMMIT AND CHAIN", [(1,)]), "rollback_and_chain": ("ROLLBACK AND CHAIN", []),
                   "end": ("END", [(1,), (2,)]), "abort": ("ABORT", [(2,)])}


@pytest.mark.parametrize("queue_mode", [False, True], ids=["direct", "queue"])
@pytest.mark.parametrize("shape", ["command", "step"])
@pytest.mark.parametrize("ending", sorted(PAST_THE_READER))
def test_a_commit_past_the_reader_still_fails_the_attempt_at_its_completion(pg_url, monkeypatch, shape, queue_mode,
                                                                            ending):
    """Defence in depth: were the reader ever blind to a COMMIT (here it is made so), the job's SQL
    ends the agent's transaction and the completion must not record a success in the transaction
    that follows, a chained one included. The check runs in the completion's own batch
    (check_work_transaction, issue 35: it was a round trip of its own) and compares transaction
    ids: the attempt fails naming the rule, and what the SQL committed before that stays
    committed, as the message says; what ran after it in a transaction of its own is kept too
    (the rest of a message runs in an implicit transaction), what ran in a chained one is not."""
    from shared.messaging.memory import MemoryQueue

    monkeypatch.setattr("shared.control.store.postgres_transaction_statement", lambda sql: None)
    statement, kept = PAST_THE_READER[ending]
    # public.items, qualified: the job's search_path is its transaction's (store.JOB_SEARCH_PATH),
    # so after the job's own ROLLBACK an unqualified name resolves through the agent's pinned
    # path, or not, depending on whether the server replans the statement (a cache invalidation
    # from any other session forces it): a race of no interest here, where what is checked is
    # the transaction check, not name resolution.
    command = f"INSERT INTO public.items VALUES (1); {statement}; INSERT INTO public.items VALUES (2)"
    job = {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "MAX_ATTEMPTS": "1"}
    job.update({"COMMAND": command} if shape == "command" else
               {"STEPS__1__COMMAND": command, "STEPS__2__COMMAND": "INSERT INTO public.items VALUES (3)"})
    agent = make_agent(pg_url, {"past": job}, queue=MemoryQueue() if queue_mode else None)
    try:
        _table(agent)
        agent.tick(datetime.now(UTC))
        work(agent)
        (run,) = agent.store().execute("list_history", job_name="past", limit=5).rows
        assert run["status"] == "failed", run
        assert "the job's SQL ended the agent's transaction" in run["last_error"], run["last_error"]
        assert query(agent, "SELECT n FROM items ORDER BY n") == kept               # no step 2, nothing more
        attempts = query(agent, f"SELECT outcome FROM agent.attempts WHERE run_id = {run['run_id']}")
        assert attempts == [("failed",)], attempts
    finally:
        agent.close()


def test_the_tsql_run_job_procedure_is_the_batch_of_a_job_without_principal():
    """Most runs (no owner, no AGENT_JOB_PRINCIPAL, no parameters) send EXEC agent.run_job ?
    (migration 0023, issue 35): its body is mssql_job_batch(None), statement for statement, but
    for the lock timeout the batch set back at its end (a procedure's SET ends with it)."""
    from shared.control.queries import load_migrations
    from shared.control.store import TSQL_RUN_JOB

    assert TSQL_RUN_JOB == "EXEC agent.run_job ?;"
    created = [s for m in load_migrations("mssql") for s in m.statements() if "CREATE PROCEDURE agent.run_job" in s]
    assert len(created) == 1
    body = created[0].split("\nBEGIN\n", 1)[1].rsplit("\nEND", 1)[0]
    procedure = [line.strip() for line in body.splitlines() if line.strip()]
    batch = [line.strip() for line in mssql_job_batch(None).replace("@agent_job = ?", "@agent_job = @agent_job")
             .splitlines() if line.strip() and line.strip() != "SET LOCK_TIMEOUT 30000;"]
    assert procedure == batch
