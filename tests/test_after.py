"""Jobs that follow jobs (issue 27 item 3): JOB__<b>__AFTER=<a> and agent.add_scheduled_job @after.

A run of a that ends with b's AFTER_OUTCOME starts a run of b in the transaction that records a's
end: no tick in between, exactly once whoever ends the run, with the chain's operation id and
the run it followed recorded (runs.followed_run_id)."""

from __future__ import annotations

import pytest

from shared.config import AfterOutcome, parse_jobs
from shared.dispatch import dispatch

from .conftest import Clock, at, make_agent, query, runs_table, work
from .memory_queue import MemoryQueue


def runs(agent) -> list[dict]:
    rows = query(agent, f"SELECT run_id, job_name, status, followed_run_id, operation_id, kind, note "
                        f"FROM {runs_table(agent)} ORDER BY run_id")
    names = ("run_id", "job_name", "status", "followed_run_id", "operation_id", "kind", "note")
    return [dict(zip(names, row)) for row in rows]


def start(agent, job: str) -> dict:
    """run-now, dispatched at once in queue mode (as the command does)."""
    row = agent.request_run_now(job)
    assert row is not None and row["status"] == "pending", row
    if agent.queue is not None:
        dispatch(agent.store(), agent.queue, agent.settings, agent.clock(), agent.telemetry)
    return row


# ---------------------------------------------------------------- settings

def test_after_and_after_outcome_parse_and_are_validated():
    valid, invalid = parse_jobs({
        "JOB__a__COMMAND": "SELECT 1",
        "JOB__b__COMMAND": "SELECT 2", "JOB__b__AFTER": "a",
        "JOB__c__COMMAND": "SELECT 3", "JOB__c__AFTER": "b", "JOB__c__AFTER_OUTCOME": "Failed",
        "JOB__d__COMMAND": "SELECT 4", "JOB__d__AFTER": "a", "JOB__d__AFTER_OUTCOME": "completed",
        "JOB__d__SCHEDULE": "0 0 3 * * *",
    })
    assert invalid == ()
    jobs = {job.name: job for job in valid}
    assert (jobs["a"].after, jobs["a"].after_outcome) == (None, AfterOutcome.SUCCEEDED)
    assert (jobs["b"].after, jobs["b"].after_outcome) == ("a", AfterOutcome.SUCCEEDED)
    assert (jobs["c"].after, jobs["c"].after_outcome) == ("b", AfterOutcome.FAILED)
    assert (jobs["d"].after, jobs["d"].after_outcome, jobs["d"].schedule) == ("a", AfterOutcome.COMPLETED, "0 0 3 * * *")

    _, invalid = parse_jobs({
        "JOB__a__COMMAND": "SELECT 1",
        "JOB__badname__COMMAND": "SELECT 1", "JOB__badname__AFTER": "no such/job",
        "JOB__missing__COMMAND": "SELECT 1", "JOB__missing__AFTER": "ghost",
        "JOB__outcome__COMMAND": "SELECT 1", "JOB__outcome__AFTER": "a", "JOB__outcome__AFTER_OUTCOME": "sometimes",
        "JOB__alone__COMMAND": "SELECT 1", "JOB__alone__AFTER_OUTCOME": "failed",
        "JOB__case__COMMAND": "SELECT 1", "JOB__case__AFTER": "A",
    })
    errors = {bad.name: bad.message for bad in invalid}
    assert set(errors) == {"badname", "missing", "outcome", "alone", "case"}
    assert "JOB__badname__AFTER='no such/job'" in errors["badname"] and "expected the name of another job" in errors["badname"]
    assert "JOB__missing__AFTER='ghost'" in errors["missing"] and "job of these settings" in errors["missing"]
    assert "JOB__outcome__AFTER_OUTCOME='sometimes'" in errors["outcome"]
    assert "succeeded or failed or completed" in errors["outcome"]
    assert "set without JOB__alone__AFTER" in errors["alone"]
    assert "as it is written: 'a'" in errors["case"]


def test_cycles_are_refused_naming_the_cycle_and_the_other_jobs_keep_running():
    valid, invalid = parse_jobs({
        "JOB__self__COMMAND": "SELECT 1", "JOB__self__AFTER": "self",
        "JOB__a__COMMAND": "SELECT 1", "JOB__a__AFTER": "b",
        "JOB__b__COMMAND": "SELECT 1", "JOB__b__AFTER": "a",
        "JOB__x__COMMAND": "SELECT 1", "JOB__x__AFTER": "z",
        "JOB__y__COMMAND": "SELECT 1", "JOB__y__AFTER": "x",
        "JOB__z__COMMAND": "SELECT 1", "JOB__z__AFTER": "y",
        "JOB__tail__COMMAND": "SELECT 1", "JOB__tail__AFTER": "x",      # follows into a cycle: itself fine
        "JOB__root__COMMAND": "SELECT 1",
        "JOB__leaf__COMMAND": "SELECT 1", "JOB__leaf__AFTER": "root",
    })
    errors = {bad.name: bad.message for bad in invalid}
    assert set(errors) == {"self", "a", "b", "x", "y", "z"}
    assert {job.name for job in valid} == {"tail", "root", "leaf"}
    assert "(self -> self:" in errors["self"]
    assert "(a -> b -> a:" in errors["a"] and "(b -> a -> b:" in errors["b"]
    # Run order: x's run starts y, y's starts z, z's starts x.
    assert "JOB__x__AFTER='z': a cycle of jobs that follow each other (x -> y -> z -> x:" in errors["x"]
    assert "(z -> x -> y -> z:" in errors["z"]
    assert all("remove AFTER from one of them" in message for message in errors.values())


# ---------------------------------------------------------------- chains run without ticks

@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_a_chain_runs_in_order_with_no_tick_between(db_url, mode):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {
        "a": {"COMMAND": "SELECT 1"},
        "b": {"COMMAND": "SELECT 2", "AFTER": "a"},
        "c": {"COMMAND": "SELECT 3", "AFTER": "b"},
        "other": {"COMMAND": "SELECT 4", "AFTER": "a", "AFTER_OUTCOME": "failed"},
    }, clock=clock, queue=MemoryQueue() if mode == "queue" else None)
    agent.tick()                                            # the sync; no tick after this
    first = start(agent, "a")
    work(agent)
    rows = runs(agent)
    assert [(r["job_name"], r["status"]) for r in rows] == [("a", "succeeded"), ("b", "succeeded"), ("c", "succeeded")]
    a, b, c = rows
    assert a["run_id"] == first["run_id"] and a["followed_run_id"] is None
    assert (b["followed_run_id"], c["followed_run_id"]) == (a["run_id"], b["run_id"])
    assert {r["operation_id"] for r in rows} == {first["operation_id"]}       # one operation: the chain
    assert b["kind"] == c["kind"] == "manual"
    assert b["note"] == f"after run {a['run_id']} of a (succeeded)"
