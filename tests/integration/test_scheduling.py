"""The tick on both dialects: one claim per occurrence, misfire and overlap decisions
recorded, bad settings isolated, constant statements per tick, nothing lost on dispatch."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from shared.errors import QueueError
from shared.messaging.memory import MemoryQueue
from tests.support.harness import at, make_agent, query, runs_table

HOURLY = {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}


@pytest.fixture
def agent_factory(agent_factory):
    """Queue mode, as the function app runs: the tick dispatches to a queue."""
    def build(jobs=None, **kwargs):
        kwargs.setdefault("queue", MemoryQueue())
        return agent_factory(jobs, **kwargs)

    return build


def start(agent, run_id):
    """A worker picks up the run's message and starts it (its SQL not run: it stays running)."""
    run = agent.store().execute("get_run", run_id=run_id).one()
    now = run["runnable_at"]
    (row,) = agent.store().execute("start_run", run_id=run_id, token=run["token"], now=now, worker="w",
                                   dequeue_count=1, max_concurrency=100, late_cutoff=now - timedelta(seconds=120)).rows
    assert row["decision"] == "start", row


def runs_of(agent, job=None):
    rows = agent.store().execute("list_history", job_name=job, limit=1000).rows
    return sorted(rows, key=lambda r: r["run_id"])


def job_row(agent, name):
    return next(r for r in agent.store().execute("list_jobs").rows if r["job_name"] == name)


def test_claim_once_per_occurrence_even_when_ticked_twice(agent_factory, db_url):
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))                     # syncs: next slot 13:00
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T13:00:00")
    first = agent.tick(at("2026-01-01T13:00:05"))
    second = agent.tick(at("2026-01-01T13:00:06"))            # the timer firing twice
    other = make_agent(db_url, {"hourly": HOURLY}, queue=MemoryQueue())   # another instance
    third = other.tick(at("2026-01-01T13:00:07"))
    other.close()
    assert len(first.claimed) == 1 and second.claimed == [] and third.claimed == []
    (run,) = runs_of(agent, "hourly")
    assert run["scheduled_for"] == at("2026-01-01T13:00:00") and run["status"] == "queued"
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T14:00:00")


def test_a_lost_advance_is_repaired_by_the_next_tick(agent_factory):
    """A tick that claimed but died before moving next_due_at: the next tick's claim
    conflicts on the unique key, and it still advances the job (no duplicate, no stall)."""
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    store = agent.store()
    store.execute("claim_slots", now=at("2026-01-01T13:00:05"), slots=[
        {"job_name": "hourly", "scheduled_for": store.json_time(at("2026-01-01T13:00:00")), "status": "pending",
         "note": None}])                                                       # ...then "crash"
    report = agent.tick(at("2026-01-01T13:00:30"))
    assert report.claimed == [] and report.due_jobs == 1
    assert len(runs_of(agent, "hourly")) == 1
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T14:00:00")


def test_misfire_run_once_catches_up_once_with_the_latest_missed_slot(agent_factory):
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    report = agent.tick(at("2026-01-01T15:10:00"))            # down at 13:00, 14:00 and 15:00
    missed13, missed14, caught_up = runs_of(agent, "hourly")   # every slot recorded, one run
    assert [missed13["scheduled_for"], missed14["scheduled_for"], caught_up["scheduled_for"]] == [
        at("2026-01-01T13:00:00"), at("2026-01-01T14:00:00"), at("2026-01-01T15:00:00")]
    assert missed13["status"] == missed14["status"] == "skipped"
    assert "caught up once, with the latest" in missed13["note"]
    assert caught_up["status"] == "queued" and "caught up late, once" in caught_up["note"]
    assert [r["run_id"] for r in report.dispatched] == [caught_up["run_id"]]
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T16:00:00")


def test_misfire_beyond_grace_is_recorded_skipped(agent_factory):
    agent = agent_factory({"hourly": {**HOURLY, "GRACE_SECONDS": "1800"}})
    agent.tick(at("2026-01-01T12:30:00"))
    agent.tick(at("2026-01-01T13:50:00"))                     # 50 min late, grace 30 min
    (run,) = runs_of(agent, "hourly")
    assert run["status"] == "skipped" and "GRACE_SECONDS" in run["note"]
    assert run["finished_at"] is not None


def test_misfire_skip_policy(agent_factory):
    agent = agent_factory({"hourly": {**HOURLY, "MISFIRE": "skip"}})
    agent.tick(at("2026-01-01T12:30:00"))
    agent.tick(at("2026-01-01T13:05:00"))                     # 5 min late > 120 s threshold
    agent.tick(at("2026-01-01T14:00:30"))                     # on time
    late, on_time = runs_of(agent, "hourly")
    assert late["status"] == "skipped" and "policy skip" in late["note"]
    assert on_time["status"] == "queued" and on_time["scheduled_for"] == at("2026-01-01T14:00:00")


def test_one_time_job_runs_once(agent_factory):
    agent = agent_factory({"once": {"SCHEDULE": "@once 2026-01-01T13:00:00", "COMMAND": "SELECT 1"}})
    agent.tick(at("2026-01-01T12:00:00"))
    agent.tick(at("2026-01-01T13:00:01"))
    agent.tick(at("2026-01-02T13:00:01"))
    (run,) = runs_of(agent, "once")
    assert run["scheduled_for"] == at("2026-01-01T13:00:00")
    assert job_row(agent, "once")["next_due_at"] is None


def test_overlap_skip_records_the_skipped_slot(agent_factory):
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}})
    agent.tick(at("2026-01-01T12:00:30"))                     # claims 12:01 (ahead, a delayed message)
    (first,) = runs_of(agent, "m")
    start(agent, first["run_id"])                             # 12:01 is running...
    report = agent.tick(at("2026-01-01T12:02:00"))            # ...when 12:02 comes
    first, second = runs_of(agent, "m")[:2]
    assert first["status"] == "running"
    assert second["status"] == "skipped" and second["note"].startswith("overlap")
    assert [r["run_id"] for r in report.skipped_at_start] == [second["run_id"]]


def test_overlap_queue_waits_for_the_previous_run(agent_factory):
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "queue"}})
    agent.tick(at("2026-01-01T12:00:30"))
    (first,) = runs_of(agent, "m")
    start(agent, first["run_id"])
    report = agent.tick(at("2026-01-01T12:02:00"))
    first, second = runs_of(agent, "m")[:2]
    assert first["status"] == "running" and second["status"] == "pending"
    assert second["run_id"] not in [r["run_id"] for r in report.dispatched]


def test_overlap_allow_dispatches_both(agent_factory):
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "allow"}})
    agent.tick(at("2026-01-01T12:00:30"))
    (first,) = runs_of(agent, "m")
    start(agent, first["run_id"])
    agent.tick(at("2026-01-01T12:02:00"))
    assert [r["status"] for r in runs_of(agent, "m")][:2] == ["running", "queued"]


def test_bad_setting_for_one_job_does_not_stop_the_good_one(agent_factory):
    agent = agent_factory({"good": HOURLY, "bad": {"SCHEDULE": "0 0 * * *", "COMMAND": "SELECT 1"},
                           "badzone": {**HOURLY, "TIMEZONE": "Nowhere/Land"}})
    agent.tick(at("2026-01-01T12:30:00"))
    report = agent.tick(at("2026-01-01T13:00:05"))
    assert [r["job_name"] for r in report.claimed] == ["good"]
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    assert jobs["bad"]["valid"] == 0 and "JOB__bad__SCHEDULE" in jobs["bad"]["config_error"]
    assert "'0 0 * * *'" in jobs["bad"]["config_error"] and "six-field NCRONTAB" in jobs["bad"]["config_error"]
    assert "JOB__badzone__TIMEZONE" in jobs["badzone"]["config_error"]
    events = agent.store().execute("list_job_events", job_name=None, limit=10).rows
    assert {e["job_name"] for e in events if e["kind"] == "config_invalid"} == {"bad", "badzone"}
    # Recorded once per change, not every tick.
    agent.tick(at("2026-01-01T14:00:05"))
    assert len(agent.store().execute("list_job_events", job_name=None, limit=10).rows) == 2


def test_disable_remove_and_reenable(agent_factory, db_url):
    agent = agent_factory({"a": HOURLY, "b": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    changed = make_agent(db_url, {"a": {**HOURLY, "ENABLED": "false"}}, queue=MemoryQueue())   # b removed, a disabled
    changed.tick(at("2026-01-01T13:00:05"))
    assert runs_of(changed) == []
    jobs = {r["job_name"]: r for r in changed.store().execute("list_jobs").rows}
    assert jobs["b"]["configured"] == 0 and jobs["a"]["enabled"] == 0
    changed.close()
    back = make_agent(db_url, {"a": HOURLY}, queue=MemoryQueue())
    back.tick(at("2026-01-01T15:30:00"))                       # re-enabled: starts at its next slot
    assert job_row(back, "a")["next_due_at"] == at("2026-01-01T16:00:00")
    assert runs_of(back) == []
    back.close()


def test_a_job_removed_and_added_back_in_another_letter_case_takes_that_spelling(agent_factory, db_url):
    """SQL Server compares job names case-insensitively (its default collation; Babelfish too):
    'backup' removed and 'Backup' added is the same row there, and the row takes the spelling of
    the settings in force, so the job reads, claims and runs as 'Backup' on every dialect."""
    agent = agent_factory({"backup": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    renamed = agent_factory({"Backup": HOURLY}, queue=MemoryQueue())
    renamed.tick(at("2026-01-01T12:40:00"))                     # the sync: next slot 13:00
    report = renamed.tick(at("2026-01-01T13:00:05"))
    assert [r["job_name"] for r in report.claimed] == ["Backup"]
    jobs = {r["job_name"]: r for r in renamed.store().execute("list_jobs").rows}
    assert (jobs["Backup"]["configured"], jobs["Backup"]["valid"]) == (1, 1)
    assert [name for name, row in jobs.items() if row["configured"] and name.casefold() == "backup"] == ["Backup"]
    assert [r["job_name"] for r in runs_of(renamed) if r["scheduled_for"] == at("2026-01-01T13:00:00")] == ["Backup"]


def test_statements_per_tick_do_not_grow_with_jobs(tmp_path, db_url):
    counts = []
    for n in (5, 60):
        # Same database, new job set (a fresh sync); a long dispatch lease keeps the first
        # round's runs from expiring during the second, so only the job count differs.
        jobs = {f"r{n}-job{i:03d}": HOURLY for i in range(n)}
        agent = make_agent(db_url, jobs, queue=MemoryQueue(), AGENT_MAX_CONCURRENCY="1000",
                           AGENT_DISPATCH_LEASE_SECONDS="86400")
        agent.tick(at(f"2026-01-0{1 if n == 5 else 2}T12:30:00"))
        report = agent.tick(at(f"2026-01-0{1 if n == 5 else 2}T13:00:05"))
        assert len(report.claimed) == n and len(report.dispatched) == n
        counts.append(report.statements)
        agent.close()
    assert counts[0] == counts[1], counts


class _FailingQueue(MemoryQueue):
    """The port failing to send (storage unreachable): fault injection at the port."""

    def send_many(self, bodies, **_):
        raise QueueError("queue unreachable (injected)")


def test_queue_failure_leaves_runs_pending_for_the_next_tick(agent_factory, db_url):
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    broken = make_agent(db_url, {"hourly": HOURLY}, queue=_FailingQueue())
    report = broken.tick(at("2026-01-01T13:00:05"))
    broken.close()
    assert report.errors and "unreachable" in report.errors[0]
    (run,) = runs_of(agent, "hourly")
    assert run["status"] == "pending"                          # claimed, not lost
    again = agent.tick(at("2026-01-01T13:01:00"))
    assert [r["run_id"] for r in again.dispatched] == [run["run_id"]]
    assert agent.queue.run_messages() == 1


def test_crash_between_claim_and_enqueue_is_redispatched_after_the_dispatch_lease(agent_factory):
    agent = agent_factory({"hourly": HOURLY}, AGENT_DISPATCH_LEASE_SECONDS="60")
    agent.tick(at("2026-01-01T12:30:00"))
    store = agent.store()
    now = at("2026-01-01T13:00:05")
    store.execute("claim_slots", now=now, slots=[
        {"job_name": "hourly", "scheduled_for": store.json_time(at("2026-01-01T13:00:00")), "status": "pending",
         "note": None}])
    store.execute("dispatch_runs", now=now, late_cutoff=now - timedelta(seconds=120), max_concurrency=10,
                  lookahead_until=now, ahead_limit=10, dispatch_lease_seconds=60)
    # ...the process died here: the run is queued, no message was sent.
    assert agent.queue.run_messages() == 0
    # The reconciliation query shows it once its dispatch lease has lapsed.
    from shared.engine.views import stuck_view

    stuck = stuck_view(store, at("2026-01-01T13:01:10"), older_than=3670)
    assert [(r["status"], r["job_name"]) for r in stuck] == [("queued", "hourly")]
    assert agent.tick(at("2026-01-01T13:00:30")).dispatched == []   # lease still running
    report = agent.tick(at("2026-01-01T13:01:10"))                   # lease expired
    (run,) = [r for r in report.dispatched if r["scheduled_for"] == at("2026-01-01T13:00:00")]
    assert run["token"] == 3                                         # dispatch 1, expiry 2, dispatch 3
    bodies = [json.loads(m.body) for m in agent.queue.receive(10, 30)]
    assert [b["token"] for b in bodies if b.get("run_id") == run["run_id"]] == [3]


def test_concurrency_cap_holds_runs_back(agent_factory):
    agent = agent_factory({f"j{i}": HOURLY for i in range(5)}, AGENT_MAX_CONCURRENCY="2")
    agent.tick(at("2026-01-01T12:30:00"))
    report = agent.tick(at("2026-01-01T13:00:05"))
    assert len(report.claimed) == 5 and len(report.dispatched) == 2
    statuses = sorted(r[0] for r in query(agent, f"SELECT status FROM {runs_table(agent)}"))
    assert statuses == ["pending"] * 3 + ["queued"] * 2


def test_the_extended_schedule_form_is_claimed_slot_by_slot(agent_factory):
    """SQL Agent's "last weekday of every 2nd month, 22:00" and "every 7 minutes from 08:03": the
    claim follows the extended form's slots (issue 33), on every dialect."""
    agent = agent_factory({
        "month_end": {"SCHEDULE": "0 0 22 * * MON-FRI#L ; every 2 months ; from 2026-01-01", "COMMAND": "SELECT 1",
                      "TIMEZONE": "Europe/London"},
        "window": {"SCHEDULE": "* * 8-17 * * * ; every 7 minutes ; between 08:03 and 17:45", "COMMAND": "SELECT 1"},
    })
    agent.tick(at("2026-01-05T08:00:00"))
    assert job_row(agent, "month_end")["next_due_at"] == at("2026-01-30T22:00:00")   # Friday 30 January
    assert job_row(agent, "window")["next_due_at"] == at("2026-01-05T08:03:00")
    agent.tick(at("2026-01-05T08:03:01"))
    assert [r["scheduled_for"] for r in runs_of(agent, "window")] == [at("2026-01-05T08:03:00")]
    assert job_row(agent, "window")["next_due_at"] == at("2026-01-05T08:10:00")
    agent.tick(at("2026-01-30T22:00:01"))
    assert [r["scheduled_for"] for r in runs_of(agent, "month_end")] == [at("2026-01-30T22:00:00")]
    # March 31 is a Tuesday, and BST has not begun (29 March: it has: 22:00 BST = 21:00 UTC).
    assert job_row(agent, "month_end")["next_due_at"] == at("2026-03-31T21:00:00")


def test_jitter_moves_each_slot_by_its_own_delay_claimed_once_by_every_instance(agent_factory, db_url, capsys):
    """JOB__<name>__JITTER_SECONDS (issue 33 item 3): the run of each slot is keyed by the slot
    plus the job's delay for it; two instances claim it once; `next` shows the same times."""
    from shared.cli.commands import main as cli
    from shared.jobs.schedules import jitter_offset

    jobs = {"spread": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1", "JITTER_SECONDS": "1800"},
            "tight": {"SCHEDULE": "*/20 * * * * *", "COMMAND": "SELECT 1", "JITTER_SECONDS": "600"}}
    agent = agent_factory(jobs)
    other = make_agent(db_url, jobs, queue=MemoryQueue())
    agent.tick(at("2026-01-01T00:30:00"))
    capsys.readouterr()
    assert cli(["--db", db_url, "next", "spread", "--count", "3", "--from", "2026-01-01T00:30:00Z", "--json"]) == 0
    preview = [datetime.fromisoformat(s["at"]) for s in json.loads(capsys.readouterr().out)["slots"]]
    notes = []
    for hour in range(1, 4):
        notes += [r["note"] for r in agent.tick(at(f"2026-01-01T0{hour}:00:00") + timedelta(seconds=1)).claimed
                  if r["job_name"] == "spread"]
        other.tick(at(f"2026-01-01T0{hour}:00:00") + timedelta(seconds=2))
    other.close()
    rows = [r for r in runs_of(agent, "spread") if r["scheduled_for"] >= at("2026-01-01T01:00:00")]
    slots = [at(f"2026-01-01T0{h}:00:00") for h in range(1, 4)]
    expected = [s + timedelta(seconds=jitter_offset("spread", s, s + timedelta(hours=1), 1800)) for s in slots]
    assert [r["scheduled_for"] for r in rows] == expected == preview
    assert all(0 <= (e - s).total_seconds() <= 1800 for e, s in zip(expected, slots))
    assert len({(e - s).total_seconds() for e, s in zip(expected, slots)}) > 1
    assert notes == [f"jitter: +{int((e - s).total_seconds())} s from {s.isoformat()}" if e != s else None
                     for e, s in zip(expected, slots)]
    # every 20 s with 600 s of jitter: each run before the next slot, in order, one per slot
    tight = [r["scheduled_for"] for r in runs_of(agent, "tight")]
    assert tight == sorted(tight) and len(tight) == len(set(tight))
    assert all((t - t.replace(second=t.second // 20 * 20)).total_seconds() < 20 for t in tight)
