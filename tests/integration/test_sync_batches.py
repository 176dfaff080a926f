"""The settings sync in batches (scheduler.sync_batches): a job's calendars travel whole with
it, so a thousand jobs naming big calendars were one statement over what the server takes
(PostgreSQL dropped the connection, SQLite refused the string) and nothing synced, ever. Each
statement of the sync now carries at most SYNC_BATCH_BYTES of JSON. Here the limit is made small
so that 60 jobs take several batches, and the sync must do exactly what one batch does: every
job defined, a changed schedule re-plans its claimed runs, a removed job is unconfigured."""

from __future__ import annotations

from shared.engine import scheduler
from tests.integration.test_schedule_hardening import history, live
from tests.support.harness import at, make_agent

def _jobs(count: int, schedule: str = "0 0 * * * *", skip: set[int] = frozenset()) -> dict:
    return {f"job_{n:03d}": {"SCHEDULE": schedule, "COMMAND": "SELECT 1", "JITTER_SECONDS": "0"}
            for n in range(count) if n not in skip}


def _state(agent) -> dict[str, tuple]:
    rows = agent.store().execute("list_jobs").rows
    return {r["job_name"]: (r["schedule"], r["configured"], r["valid"]) for r in rows}


def test_a_sync_in_many_batches_does_what_one_batch_does(db_url, monkeypatch):
    assert len(scheduler.sync_batches([{"job_name": f"j{n}", "x": "y" * 100} for n in range(60)])) == 1
    monkeypatch.setattr(scheduler, "SYNC_BATCH_BYTES", 2_000)
    assert len(scheduler.sync_batches([{"job_name": f"j{n}", "x": "y" * 100} for n in range(60)])) > 3

    agent = make_agent(db_url, _jobs(60))
    agent.tick(at("2026-12-04T09:59:30"))
    state = _state(agent)
    assert len(state) == 60 and set(state.values()) == {("0 0 * * * *", 1, 1)}
    assert [str(r["scheduled_for"])[11:16] for r in live(history(agent, "job_059"))] == ["10:00"]

    # Another schedule for every job and job_007 removed: in batches, as in one.
    changed = make_agent(db_url, _jobs(60, "0 30 * * * *", skip={7}))
    changed.tick(at("2026-12-04T09:59:40"))
    state = _state(changed)
    assert state.pop("job_007") == ("0 0 * * * *", 0, 1)
    assert set(state.values()) == {("0 30 * * * *", 1, 1)}
    # the 10:00 runs claimed ahead under the old schedule are skipped (every batch), none runs
    for name in ("job_000", "job_031", "job_059", "job_007"):
        assert not [r for r in live(history(changed, name)) if str(r["scheduled_for"])[11:16] == "10:00"], name
