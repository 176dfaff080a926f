"""The fault and bad-input campaign, on PostgreSQL, as part of the suite: kill -9 of workers
mid-job, outages of the control database (connections refused and terminated) during work
and during ticks, concurrent ticks + workers + submitters with the cap and the task order
checked from the timestamps the work records, bad settings of every kind next to a good job,
out-of-range and malformed messages through the real trigger, clock jumps.

Every scenario is bounded in count and time and ends in a reconciliation straight from the
tables: runs per slot, effects per run, stuck runs — 0 lost, 0 doubled, 0 stuck."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine.runner import LocalRunner
from tests.support.faults import OutageProxy, clean_env, effect_sql, kill9, reconcile, start_cli, wait_until
from tests.support.harness import ROOT, Clock, execute, make_agent, query

UTC = timezone.utc
EFFECTS = "CREATE TABLE effects (label VARCHAR(40), at TIMESTAMP, ended TIMESTAMP)"


def add_task(agent, label: str, *, before: str = "", order: int | None = None, lease: int = 6,
             max_attempts: int = 1, sql: str | None = None) -> int:
    from shared.telemetry.client import new_operation_id

    row = agent.store().execute("insert_task", command=sql or effect_sql(label, before), target_database=None,
                                task_order=order, max_attempts=max_attempts, timeout_seconds=120,
                                lease_seconds=lease, now=agent.clock(), operation_id=new_operation_id()).one()
    return row["run_id"]


def succeeded(agent, run_ids) -> bool:
    statuses = dict(query(agent, "SELECT run_id, status FROM agent.runs"))
    return all(statuses.get(run_id) == "succeeded" for run_id in run_ids)


# ---------------------------------------------------------------- kill -9


def test_workers_killed_mid_job_lose_nothing_and_double_nothing(pg_url, tmp_path):
    agent = make_agent(pg_url)
    execute(agent, EFFECTS)
    labels = {f"t{i:02d}": add_task(agent, f"t{i:02d}", before="SELECT pg_sleep(0.4); ") for i in range(16)}
    env = clean_env(AGENT_TICK_SCHEDULE="*/2 * * * * *", AGENT_MAX_CONCURRENCY="4", AGENT_POLL_SECONDS="1")
    workers = [start_cli(pg_url, "run", "--concurrency", "2", env=env) for _ in range(2)]
    kills = 0
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not succeeded(agent, labels.values()):
            running = query(agent, "SELECT COUNT(*) FROM agent.runs WHERE status = 'running'")[0][0]
            if running and kills < 3:
                victim = random.choice([w for w in workers if w.poll() is None])
                time.sleep(0.15)                          # mid-job
                kill9(victim)
                kills += 1
                workers.append(start_cli(pg_url, "run", "--concurrency", "2", env=env))
            time.sleep(0.3)
    finally:
        for worker in workers:
            kill9(worker)
    assert kills == 3
    result = reconcile(agent, labels)
    result.assert_clean()
    assert query(agent, "SELECT COALESCE(SUM(failures), 0) FROM agent.runs") == [(0,)]   # no attempt spent
    lapsed = query(agent, "SELECT COUNT(*) FROM agent.attempts WHERE outcome = 'lease_expired'")[0][0]
    assert lapsed >= 1                                     # the killed ones were taken back
    agent.close()


# ---------------------------------------------------------------- outages


def test_an_outage_during_work_spends_no_attempt_and_loses_nothing(pg_url, caplog):
    """Connections to the control database terminated and refused for 5 s while tasks run
    (MAX_ATTEMPTS=1): every task still runs exactly once; no attempt is spent; every log line
    says what failed in words, never pyodbc's raw tuple."""
    proxy = OutageProxy()
    database = pg_url.split("Database=")[1].rstrip(";")
    through = proxy.connection_string(database)
    watcher = make_agent(pg_url)
    execute(watcher, EFFECTS)
    agent = make_agent(through, AGENT_TICK_SCHEDULE="*/2 * * * * *", AGENT_POLL_SECONDS="1")
    labels = {f"o{i:02d}": add_task(watcher, f"o{i:02d}", before="SELECT pg_sleep(0.5); ") for i in range(10)}
    runner = LocalRunner(agent, concurrency=2, visibility_timeout=1)
    thread = threading.Thread(target=runner.run, daemon=True)
    caplog.set_level(logging.INFO, logger="shared")
    thread.start()
    try:
        wait_until(lambda: query(watcher, "SELECT COUNT(*) FROM effects")[0][0] >= 2, 30, "first effects")
        proxy.outage()
        time.sleep(5)
        proxy.restore()
        wait_until(lambda: succeeded(watcher, labels.values()), 90, "every task succeeded after the outage")
    finally:
        runner.stop()
        thread.join(timeout=30)
        agent.close()
        proxy.close()
    reconcile(watcher, labels).assert_clean()
    assert query(watcher, "SELECT COALESCE(SUM(failures), 0) FROM agent.runs") == [(0,)]
    outage_lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert outage_lines, "the outage went unreported"
    raw = [line for line in outage_lines if "('08" in line or "('HY" in line or "\\n" in line]
    assert not raw, raw
    assert any("SQLSTATE 08" in line for line in outage_lines), outage_lines[:5]
    watcher.close()


def test_an_outage_during_ticks_loses_and_doubles_no_slot(pg_url):
    proxy = OutageProxy()
    database = pg_url.split("Database=")[1].rstrip(";")
    jobs = {"sec": {"SCHEDULE": "* * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "allow"}}
    clock = Clock(datetime.now(UTC).replace(microsecond=0))
    # Each tick during the outage waits out AGENT_CONNECT_RETRY_SECONDS before it fails (the
    # default, 90 s, made this one test 3 minutes): 5 s still retries a few times.
    agent = make_agent(proxy.connection_string(database), jobs, clock=clock, AGENT_CONNECT_RETRY_SECONDS="5")
    agent.tick()
    errors = 0
    for step in range(12):
        clock.advance(20)
        if step in (3, 4, 5):
            proxy.outage()
            with pytest.raises(Exception):   # noqa: B017 - whatever the outage raises: the timer invocation fails, retried next minute
                report = agent.tick()
                if report.errors:
                    raise RuntimeError(report.errors)
            errors += 1
            continue
        proxy.restore()
        report = agent.tick()
        assert not report.errors, report.errors
    proxy.close()
    watcher = make_agent(pg_url)
    rows = query(watcher, "SELECT scheduled_for, status, note FROM agent.runs WHERE job_name = 'sec' ORDER BY scheduled_for")
    slots = [r[0] for r in rows]
    assert len(slots) == len(set(slots))                                  # none doubled
    expected = [slots[0] + timedelta(seconds=i) for i in range(int((slots[-1] - slots[0]).total_seconds()) + 1)]
    assert slots == expected                                              # none lost: each has its row
    assert all(status in ("pending", "skipped") for _, status, _ in rows)
    assert all(note.startswith("misfire:") for _, status, note in rows if status == "skipped")
    watcher.close()
    agent.close()


# ---------------------------------------------------------------- everyone at once


def test_concurrent_ticks_workers_and_submitters_keep_the_cap_and_the_order(pg_url, tmp_path):
    """Three worker processes (each ticking), two submitter processes adding ordered tasks,
    AGENT_MAX_CONCURRENCY=2: from the spans the tasks record, never more than two at once, and
    no task started before a lower-order task submitted earlier had finished."""
    agent = make_agent(pg_url)
    execute(agent, EFFECTS)
    env = clean_env(AGENT_TICK_SCHEDULE="*/3 * * * * *", AGENT_MAX_CONCURRENCY="2", AGENT_POLL_SECONDS="1")
    workers = [start_cli(pg_url, "run", "--concurrency", "2", env=env) for _ in range(3)]
    submitter_code = (
        "import random, subprocess, sys, time\n"
        "db, prefix = sys.argv[1], sys.argv[2]\n"
        "for i in range(8):\n"
        "    label = f'{prefix}{i}'\n"
        "    order = random.Random(label).randint(1, 4)\n"
        "    sql = (f\"INSERT INTO effects (label, at) VALUES ('{label}', clock_timestamp()); SELECT pg_sleep(0.2); \"\n"
        "           f\"UPDATE effects SET ended = clock_timestamp() WHERE label = '{label}'\")\n"
        "    subprocess.run([sys.executable, '-m', 'shared.cli', '--db', db, 'submit', '--sql', sql,\n"
        "                    '--order', str(order)], check=True, capture_output=True)\n"
        "    time.sleep(random.random() * 0.2)\n")
    submitters = [subprocess.Popen([sys.executable, "-c", submitter_code, pg_url, prefix], cwd=ROOT, env=env)
                  for prefix in ("a", "b")]
    try:
        for submitter in submitters:
            assert submitter.wait(timeout=120) == 0
        wait_until(lambda: query(agent, "SELECT COUNT(*) FROM agent.runs WHERE status <> 'succeeded'") == [(0,)],
                   90, "every task succeeded")
    finally:
        for process in workers + submitters:
            kill9(process)
    tasks = query(agent, "SELECT r.run_id, r.task_order, r.created_at, e.at, e.ended, e.label "
                         "FROM agent.runs r JOIN effects e ON r.command LIKE '%''' || e.label || '''%'")
    assert len(tasks) == 16
    labels = {label: run_id for run_id, _, _, _, _, label in tasks}
    reconcile(agent, labels).assert_clean()
    events = sorted([(at, 1) for _, _, _, at, _, _ in tasks] + [(ended, -1) for _, _, _, _, ended, _ in tasks])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 2, f"{peak} tasks executed at once with AGENT_MAX_CONCURRENCY=2"
    # The promise: a task starts once every lower-order task submitted before it (a lower run
    # id: inserted earlier) has finished. A lower-order task submitted after it was claimed
    # may still be running when its SQL starts (under load the two are apart), and is no breach.
    violations = [(a[5], b[5]) for a in tasks for b in tasks
                  if a[1] < b[1] and a[0] < b[0] and a[4] > b[3]]
    assert not violations, f"started before a lower order submitted earlier finished: {violations}"
    agent.close()


# ---------------------------------------------------------------- bad input


def test_bad_settings_of_every_kind_hurt_only_their_own_job(pg_url, tmp_path):
    long_name = "x" * 70
    values = {
        "JOB__good__SCHEDULE": "0 0 * * * *", "JOB__good__COMMAND": "SELECT 1",
        "JOB__never__SCHEDULE": "0 0 0 30 2 *", "JOB__never__COMMAND": "SELECT 1",
        "JOB__toolong__SCHEDULE": "0 0 * * * *" + " " * 10 + "," * 500, "JOB__toolong__COMMAND": "SELECT 1",
        "JOB__longsched__SCHEDULE": "0 " + ",".join(str(i % 60) for i in range(200)) + " * * * *",
        "JOB__longsched__COMMAND": "SELECT 1",
        f"JOB__{long_name}A__SCHEDULE": "0 0 * * * *", f"JOB__{long_name}A__COMMAND": "SELECT 1",
        f"JOB__{long_name}B__SCHEDULE": "0 0 * * * *", f"JOB__{long_name}B__COMMAND": "SELECT 1",
        "JOB__nul__SCHEDULE": "0 0 * * * *", "JOB__nul__COMMAND": "SELECT 1\u0000; DROP TABLE x",
        "JOB__bad\u0000name__SCHEDULE": "0 0 * * * *", "JOB__bad\u0000name__COMMAND": "SELECT 1",
        "JOB__Backup__SCHEDULE": "0 0 * * * *", "JOB__Backup__COMMAND": "SELECT 1",
        "JOB__backup__SCHEDULE": "0 0 * * * *", "JOB__backup__COMMAND": "SELECT 1",
        "JOB__zone__SCHEDULE": "0 0 * * * *", "JOB__zone__COMMAND": "SELECT 1", "JOB__zone__TIMEZONE": "Mars/Base",
        "JOB__attempts__SCHEDULE": "0 0 * * * *", "JOB__attempts__COMMAND": "SELECT 1",
        "JOB__attempts__MAX_ATTEMPTS": "99999999999999999999",
        "JOB__typo__SCHEDULE": "0 0 * * * *", "JOB__typo__COMMAND": "SELECT 1", "JOB__typo__OVERLPA": "skip",
        "JOB__db__SCHEDULE": "0 0 * * * *", "JOB__db__COMMAND": "SELECT 1", "JOB__db__DATABASE": "a;DROP",
        "JOB__once__SCHEDULE": "@once 2026-02-30T10:00:00", "JOB__once__COMMAND": "SELECT 1",
    }
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"Values": values}), encoding="utf-8")
    env = clean_env()
    env_bytes = {k.encode(): v.encode() for k, v in env.items()}
    env_bytes[b"JOB__latin__SCHEDULE"] = b"0 0 * * * *"
    env_bytes[b"JOB__latin__COMMAND"] = b"SELECT '\xe9t\xe9'"          # not UTF-8
    make_agent(pg_url).close()

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "shared.cli", "--db", pg_url, "--settings", str(settings), *args],
                              cwd=ROOT, env=env_bytes, capture_output=True, text=True, timeout=120)

    ticked = cli("tick", "--json")
    assert ticked.returncode == 0, ticked.stderr
    listed = cli("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = {row["job_name"]: row for row in json.loads(listed.stdout)}
    assert jobs["good"]["valid"] == 1 and jobs["good"]["next_due_at"] is not None
    invalid = {name: row["config_error"] for name, row in jobs.items() if not row["valid"]}
    assert len(invalid) == len(jobs) - 1, sorted(jobs)
    expectations = {"never": "JOB__never__SCHEDULE", "toolong": "JOB__toolong__SCHEDULE",
                    "longsched": "at most 400 characters", "nul": "NUL", "Backup": "differs only by case",
                    "backup": "differs only by case", "zone": "JOB__zone__TIMEZONE",
                    "attempts": "JOB__attempts__MAX_ATTEMPTS", "typo": "OVERLPA", "db": "JOB__db__DATABASE",
                    "once": "JOB__once__SCHEDULE", "latin": "not UTF-8"}
    for name, needle in expectations.items():
        found = [error for key, error in invalid.items() if key == name or key.startswith(name[:40] + "~")]
        assert found and needle in found[0], (name, invalid)
    assert sum(1 for key in invalid if key.startswith("x" * 40)) == 2           # the two long names, apart
    ran = cli("run-now", "good")
    assert ran.returncode == 0, ran.stderr
    assert cli("run-now", "never").returncode == 2


@pytest.mark.parametrize("body", [
    '{"v": 1, "run_id": 9223372036854775808, "token": 1}',
    '{"v": 1, "run_id": 1, "token": 9223372036854775808}',
    '{"v": 1, "run_id": 1, "token": 99999999999999999999999999999999}',
    '{"v": 1, "run_id": -1, "token": 1}',
    '{"v": 1, "run_id": 0, "token": 1}',
    '{"v": 1, "run_id": 1.0, "token": 1}',
    '{"v": 1, "run_id": 1, "token": true}',
    '{"v": 1, "doorbell": -5}',
    '{"v": 1, "doorbell": 1, "run_id": 1}',
    '{"v": 1, "run_id": 1, "token": 1, "op": "0000"}',
    '{"v": 1, "run_id": 1, "token": 1, "run_id": "x"}',
    '[' * 5000,
    '{"v": 1, "run_id": 1, "token": 1' + ' ' * 2000 + '}',
    "",
    "null",
])
def test_out_of_range_and_malformed_messages_are_poisoned_on_first_delivery(pg_url, body, monkeypatch):
    from azure.functions.queue import QueueMessage

    from functions import queue_trigger
    from shared.engine.agent import reset_default_agent

    monkeypatch.setenv("AGENT_DB", pg_url)
    reset_default_agent()
    agent = make_agent(pg_url)
    try:
        trigger = queue_trigger.agent_execute.build().get_user_function()
        trigger(QueueMessage(id="m1", body=body.encode(), dequeue_count=1))   # returns: the host deletes it
        (poison,) = agent.store().execute("list_poison", limit=5).rows
        assert poison["dequeue_count"] == 1 and poison["reason"].startswith("malformed message")
        assert poison["body"] == body
    finally:
        reset_default_agent()
        agent.close()


# ---------------------------------------------------------------- clock jumps


def test_a_tick_far_ahead_is_refused_and_says_so(pg_url):
    agent = make_agent(pg_url, {"hourly": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}})
    agent.tick()
    before = query(agent, "SELECT next_due_at FROM agent.jobs")
    # Compared with what the sane tick left: near the top of the hour it claims the next slot ahead.
    runs_before = query(agent, "SELECT run_id, status FROM agent.runs ORDER BY run_id")
    env = clean_env(JOB__hourly__SCHEDULE="0 0 * * * *", JOB__hourly__COMMAND="SELECT 1")
    result = subprocess.run([sys.executable, "-m", "shared.cli", "--db", pg_url, "tick", "--now", "2030-06-01T00:00:00"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "AGENT_MAX_CLOCK_SKEW_SECONDS" in result.stderr and "ahead" in result.stderr
    assert query(agent, "SELECT next_due_at FROM agent.jobs") == before
    assert query(agent, "SELECT run_id, status FROM agent.runs ORDER BY run_id") == runs_before
    agent.close()


def test_what_a_jumped_clock_did_is_undone_by_the_next_sane_tick(pg_url):
    """An instance whose clock jumped to 2030 ticks (its own clock, so it cannot tell): it moves
    the job's next slot to 2030 and claims 2030's slots. The next sane tick says so, puts the
    job back on its real schedule and removes what cannot have happened; the job runs on."""
    jobs = {"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}}
    sane = Clock(datetime.now(UTC).replace(second=30, microsecond=0))
    agent = make_agent(pg_url, jobs, clock=sane)
    agent.tick()
    jumped = make_agent(pg_url, jobs, clock=Clock(datetime(2030, 6, 1, 0, 0, 5, tzinfo=UTC)))
    jumped.tick()
    jumped.close()
    assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE scheduled_for > '2030-01-01'")[0][0] >= 1
    sane.advance(20)
    report = agent.tick()
    assert report.recovered and any("clock recovery" in w for w in report.warnings)
    assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE scheduled_for > '2030-01-01'") == [(0,)]
    (next_due,) = query(agent, "SELECT next_due_at FROM agent.jobs")[0]
    assert next_due.replace(tzinfo=UTC) - sane.now < timedelta(minutes=3)
    events = agent.store().execute("list_job_events", job_name="m", limit=10).rows
    assert any(e["kind"] == "clock_recovered" for e in events)
    for _ in range(3):                                   # and it keeps running on time
        sane.advance(60)
        agent.tick()
    from tests.support.harness import work

    work(agent)
    statuses = [s for (s,) in query(agent, "SELECT status FROM agent.runs WHERE scheduled_for <= "
                                           f"'{sane.now.replace(tzinfo=None).isoformat(sep=' ')}'")]
    assert statuses and set(statuses) <= {"succeeded", "skipped"} and "succeeded" in statuses
    agent.close()
