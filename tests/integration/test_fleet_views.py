"""Fleet runs as the operator sees them (issue 16, operations): `history` groups a fleet run's
executions by target, `jobs` shows the last run's target count and failures, and the monitor's
jobs, job and run pages show the fleet, each through shared/engine/views.py with a fixed number of
queries (one list_run_targets for every execution of the runs shown, none without fleet runs).

On PostgreSQL the engine runs a real fleet: target databases created here (one refusing
connections, one whose step raises an error holding HTML), dropped at the end. SQLite, which
refuses fleet targets, checks the shapes: the empty `targets` of ordinary runs, and the grouping
of executions written into its runs table as the engine writes them on the other databases."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from datetime import datetime, timezone

import pytest

from shared.engine import views
from shared.telemetry.client import new_operation_id
from shared.web.app import Monitor, MonitorSettings
from tests.support.harness import ROOT, create_pg_database, drop_pg_database, execute, make_agent, pg_admin_connection, work

UTC = timezone.utc
HOSTILE = "<b>no</b> & bye"
TARGET_KEYS = {"target_server", "target_database", "run_id", "step", "parent_token", "status", "attempts",
               "max_attempts", "last_error_number", "last_error", "started_at", "finished_at"}


# ---------------------------------------------------------------- helpers


class Recorder:
    """What a store is asked: the named queries (``names``) and the statements sent to the
    server for them (``statements``, one round trip each), as a view or a page runs them."""

    def __init__(self, store) -> None:
        self.statements: list[str] = []
        self.names: list[str] = []
        send, execute = store._execute_statement, store.execute

        def record_statement(sql, values):
            self.statements.append(sql)
            return send(sql, values)

        def record_name(name, **params):
            self.names.append(name)
            return execute(name, **params)

        store._execute_statement = record_statement
        store.execute = record_name

    def clear(self) -> None:
        self.statements.clear()
        self.names.clear()

    def count(self, name: str) -> int:
        return self.names.count(name)


def cli(db: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    code = "import sys; from shared.cli.commands import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, "--db", db, *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-2000:])
    return result


def monitor_on(agent):
    store = agent.new_store()
    recorder = Recorder(store)
    monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: datetime.now(UTC),
                      settings=lambda: MonitorSettings(refresh_seconds=0))
    return monitor, recorder, store


def page(monitor, path: str, query: str = "") -> str:
    response = monitor.handle("GET", path, query)
    assert response.status == 200, (path, response.status, response.body[:500])
    return response.body.decode()


def text_of(html_text: str) -> str:
    """What a person reads: tags gone, spaces collapsed, none before a comma or a parenthesis."""
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html_text))
    return re.sub(r" ([,)])", r"\1", text)


def job_row(page_text: str, job: str) -> str:
    match = re.search(rf'<tr class="job" id="job-{job}">(.*?)</tr>', page_text, re.S)
    assert match, f"no row for {job}"
    return match.group(1)


# ---------------------------------------------------------------- SQLite: the shapes


@pytest.fixture
def sqlite_agent(tmp_path):
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    agent = make_agent(url, {"plain": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": "SELECT 1"}})
    agent.tick()
    work(agent, concurrency=1)
    yield agent, url
    agent.close()


def test_runs_without_targets_have_empty_targets_and_run_no_fleet_query(sqlite_agent):
    sqlite_agent, url = sqlite_agent
    store = sqlite_agent.new_store()
    recorder = Recorder(store)
    try:
        history = views.history_view(store, "plain", 50)
        assert recorder.count("list_run_targets") == 0 and len(recorder.statements) == 3
        (run,) = history["runs"]
        assert run["targets"] == [] and run["target_statuses"] == {}
        assert run["targets_total"] is None and run["parent_run_id"] is None
        recorder.clear()
        shown = views.run_view(store, run["run_id"])
        assert recorder.names == ["get_run", "list_attempts", "list_attempt_output", "list_run_poison"]
        assert shown["targets"] == [] and shown["parent"] is None
        (job,) = views.jobs_view(store, datetime.now(UTC))
        assert job["last_targets_total"] is None and job["last_targets_failed"] is None
    finally:
        store.close()
    jobs = cli(url, "jobs").stdout
    header, row = jobs.splitlines()[:2]
    assert "LAST TARGETS" in header
    assert row[header.index("LAST TARGETS"):].split()[0] == "-"


def _insert_run(agent, run_id: int, **columns) -> None:
    """A row of the runs table as the engine writes fleet runs and executions on the databases
    that have them (SQLite refuses fleet targets at sync, so the engine never writes these here)."""
    now = "2026-03-01 10:00:00"
    row = {"run_id": run_id, "kind": "target", "scheduled_for": now, "status": "succeeded", "command": "SELECT 1",
           "overlap": "allow", "max_attempts": 3, "timeout_seconds": 60, "lease_seconds": 60, "runnable_at": now,
           "created_at": now, "operation_id": "op", "attempt": 1, **columns}
    names = ", ".join(row)
    values = ", ".join("NULL" if v is None else str(v) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"
                       for v in row.values())
    execute(agent, f"INSERT INTO agent_runs ({names}) VALUES ({values})")


def test_executions_come_grouped_by_target_own_server_first(sqlite_agent):
    sqlite_agent, url = sqlite_agent
    (plain,) = views.history_view(sqlite_agent.store(), "plain", 5)["runs"]
    parent = plain["run_id"] + 100
    _insert_run(sqlite_agent, parent, job_name="fleetish", kind="manual", status="failed", targets_total=5,
                targets_failed=2, last_error="step 1: 2 of 5 target(s) failed: db_b (failed), srv2/db_a (failed)")
    # written out of order: ids, servers and steps mixed
    for run_id, server, database, step, status, error in [
            (parent + 1, "srv2", "db_a", 1, "failed", "cannot connect to database db_a on server srv2"),
            (parent + 2, None, "db_b", 2, "succeeded", None),
            (parent + 3, None, "db_b", 1, "failed", HOSTILE),
            (parent + 4, None, "db_a", 1, "succeeded", None),
            (parent + 5, "srv1", "db_z", 1, "waiting", None)]:
        _insert_run(sqlite_agent, run_id, parent_run_id=parent, parent_token=step, target_server=server,
                    target_database=database, step=step, status=status, last_error=error)
    store = sqlite_agent.new_store()
    recorder = Recorder(store)
    try:
        history = views.history_view(store, "fleetish", 5)
        assert recorder.count("list_run_targets") == 1 and len(recorder.statements) == 4
        (run,) = history["runs"]
        order = [(t["target_server"], t["target_database"], t["step"]) for t in run["targets"]]
        assert order == [(None, "db_a", 1), (None, "db_b", 1), (None, "db_b", 2), ("srv1", "db_z", 1),
                         ("srv2", "db_a", 1)]
        assert all(set(t) == TARGET_KEYS for t in run["targets"])
        assert [t["run_id"] for t in run["targets"]] == [parent + 4, parent + 3, parent + 2, parent + 5, parent + 1]
        assert run["target_statuses"] == {"failed": 2, "succeeded": 2, "waiting": 1}
        assert run["targets"][1]["last_error"] == HOSTILE and run["targets"][1]["attempts"] == 1
        assert [views.target_label(t) for t in run["targets"]] == ["db_a", "db_b", "db_b", "srv1/db_z", "srv2/db_a"]
        # history without --job: the executions are runs of their own too, named by their run
        everything = views.history_view(store, None, 50)["runs"]
        assert {r["run_id"] for r in everything if r["parent_run_id"] == parent} == set(range(parent + 1, parent + 6))
    finally:
        store.close()
    text = cli(url, "history", "--job", "fleetish").stdout
    block = text.split(f"run {parent} (fleetish) failed: 5 target(s), 2 failed (2 failed, 2 succeeded, 1 waiting)")[1]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0].split() == ["TARGET", "STEP", "EXECUTION", "STATUS", "ATTEMPTS", "FINISHED", "ERROR"]
    assert lines[1].split()[:4] == ["db_a", "1", str(parent + 4), "succeeded"]
    assert lines[2].split()[:4] == ["db_b", "1", str(parent + 3), "failed"] and HOSTILE in lines[2]
    assert lines[3].split()[:3] == ["2", str(parent + 2), "succeeded"]      # db_b's second step: name not repeated
    assert lines[4].split()[:4] == ["srv1/db_z", "1", str(parent + 5), "waiting"]
    assert lines[5].split()[:4] == ["srv2/db_a", "1", str(parent + 1), "failed"]
    everything = cli(url, "history").stdout
    assert f"(target of run {parent})" in everything


# ---------------------------------------------------------------- PostgreSQL: a real fleet


@pytest.fixture(scope="module")
def fleet():
    """A control database and four target databases: t3 refuses connections, t2 raises an error
    (holding HTML) in step 1. Job `fleet`: step 1 on every t*, on to step 2 whatever happens;
    step 2 on t1 and t2. Job `plain`: no targets. Both run once; `fleet` runs a second time."""
    prefix = "fv" + uuid.uuid4().hex[:8]
    targets = [f"{prefix}_t{i}" for i in range(4)]
    admin = pg_admin_connection()
    control = None
    agent = None
    try:
        for name in targets:
            admin.cursor().execute(f"CREATE DATABASE {name}")
        admin.cursor().execute(f"ALTER DATABASE {targets[3]} ALLOW_CONNECTIONS false")
        control, url = create_pg_database()
        once = "@once " + datetime.now(UTC).isoformat()
        raises = (f"DO $$BEGIN IF current_database() = '{targets[2]}' THEN RAISE EXCEPTION '{HOSTILE}'; END IF; END$$")
        jobs = {"fleet": {"SCHEDULE": once, "STEPS__1__TARGETS": f"db:{prefix}_*", "STEPS__1__COMMAND": raises,
                          "STEPS__1__ON_FAILURE": "next",
                          "STEPS__2__TARGETS": f"db:{targets[1]}, db:{targets[2]}", "STEPS__2__COMMAND": "SELECT 2",
                          "TARGET_PARALLELISM": "2", "MAX_ATTEMPTS": "1"},
                "plain": {"SCHEDULE": once, "COMMAND": "SELECT 1"}}
        agent = make_agent(url, jobs, AGENT_CONNECT_RETRY_SECONDS="1")
        assert agent.scheduler().tick().errors == []
        work(agent, concurrency=4, max_seconds=90)
        assert agent.request_run_now("fleet", operation_id=new_operation_id()) is not None
        work(agent, concurrency=4, max_seconds=90)
        yield agent, url, targets
    finally:
        if agent is not None:
            agent.close()
        if control is not None:
            drop_pg_database(control)
        for name in targets:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def test_history_json_groups_each_runs_executions_by_target(fleet):
    agent, url, targets = fleet
    t0, t1, t2, t3 = targets
    history = json.loads(cli(url, "history", "--job", "fleet", "--json").stdout)
    runs = history["runs"]
    assert [r["kind"] for r in runs] == ["manual", "scheduled"] and len({r["run_id"] for r in runs}) == 2
    for run in runs:
        assert run["status"] == "succeeded" and run["failed_step"] == 1        # step 1 failed, on to step 2
        assert run["targets_total"] == 6 and run["targets_failed"] == 2
        assert run["target_statuses"] == {"failed": 2, "succeeded": 4}
        assert [(t["target_database"], t["step"]) for t in run["targets"]] == [
            (t0, 1), (t1, 1), (t1, 2), (t2, 1), (t2, 2), (t3, 1)]
        assert all(set(t) == TARGET_KEYS and t["target_server"] is None for t in run["targets"])
        by = {(t["target_database"], t["step"]): t for t in run["targets"]}
        assert by[(t3, 1)]["status"] == "failed" and by[(t3, 1)]["attempts"] == 1 == by[(t3, 1)]["max_attempts"]
        assert "is not currently accepting connections" in by[(t3, 1)]["last_error"]
        assert t3 in by[(t3, 1)]["last_error"]
        assert by[(t2, 1)]["status"] == "failed" and HOSTILE in by[(t2, 1)]["last_error"]
        assert by[(t2, 2)]["status"] == "succeeded" and by[(t2, 2)]["last_error"] is None
        assert all(t["finished_at"] and t["started_at"] for t in run["targets"])
        assert {t["parent_token"] for t in run["targets"] if t["step"] == 1} != \
               {t["parent_token"] for t in run["targets"] if t["step"] == 2}
        # each entry is an execution of this run: its own run, with its own attempts
        for execution in run["targets"]:
            row = agent.store().execute("get_run", run_id=execution["run_id"]).one()
            assert row["kind"] == "target" and row["parent_run_id"] == run["run_id"]
            assert row["target_database"] == execution["target_database"] and row["status"] == execution["status"]
    # the executions of both runs are different runs
    assert not ({t["run_id"] for t in runs[0]["targets"]} & {t["run_id"] for t in runs[1]["targets"]})
    plain = json.loads(cli(url, "history", "--job", "plain", "--json").stdout)["runs"]
    assert [r["targets"] for r in plain] == [[]]


def test_history_text_lists_the_executions_under_each_run(fleet):
    agent, url, targets = fleet
    t0, t1, t2, t3 = targets
    text = cli(url, "history", "--job", "fleet").stdout
    runs = json.loads(cli(url, "history", "--job", "fleet", "--json").stdout)["runs"]
    for run in runs:
        marker = f"run {run['run_id']} (fleet) succeeded: 6 target(s), 2 failed (2 failed, 4 succeeded)"
        assert text.count(marker) == 1, text
        block = text.split(marker)[1].split("\nrun ")[0]
        rows = [line.split() for line in block.splitlines() if line.strip()][1:]
        assert [row[0] for row in rows] == [t0, t1, "2", t2, "2", t3]      # a target named once
        assert rows[5][3] == "failed" and "not currently accepting connections" in block
        assert rows[3][3] == "failed" and HOSTILE in block
        execution_ids = [int(row[2]) if row[0] != "2" else int(row[1]) for row in rows]
        assert execution_ids == [t["run_id"] for t in run["targets"]]


def test_jobs_shows_the_last_runs_targets(fleet):
    agent, url, _ = fleet
    rows = {r["job_name"]: r for r in json.loads(cli(url, "jobs", "--json").stdout)}
    last = json.loads(cli(url, "history", "--job", "fleet", "--limit", "1", "--json").stdout)["runs"][0]
    assert rows["fleet"]["last_run_id"] == last["run_id"]
    assert rows["fleet"]["last_targets_total"] == 6 and rows["fleet"]["last_targets_failed"] == 2
    assert rows["plain"]["last_targets_total"] is None and rows["plain"]["last_targets_failed"] is None
    text = cli(url, "jobs").stdout.splitlines()
    header = text[0]
    column = header.index("LAST TARGETS")
    lines = {line.split()[0]: line for line in text[1:]}
    assert lines["fleet"][column:].startswith("6, 2 failed")
    assert lines["plain"][column:].split()[0] == "-"


def test_monitor_pages_show_the_fleet_with_fixed_query_counts(fleet):
    agent, url, targets = fleet
    t0, t1, t2, t3 = targets
    monitor, recorder, store = monitor_on(agent)
    try:
        history = views.history_view(store, "fleet", 50)
        newest, older = history["runs"]
        # jobs page: three queries whatever the fleet (the agent's liveness, issue 32 item 7, and
        # two), the last run's fleet in its row
        recorder.clear()
        jobs = page(monitor, "/")
        assert len(recorder.statements) == 3
        assert "6 targets, 2 failed" in text_of(job_row(jobs, "fleet"))
        assert "targets" not in text_of(job_row(jobs, "plain"))
        # job page: one more query than a job without targets (list_run_targets, for both runs)
        recorder.clear()
        plain_page = page(monitor, "/jobs/plain")
        plain_count = len(recorder.statements)
        assert recorder.count("list_run_targets") == 0 and plain_count == 8   # 7 and the liveness
        recorder.clear()
        job_page = page(monitor, "/jobs/fleet")
        assert len(recorder.statements) == plain_count + 1 and recorder.count("list_run_targets") == 1
        assert "<th>Targets</th>" in job_page and "<th>Targets</th>" not in plain_page
        assert "Last outcome" in job_page and "6 targets, 2 failed" in text_of(job_page)
        assert text_of(job_page).count("6 target(s), 2 failed (2 failed, 4 succeeded)") == 2
        for run in (newest, older):
            for execution in run["targets"]:
                assert f'href="/runs/{execution["run_id"]}"' in job_page
        assert "&lt;b&gt;no&lt;/b&gt; &amp; bye" in job_page and HOSTILE not in job_page
        assert job_page.count("<details>") == 2
        # the job page's JSON twin carries the same executions as history --json
        twin = json.loads(page(monitor, "/jobs/fleet", "format=json"))
        assert [r["targets"] for r in twin["runs"]] == json.loads(views.to_json([newest["targets"], older["targets"]]))
        # an ordinary run's page: the liveness (get_state), get_run, attempts, their output, poison; no fleet
        (plain_run,) = views.history_view(store, "plain", 5)["runs"]
        recorder.clear()
        ordinary = page(monitor, f"/runs/{plain_run['run_id']}")
        ordinary_count = len(recorder.statements)
        assert recorder.names == ["get_state", "get_run", "list_attempts", "list_attempt_output", "list_run_poison"]
        assert "<h2>Targets</h2>" not in ordinary and "<dt>Fleet</dt><dd>-</dd>" in ordinary
        # a fleet run's page: its executions by target, each linked, in one more query
        recorder.clear()
        run_page = page(monitor, f"/runs/{newest['run_id']}")
        assert len(recorder.statements) == ordinary_count + 1 and recorder.count("list_run_targets") == 1
        table = re.search(r'<table class="targets">(.*?)</table>', run_page, re.S).group(1)
        rows = re.findall(r"<tr><td>(.*?)</tr>", table, re.S)
        assert len(rows) == 6
        assert [text_of(row).split()[0] for row in rows] == [t0, t1, "2", t2, "2", t3]
        assert [int(x) for x in re.findall(r'href="/runs/(\d+)"', table)] == [t["run_id"] for t in newest["targets"]]
        assert "not currently accepting connections" in text_of(rows[5]) and "failed" in text_of(rows[5])
        assert "&lt;b&gt;no&lt;/b&gt;" in rows[3] and HOSTILE not in run_page
        assert "6 target(s), 2 failed" in text_of(run_page)
        # an execution's page: which run, step and target it belongs to, and the job
        execution = newest["targets"][-1]
        recorder.clear()
        execution_page = page(monitor, f"/runs/{execution['run_id']}")
        assert len(recorder.statements) == ordinary_count + 1 and recorder.names[-1] == "get_run"   # its run
        words = text_of(execution_page)
        assert f"execution of run {newest['run_id']} (succeeded), step 1, on target {t3} (the agent's own server)" in words
        assert f"(a target of run {newest['run_id']} of job fleet)" in words
        assert f'href="/runs/{newest["run_id"]}"' in execution_page and 'href="/jobs/fleet"' in execution_page
        assert "is not currently accepting connections" in words
        execution_json = json.loads(page(monitor, f"/runs/{execution['run_id']}", "format=json"))
        assert execution_json["parent"]["run_id"] == newest["run_id"] and execution_json["parent"]["job_name"] == "fleet"
        assert execution_json["targets"] == []
    finally:
        store.close()


def test_history_runs_one_fleet_query_for_every_run(fleet):
    """Two fleet runs, twelve executions: history still runs a single list_run_targets."""
    agent, url, _ = fleet
    store = agent.new_store()
    recorder = Recorder(store)
    try:
        history = views.history_view(store, "fleet", 50, with_output=True)
        assert sum(len(r["targets"]) for r in history["runs"]) == 12
        assert recorder.count("list_run_targets") == 1 and len(recorder.statements) == 5
        recorder.clear()
        everything = views.history_view(store, None, 100)
        fleet_runs = [r for r in everything["runs"] if r["targets"]]
        assert len(fleet_runs) == 2 and recorder.count("list_run_targets") == 1
        executions = [r for r in everything["runs"] if r["kind"] == "target"]
        assert len(executions) == 12 and all(r["job_name"] is None and r["parent_run_id"] for r in executions)
    finally:
        store.close()
