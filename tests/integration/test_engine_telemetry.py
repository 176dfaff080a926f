"""The engine's telemetry, asserted from what the real exporter posted to a loopback
ingestion endpoint: a tick and a run, a failure and a poison; one operation id from the
timer through the queue message to the SQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from shared.messaging.memory import MemoryQueue
from tests.support.appinsights_endpoint import AppInsightsEndpoint
from tests.support.harness import make_agent, work

UTC = timezone.utc


@pytest.fixture(params=["opentelemetry", "opencensus"])
def appinsights_endpoint(request):
    """The loopback endpoint, once per exporter (AGENT_TELEMETRY_EXPORTER)."""
    endpoint = AppInsightsEndpoint()
    endpoint.exporter = request.param
    try:
        yield endpoint
    finally:
        endpoint.close()


def _props(envelope):
    return envelope["data"]["baseData"].get("properties", {})


def _op(envelope):
    return envelope["tags"].get("ai.operation.id")


def _named(envelopes, name):
    return [e for e in envelopes if e["data"]["baseData"].get("name") == name]


def test_tick_run_failure_and_poison_are_reported(db_url, appinsights_endpoint):
    now = "@once " + datetime.now(UTC).isoformat()
    agent = make_agent(db_url, {"good": {"SCHEDULE": now, "COMMAND": "SELECT 1"},
                                "broken": {"SCHEDULE": now, "COMMAND": "SELECT * FROM missing_table",
                                           "MAX_ATTEMPTS": "1"},
                                "invalid": {"SCHEDULE": "whenever", "COMMAND": "SELECT 1"}},
                       queue=MemoryQueue(), APPLICATIONINSIGHTS_CONNECTION_STRING=appinsights_endpoint.connection_string,
                       AGENT_TELEMETRY_EXPORTER=appinsights_endpoint.exporter)
    try:
        report = agent.tick()
        agent.telemetry.flush()
        runs = {r["job_name"]: r for r in report.claimed}
        assert set(runs) == {"good", "broken"}

        events = appinsights_endpoint.events
        claimed = _named(events(), "RunClaimed")
        assert {_props(e)["job"] for e in claimed} == {"good", "broken"}
        for envelope in claimed + _named(events(), "RunDispatched"):
            run = runs[_props(envelope)["job"]]
            assert _op(envelope) == run["operation_id"]
            assert _props(envelope)["run_id"] == str(run["run_id"])
        (invalid,) = _named(events(), "JobConfigInvalid")
        assert _props(invalid)["job"] == "invalid" and "JOB__invalid__SCHEDULE" in _props(invalid)["error_message"]
        metric_names = {m["data"]["baseData"]["metrics"][0]["name"] for m in appinsights_endpoint.metrics()}
        assert {"TickDurationMs", "RunsDue", "RunsClaimed", "RunsDispatched"} <= metric_names

        agent.queue.send_many(["not a run message"])
        appinsights_endpoint.clear()
        work(agent)
        agent.telemetry.flush()
        good_op, broken_op = runs["good"]["operation_id"], runs["broken"]["operation_id"]

        (succeeded,) = _named(events(), "RunSucceeded")
        assert _op(succeeded) == good_op and _props(succeeded)["job"] == "good"
        assert _props(succeeded)["scheduled_for"].startswith(runs["good"]["scheduled_for"].strftime("%Y-%m-%dT"))
        (failed,) = _named(events(), "RunFailed")
        assert _op(failed) == broken_op and "missing_table" in _props(failed)["error_message"]
        (poisoned,) = _named(events(), "RunPoisoned")
        assert "malformed" in _props(poisoned)["error_message"]
        started = _named(events(), "RunStarted")
        assert {_op(e) for e in started} == {good_op, broken_op}

        # The job's SQL and the executor's own statements are dependencies of the run's operation.
        dependencies = appinsights_endpoint.dependencies()
        good_sql = [d for d in dependencies if d["data"]["baseData"]["name"] == "good"]
        broken_sql = [d for d in dependencies if d["data"]["baseData"]["name"] == "broken"]
        assert good_sql and good_sql[0]["data"]["baseData"]["success"] is True and _op(good_sql[0]) == good_op
        assert broken_sql and broken_sql[0]["data"]["baseData"]["success"] is False
        named_queries = {d["data"]["baseData"]["name"] for d in dependencies if _op(d) == good_op}
        assert "finish_run" in named_queries
        lag = [m for m in appinsights_endpoint.metrics() if m["data"]["baseData"]["metrics"][0]["name"]
               == "ScheduleLagSeconds"]
        # On OpenTelemetry a metric is an aggregate: no operation id (one item per job).
        expected = {None} if appinsights_endpoint.exporter == "opentelemetry" else {good_op, broken_op}
        assert lag and {_op(m) for m in lag} == expected
        assert {_props(m)["job"] for m in lag} == {"good", "broken"}
    finally:
        agent.close()


def test_without_connection_string_nothing_is_sent(db_url, appinsights_endpoint):
    agent = make_agent(db_url, {"good": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": "SELECT 1"}})
    try:
        agent.tick()
        work(agent)
        agent.telemetry.flush()
        assert agent.telemetry.enabled is False
        assert appinsights_endpoint.envelopes == []
    finally:
        agent.close()


def test_a_follow_up_run_is_reported_in_the_chain_s_operation(db_url, appinsights_endpoint):
    """JOB__b__AFTER=a: b's run takes a's operation id (the chain is one operation), and the end
    of a's run reports FollowUpStarted naming both runs."""
    agent = make_agent(db_url, {"a": {"COMMAND": "SELECT 1"}, "b": {"COMMAND": "SELECT 2", "AFTER": "a"}},
                       queue=MemoryQueue(), APPLICATIONINSIGHTS_CONNECTION_STRING=appinsights_endpoint.connection_string,
                       AGENT_TELEMETRY_EXPORTER=appinsights_endpoint.exporter)
    try:
        from shared.engine.dispatch import dispatch

        agent.tick()
        first = agent.request_run_now("a")
        dispatch(agent.store(), agent.queue, agent.settings, agent.clock(), agent.telemetry)
        work(agent)
        agent.telemetry.flush()
        events = appinsights_endpoint.events
        (started,) = _named(events(), "FollowUpStarted")
        assert _props(started)["job"] == "b" and _props(started)["followed_run_id"] == str(first["run_id"])
        assert _op(started) == first["operation_id"]
        succeeded = {_props(e)["job"]: e for e in _named(events(), "RunSucceeded")}
        assert set(succeeded) == {"a", "b"}
        assert _op(succeeded["b"]) == _op(succeeded["a"]) == first["operation_id"]
        assert _props(succeeded["b"])["run_id"] == _props(started)["run_id"]
    finally:
        agent.close()
