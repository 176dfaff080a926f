"""Azure SQL hardening, proven on the real stand-ins (PostgreSQL has its own version of each
SQL Server failure; the T-SQL is parsed and in the conformance suite):

* a job cannot disturb the agent's session (settings, role, temporary tables, cursors);
* an error raised while a result set is fetched fails the job (never recorded as succeeded);
* locks in one order (runs first), and agent statements wait 30 s for a lock at most;
* triggers on agent tables break nothing;
* the first install is serialised by a lock that is really taken;
* history is kept for AGENT_HISTORY_RETENTION_DAYS, purged in small batches by the tick;
* connections retried as long as Azure needs;
* a job cannot rewrite the agent's bookkeeping (it runs as AGENT_JOB_PRINCIPAL);
* status values are checked by the database; run-now's overlap check is under the start lock.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timezone

import pytest

from tests.support.harness import ROOT, Clock, at, attempts_table, create_pg_database, drop_pg_database, execute, make_agent, query, runs_table, work

UTC = timezone.utc


def submit(agent, sql: str, **extra):
    from shared.telemetry.client import new_operation_id

    values = dict(command=sql, target_database=None, task_order=None, max_attempts=1, timeout_seconds=60,
                  lease_seconds=60, now=agent.clock(), operation_id=new_operation_id())
    values.update(extra)
    return agent.store().execute("insert_task", **values).one()["run_id"]


def run_of(agent, run_id):
    return agent.store().execute("get_run", run_id=run_id).one()


def clean_env() -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_", "AzureWebJobsStorage"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


# ---------------------------------------------------------------- the first install


def _race_init_db(db_url: str, processes: int = 6) -> None:
    start_at = time.time() + 2.5
    # Everything loaded and connected first; then all start init-db in the same millisecond.
    code = ("import time, sys\n"
            "from shared.engine.agent import Agent\n"
            "from shared.settings import load_settings\n"
            f"agent = Agent(load_settings(environ={{}}), db={db_url!r})\n"
            "agent.store().connection\n"
            f"time.sleep(max(0, {start_at} - time.time()))\n"
            "before, after = agent.init()\n"
            "print('upgraded from version 0' if before == 0 else 'nothing to do')\n")
    running = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in running]
    assert all(code == 0 for code, _, _ in results), results
    upgraded = [out for _, out, _ in results if "upgraded from version 0" in out]
    assert len(upgraded) == 1, results
    agent = make_agent(db_url)
    table = "agent_schema_version" if agent.target.dialect == "sqlite" else "agent.schema_version"
    versions = [v for (v,) in query(agent, f"SELECT version FROM {table} ORDER BY version")]
    assert versions == list(range(1, agent.store().latest_version() + 1))
    agent.close()


def test_concurrent_first_init_db_runs_all_succeed(db_url):
    """Six init-db processes on an empty database at once: one creates the schema, the others
    wait on the migration lock and find it done. (Without the lock, PostgreSQL's CREATE ... IF
    NOT EXISTS races on its catalog; the race is rare, so PostgreSQL gets three fresh rounds.)"""
    _race_init_db(db_url)
    if db_url.startswith("sqlite"):
        return
    for _ in range(2):
        name, url = create_pg_database()
        try:
            _race_init_db(url)
        finally:
            drop_pg_database(name)


# ---------------------------------------------------------------- a job's session is its own


def test_a_jobs_session_changes_end_with_the_job(pg_url):
    """One worker, one connection: a job that changes the session (statement timeout, search
    path, isolation level, role, a temporary table, an open cursor, a listener, an advisory lock)
    leaves nothing behind for the agent's own statements or for the next job."""
    agent = make_agent(pg_url)
    execute(agent, "CREATE TABLE seen (label VARCHAR(20), timeout VARCHAR(20), path VARCHAR(200), "
                   "isolation VARCHAR(40), who VARCHAR(60))")
    execute(agent, "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agent_test_other') "
                   "THEN CREATE ROLE agent_test_other; END IF; END$$")
    execute(agent, "GRANT INSERT ON seen TO agent_test_other")
    record = ("INSERT INTO seen VALUES ('{label}', current_setting('statement_timeout'), "
              "current_setting('search_path'), current_setting('default_transaction_isolation'), current_user)")
    meddler = ("SET statement_timeout = '2s'; SET search_path = nowhere; "
               "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE; "
               "CREATE TEMP TABLE scratch (x INT); DECLARE c CURSOR WITH HOLD FOR SELECT 1; "
               "LISTEN something; SELECT pg_advisory_lock(42); SET ROLE agent_test_other; "
               + record.format(label="meddler").replace("INSERT INTO seen", "INSERT INTO public.seen"))
    first = submit(agent, meddler)
    second = submit(agent, "CREATE TEMP TABLE scratch (x INT); " + record.format(label="next"))
    work(agent, concurrency=1)
    assert run_of(agent, first)["status"] == "succeeded"
    assert run_of(agent, second)["status"] == "succeeded", run_of(agent, second)["last_error"]
    rows = {label: rest for label, *rest in query(agent, "SELECT * FROM seen")}
    assert rows["meddler"][3] == "agent_test_other"                      # it did change its session
    assert rows["next"] == ["0", '"$user", public', "read committed", "root"]   # the next job did not see it
    # The agent's session after both: its own lock timeout, nothing of the job's.
    store = agent.store()
    cursor = store.connection.cursor()
    cursor.execute("SELECT current_setting('lock_timeout'), current_user, "
                   "(SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())")
    assert tuple(cursor.fetchone()) == ("30s", "root", 0)
    agent.close()
    execute(make_agent(pg_url), "DROP OWNED BY agent_test_other; DROP ROLE agent_test_other")


def test_a_jobs_search_path_is_the_databases_read_at_most_a_minute_before(pg_url, monkeypatch):
    """The job's SQL gets the search_path the database's and role's settings give (the agent's own
    sessions are pinned): looked up in the catalogs on a store's first run, then sent as the value
    it gave for JOB_SEARCH_PATH_MAX_AGE seconds (the lookup's planning was a tenth of the server's
    time a run, issue 35), then looked up again. A path whose names hold quotes, dollar signs, a
    parameter marker, an ODBC escape and a comment arrives as it was set."""
    from shared.control import store as store_module
    from tests.support.harness import admin_execute
    from tests.support.round_trips import Tally, count_connections

    agent = make_agent(pg_url)
    database = query(agent, "SELECT current_database()")[0][0]
    execute(agent, "CREATE TABLE public.paths (label VARCHAR(20), path VARCHAR(200))")
    record = "INSERT INTO public.paths VALUES ('{label}', current_setting('search_path'))"

    def set_path(path: str) -> None:
        admin_execute(pg_url, f"ALTER DATABASE {database} SET search_path = {path}")

    def run(label: str) -> None:
        run_id = submit(agent, record.format(label=label))
        work(agent, concurrency=1)
        assert run_of(agent, run_id)["status"] == "succeeded", run_of(agent, run_id)["last_error"]

    def seen(label: str) -> str:
        return dict(query(agent, "SELECT label, path FROM public.paths"))[label]

    hostile = '"a$p$b", "it\'s $p1$", "q?{fn now()};--", public'
    set_path(hostile)
    tally = Tally()
    count_connections(agent, tally)
    for index in range(3):
        run(f"first{index}")
    assert {seen(f"first{index}") for index in range(3)} == {hostile}
    lookups = sum("pg_db_role_setting" in statement for statement in tally.statements)
    assert lookups == 1, f"the catalogs were read {lookups} times for 3 runs in a minute"

    set_path("public")
    run("kept")
    assert seen("kept") == hostile           # read less than JOB_SEARCH_PATH_MAX_AGE ago
    monkeypatch.setattr(store_module, "JOB_SEARCH_PATH_MAX_AGE", 0.0)
    run("again")
    assert seen("again") == "public"         # older than that: read again
    agent.close()


def test_an_error_raised_while_a_result_set_is_fetched_fails_the_job(pg_url):
    """With the driver fetching incrementally, a division by zero in the middle of a result set
    is raised by the fetch, not by the execute: the job failed (never recorded as succeeded)."""
    url = pg_url + "UseDeclareFetch=1;Fetch=1;"
    agent = make_agent(url)
    execute(agent, "CREATE TABLE after_fetch (x INT)")
    alone = submit(agent, "SELECT 1 / (5 - x) FROM generate_series(1, 10) AS x")
    then_insert = submit(agent, "SELECT 1 / (5 - x) FROM generate_series(1, 10) AS x; INSERT INTO after_fetch VALUES (1)")
    work(agent)
    for run_id in (alone, then_insert):
        run = run_of(agent, run_id)
        assert run["status"] == "failed" and "division by zero" in run["last_error"], run
    assert query(agent, "SELECT COUNT(*) FROM after_fetch") == [(0,)]
    agent.close()


def test_reading_the_results_raises_what_the_fetch_raises(pg_url):
    """The reading of a job's results on its own, on a cursor the driver fetches one row at a
    time: the error arrives with the fifth row, from fetchall(), and is raised."""
    import pyodbc

    from shared.control.store import drain_results

    connection = pyodbc.connect(pg_url + "UseDeclareFetch=1;Fetch=1;", autocommit=False)
    try:
        cursor = connection.cursor()
        cursor.execute("SELECT 1 / (5 - x) FROM generate_series(1, 10) AS x")   # no error yet
        with pytest.raises(pyodbc.Error, match="division by zero"):
            drain_results(cursor)
    finally:
        connection.close()


# ---------------------------------------------------------------- connections retried as long as needed


def test_connecting_waits_out_a_database_that_refuses_connections(pg_url):
    """The control database refuses connections for 3 s (a serverless database resuming): the
    agent keeps trying within AGENT_CONNECT_RETRY_SECONDS and gets in; with a budget shorter
    than the outage it gives up with one line naming the database and the SQLSTATE."""
    from shared.errors import ConnectError
    from tests.support.faults import OutageProxy

    make_agent(pg_url).close()
    proxy = OutageProxy()
    database = pg_url.split("Database=")[1].rstrip(";")
    try:
        proxy.outage()
        threading.Timer(3, proxy.restore).start()
        started = time.monotonic()
        agent = make_agent(proxy.connection_string(database))
        assert 2.5 < time.monotonic() - started < 30
        assert agent.store().execute("count_runs_by_status").rows == []
        agent.close()

        proxy.outage()
        started = time.monotonic()
        with pytest.raises(ConnectError) as raised:
            make_agent(proxy.connection_string(database), AGENT_CONNECT_RETRY_SECONDS="1")
        assert time.monotonic() - started < 10
        assert "cannot connect to" in str(raised.value) and "Connection refused" in str(raised.value)
        assert "SQLSTATE 08001" in str(raised.value)
    finally:
        proxy.close()


# ---------------------------------------------------------------- a job cannot rewrite the bookkeeping


def test_a_job_runs_as_the_job_principal_and_cannot_write_the_agents_tables(pg_url):
    """AGENT_JOB_PRINCIPAL=a role with no rights on schema agent: a job's own work (on a table
    granted to the role) succeeds; a job that writes agent.runs fails with permission denied,
    and the run records it; the agent's own bookkeeping is untouched by either."""
    admin = make_agent(pg_url)
    execute(admin, "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agent_test_job') "
                   "THEN CREATE ROLE agent_test_job NOLOGIN; END IF; END$$")
    execute(admin, "CREATE TABLE work_done (x INT)")
    execute(admin, "GRANT INSERT, SELECT ON work_done TO agent_test_job")
    admin.close()
    agent = make_agent(pg_url, AGENT_JOB_PRINCIPAL="agent_test_job")
    try:
        good = submit(agent, "INSERT INTO work_done SELECT CASE WHEN current_user = 'agent_test_job' THEN 1 ELSE 0 END")
        bad = submit(agent, "UPDATE agent.runs SET status = 'succeeded', note = 'forged' WHERE status <> 'succeeded'")
        work(agent, concurrency=1)
        assert run_of(agent, good)["status"] == "succeeded"
        assert query(agent, "SELECT x FROM work_done") == [(1,)]            # it ran as the job principal
        forged = run_of(agent, bad)
        assert forged["status"] == "failed" and "permission denied" in forged["last_error"]
        assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE note = 'forged'") == [(0,)]
        cursor = agent.store().connection.cursor()
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] == "root"                               # the agent's session is its own again
    finally:
        agent.close()
        cleanup = make_agent(pg_url)
        execute(cleanup, "DROP OWNED BY agent_test_job; DROP ROLE agent_test_job")
        cleanup.close()


def test_agent_job_principal_is_validated():
    from shared.errors import ConfigError
    from shared.settings import load_settings

    with pytest.raises(ConfigError, match="AGENT_JOB_PRINCIPAL='x\"; DROP': expected a database user or role name"):
        load_settings(environ={"AGENT_JOB_PRINCIPAL": 'x"; DROP'})


# ---------------------------------------------------------------- retention


def run_now(agent, name: str):
    return agent.request_run_now(name)


def _poison(agent, sql: str) -> tuple[int, int]:
    """A run that ended poisoned with its poison message, as the executor leaves them."""
    store = agent.store()
    run_id = submit(agent, sql)
    with store.transaction():
        store.execute("poison_run", run_id=run_id, token=0, now=agent.clock(), reason="test: poisoned",
                      error_number=None, error_sqlstate=None, error_message=None)
        poison_id = store.execute("insert_poison", run_id=run_id, message_id="m", body="{}", dequeue_count=6,
                                  reason="test", errors="[]", now=agent.clock()).one()["poison_id"]
    return run_id, poison_id


def _ids(agent, sql: str) -> set[int]:
    return {row[0] for row in query(agent, sql)}


def test_the_tick_purges_history_past_its_retention_and_keeps_what_is_still_needed(agent_factory, db_url):
    """AGENT_HISTORY_RETENTION_DAYS=1, AGENT_POISON_RETENTION_DAYS=2: a tick a day later purges
    finished runs, their attempts and job events older than a day, but keeps the latest run of
    each job, runs in flight, and a poisoned run whose message has not been requeued (until the
    message itself is purged, a day later)."""
    clock = Clock(at("2026-01-01T00:00:00"))
    agent = agent_factory({"yearly": {"SCHEDULE": "0 0 0 1 6 *", "COMMAND": "SELECT 1"},
                           "broken": {"SCHEDULE": "not a schedule", "COMMAND": "SELECT 1"}},
                          clock=clock, AGENT_HISTORY_RETENTION_DAYS="1", AGENT_POISON_RETENTION_DAYS="2")
    runs, attempts = runs_table(agent), attempts_table(agent)
    events = "agent_job_events" if agent.target.dialect == "sqlite" else "agent.job_events"
    poison = "agent_poison_messages" if agent.target.dialect == "sqlite" else "agent.poison_messages"
    agent.tick()                                           # records the invalid job's event
    old_manual = run_now(agent, "yearly")["run_id"]
    clock.advance(1)
    latest_manual = run_now(agent, "yearly")["run_id"]
    tasks = [submit(agent, "SELECT 1") for _ in range(3)]
    work(agent, concurrency=1)
    poisoned_run, poison_id = _poison(agent, "SELECT 2")
    requeued_run, requeued_poison = _poison(agent, "SELECT 3")
    with agent.store().transaction():
        agent.store().execute("mark_poison_requeued", poison_id=requeued_poison, now=agent.clock())
    assert _ids(agent, f"SELECT COUNT(*) FROM {events}") != {0}
    clock.advance(3600)
    in_flight = submit(agent, "SELECT 1")                  # pending: never purged
    assert len(query(agent, f"SELECT run_id FROM {attempts} WHERE run_id IN ({', '.join(map(str, tasks))})")) == 3

    clock.advance(86400)                                    # a day and an hour later
    report = agent.tick()
    assert not report.errors, report.errors
    left = _ids(agent, f"SELECT run_id FROM {runs}")
    assert old_manual not in left and not set(tasks) & left and requeued_run not in left
    assert {latest_manual, poisoned_run, in_flight} <= left
    assert _ids(agent, f"SELECT run_id FROM {attempts}") <= left
    # The invalid job's event from the first tick is gone; this tick recorded none (nothing changed).
    assert query(agent, f"SELECT COUNT(*) FROM {events} WHERE event_at < '2026-01-01 12:00:00'") == [(0,)]
    assert report.purged["runs"] == 2 + 3 and report.summary()["history_purged"] >= 5
    assert _ids(agent, f"SELECT poison_id FROM {poison}") == {poison_id, requeued_poison}

    clock.advance(86400)                                    # the poison message's two days are over
    agent.tick()
    agent.tick()
    left = _ids(agent, f"SELECT run_id FROM {runs}")
    assert _ids(agent, f"SELECT poison_id FROM {poison}") == set()
    assert poisoned_run not in left and latest_manual in left and in_flight in left


def test_a_tick_purges_a_bounded_batch_and_zero_days_keeps_everything(agent_factory, monkeypatch):
    from shared.engine import scheduler

    clock = Clock(at("2026-01-01T00:00:00"))
    keep = agent_factory(clock=clock, AGENT_HISTORY_RETENTION_DAYS="0", AGENT_POISON_RETENTION_DAYS="0")
    tasks = [submit(keep, "SELECT 1") for _ in range(7)]
    work(keep, concurrency=1)
    clock.advance(400 * 86400)
    assert keep.tick().purged == {}
    assert _ids(keep, f"SELECT run_id FROM {runs_table(keep)}") == set(tasks)

    monkeypatch.setattr(scheduler, "PURGE_BATCH", 3)
    purge = agent_factory(clock=clock, AGENT_HISTORY_RETENTION_DAYS="1")
    counts = [purge.tick().purged.get("runs", 0) for _ in range(4)]
    assert counts == [3, 3, 1, 0]
    assert _ids(purge, f"SELECT run_id FROM {runs_table(purge)}") == set()


# ---------------------------------------------------------------- triggers, constraints, locks


AUDIT_TRIGGERS = """
CREATE TABLE public.agent_audit (tbl TEXT, op TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp());
CREATE FUNCTION public.agent_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.agent_audit (tbl, op) VALUES (TG_TABLE_NAME, TG_OP);
    RETURN COALESCE(NEW, OLD);
END $$;
CREATE TRIGGER audit_runs AFTER INSERT OR UPDATE OR DELETE ON agent.runs FOR EACH ROW EXECUTE FUNCTION public.agent_audit_row();
CREATE TRIGGER audit_attempts AFTER INSERT OR UPDATE OR DELETE ON agent.attempts FOR EACH ROW EXECUTE FUNCTION public.agent_audit_row();
CREATE TRIGGER stamp_jobs BEFORE INSERT OR UPDATE ON agent.jobs FOR EACH ROW EXECUTE FUNCTION public.agent_audit_row();
CREATE TRIGGER audit_events AFTER INSERT ON agent.job_events FOR EACH STATEMENT EXECUTE FUNCTION public.agent_audit_row();
"""


def test_audit_triggers_on_agent_tables_change_nothing_and_doctor_lists_them(pg_url, capsys):
    """A DBA's row and statement triggers (AFTER on runs, attempts and events, BEFORE on jobs)
    on every table the agent writes: ticks, claims, successes, failures with retries, cancels,
    run-now and the purge all behave as without them, and `doctor` names them. (On SQL Server
    the same holds because every statement that returns rows uses OUTPUT ... INTO, which
    test_every_tsql_output_goes_into_a_table_variable checks.)"""
    from shared.cli.commands import main as cli

    clock = Clock(at("2026-03-01T09:59:50"))
    setup = make_agent(pg_url)
    execute(setup, AUDIT_TRIGGERS)
    setup.close()
    agent = make_agent(pg_url, {"every_minute": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"},
                                "bad": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1/0", "MAX_ATTEMPTS": "2"}},
                       clock=clock, AGENT_RETRY_BACKOFF_SECONDS="0", AGENT_HISTORY_RETENTION_DAYS="1")
    try:
        assert not agent.tick().errors
        clock.advance(11)                                   # 10:00:01: both slots are due
        work(agent, concurrency=2)
        statuses = dict(query(agent, "SELECT job_name, status FROM agent.runs WHERE job_name IS NOT NULL "
                                     "AND scheduled_for = '2026-03-01 10:00:00'"))
        assert statuses == {"every_minute": "succeeded", "bad": "failed"}
        assert query(agent, "SELECT COUNT(*) FROM agent.attempts a JOIN agent.runs r ON r.run_id = a.run_id "
                            "WHERE r.job_name = 'bad'") == [(2,)]
        cancelled = submit(agent, "SELECT 1")
        with agent.store().transaction():
            assert len(agent.store().execute("cancel_run", run_id=cancelled, now=clock()).rows) == 1
        assert run_now(agent, "every_minute")["status"] == "pending"
        work(agent, concurrency=1)
        clock.advance(2 * 86400)
        report = agent.tick()
        assert not report.errors and report.purged.get("runs", 0) >= 2
        audited = dict(query(agent, "SELECT tbl, COUNT(*) FROM public.agent_audit GROUP BY tbl"))
        assert audited["runs"] > 5 and audited["attempts"] >= 3 and audited["jobs"] >= 2
        code = cli(["--db", pg_url, "doctor"])
        out = capsys.readouterr().out
        session = next(line for line in out.splitlines() if "] session" in line)
        assert "[ OK ]" in session and "lock timeout 30s" in session
        for trigger in ("audit_attempts on attempts (after)", "audit_runs on runs (after)", "stamp_jobs on jobs (before)"):
            assert trigger in session, session
        assert code == 0, out
    finally:
        agent.close()


def _tsql_statements():
    from shared.control.queries import load_migrations, load_queries

    for query_ in load_queries("mssql").values():
        for statement in query_.statements:
            yield query_.name, statement.sql
    for migration in load_migrations("mssql"):
        for statement in migration.statements():
            yield f"migration {migration.version}", statement


def test_every_tsql_output_goes_into_a_table_variable():
    """SQL Server refuses OUTPUT without INTO on a table with an enabled trigger (error 334): a
    DBA's audit trigger on an agent table would break every statement that uses it."""
    import re

    clause = re.compile(r"\bOUTPUT\s+(?:inserted|deleted|N'|@\w+\s*,|\$action)(.*)", re.IGNORECASE | re.DOTALL)
    checked = 0
    for name, sql in _tsql_statements():
        code = "\n".join(line.split("--")[0] for line in sql.splitlines())
        for match in clause.finditer(code):
            head = re.split(r"\b(FROM|WHERE|VALUES|SELECT|SET)\b", match.group(1), maxsplit=1, flags=re.IGNORECASE)[0]
            assert re.search(r"\bINTO\s+@\w+", head, re.IGNORECASE), f"{name}: OUTPUT without INTO:\n{sql}"
            checked += 1
    assert checked >= 10


def test_the_database_refuses_an_unknown_run_status(pg_url):
    import pyodbc

    agent = make_agent(pg_url)
    try:
        run_id = submit(agent, "SELECT 1")
        with pytest.raises(pyodbc.Error, match="runs_status_check"):
            execute(agent, f"UPDATE agent.runs SET status = 'done' WHERE run_id = {run_id}")
        with pytest.raises(pyodbc.Error, match="runs_kind_check"):
            execute(agent, f"UPDATE agent.runs SET kind = 'adhoc' WHERE run_id = {run_id}")
    finally:
        agent.close()


def test_concurrent_run_now_requests_make_one_run_and_skip_the_others(db_url):
    """Eight run-now requests for an overlap=skip job at the same moment, from eight
    connections: the overlap check is decided under the start lock, so exactly one run is
    pending and seven are skipped (without the lock, several saw no run in flight)."""
    agents = [make_agent(db_url, {"nightly": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}})
              for _ in range(8)]
    try:
        agents[0].tick()
        for agent in agents:
            agent.store().connection                          # connected before the race
        barrier = threading.Barrier(len(agents))
        results, errors = [], []

        def request(agent):
            try:
                barrier.wait(timeout=30)
                results.append(run_now(agent, "nightly")["status"])
            except Exception as exc:  # noqa: BLE001 - the assertion shows it
                errors.append(exc)

        threads = [threading.Thread(target=request, args=(agent,)) for agent in agents]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        assert sorted(results) == ["pending"] + ["skipped"] * 7
    finally:
        for agent in agents:
            agent.close()


def test_a_lease_expiring_while_its_worker_records_a_failure_does_not_deadlock(pg_url):
    """The tick (expire_leases, then close_dead_attempts) and a worker's fenced failure both
    lock the run before its attempt. The tick holds the run; the worker's failure waits on the
    run (not holding the attempt); the tick closes the attempt and commits; the failure then
    finds the run taken over. In the other order (attempt first) this is a deadlock (40P01)."""
    clock = Clock(at("2026-03-01T10:00:00"))
    ticker, worker = make_agent(pg_url, clock=clock), make_agent(pg_url, clock=clock)
    try:
        run_id = submit(ticker, "SELECT 1", lease_seconds=1)
        with worker.store().transaction():
            started = worker.store().execute("claim_runs", now=clock(), late_cutoff=clock(), batch=1,
                                             max_concurrency=8, worker="w").rows
        assert [r["run_id"] for r in started] == [run_id]
        token = started[0]["token"]
        clock.advance(120)
        failure: dict = {}

        def record_failure():
            try:
                with worker.store().transaction():
                    failure["rows"] = worker.store().execute(
                        "fail_run", run_id=run_id, token=token, now=clock(), retry_at=clock(), outcome="failed",
                        error_number=None, error_sqlstate=None, error_message="boom").rows
            except Exception as exc:  # noqa: BLE001
                failure["error"] = exc

        store = ticker.store()
        with store.transaction():
            assert len(store.execute("expire_leases", now=clock(), max_lapses=3).rows) == 1
            thread = threading.Thread(target=record_failure)
            thread.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not query(
                    ticker, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"):
                time.sleep(0.05)
            store.execute("close_dead_attempts", now=clock())
        thread.join(timeout=30)
        assert "error" not in failure, failure
        assert failure["rows"] == []                          # the lease was taken over: fenced out
        assert query(ticker, f"SELECT outcome FROM agent.attempts WHERE run_id = {run_id}") == [("lease_expired",)]
    finally:
        ticker.close()
        worker.close()


def test_the_transaction_check_runs_only_where_the_job_worked(pg_url, monkeypatch):
    """The completion refuses a transaction the job's SQL ended (SQL Server: XACT_STATE() <> 1),
    but only when the job worked in the agent's own transaction: after work in another database
    the completion opens the control database's transaction itself, where nothing is active
    yet, and must not be refused (on SQL Server every DATABASE job would fail)."""
    from shared.control.store import Store

    calls: list[list[str]] = []
    original = Store._chain

    def recording(self, named, *, end, then=()):
        calls.append([name for name, _ in named])
        return original(self, named, end=end, then=then)

    monkeypatch.setattr(Store, "_chain", recording)
    name, _ = create_pg_database()
    agent = make_agent(pg_url)
    try:
        here = submit(agent, "SELECT 1")
        there = submit(agent, "CREATE TABLE done_there (x INT)", target_database=name)
        work(agent, concurrency=1)
        assert run_of(agent, here)["status"] == "succeeded" and run_of(agent, there)["status"] == "succeeded"
        finishes = [c for c in calls if "finish_run" in c]
        assert len(finishes) == 2
        assert sorted("check_work_transaction" in c for c in finishes) == [False, True]
        assert all(c.index("check_work_transaction") < c.index("finish_run") for c in finishes
                   if "check_work_transaction" in c)
    finally:
        agent.close()
        drop_pg_database(name)
