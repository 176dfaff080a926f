"""The Functions triggers, invoked with real azure.functions objects, drive the engine."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest
from azure.functions.queue import QueueMessage
from azure.functions.timer import TimerRequest

from shared.engine.agent import reset_default_agent
from shared.messaging.messages import RunMessage
from tests.support.azurite import azurite, azurite_server  # noqa: F401  (pytest fixtures)
from tests.support.harness import ROOT, execute, make_agent, query

UTC = timezone.utc


@pytest.fixture
def app_settings(db_url, monkeypatch):
    """App settings as the host would set them, for the process-wide agent."""
    for key in [k for k in list(__import__("os").environ) if k.startswith(("JOB__", "AGENT_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AGENT_DB", db_url)
    monkeypatch.setenv("AGENT_QUEUE_NAME", "agent-tasks")
    monkeypatch.setenv("JOB__stamp__SCHEDULE", "@once " + datetime.now(UTC).isoformat())
    monkeypatch.setenv("JOB__stamp__COMMAND", "INSERT INTO marker (job) VALUES ('stamp')")
    reset_default_agent()
    yield db_url
    reset_default_agent()


def _user_function(blueprint_module, name):
    """The decorated function, as the host calls it (fn.build().get_user_function())."""
    function = getattr(blueprint_module, name)
    built = function.build()
    assert built.get_function_name() == name
    return built.get_user_function(), built


def test_function_app_registers_the_triggers_with_app_setting_bindings():
    import function_app

    functions = {f.get_function_name(): f for f in function_app.app.get_functions()}
    assert set(functions) == {"agent_tick", "agent_execute", "agent_monitor"}
    tick_binding = functions["agent_tick"].get_bindings()[0].get_dict_repr()
    assert tick_binding["schedule"] == "%AGENT_TICK_SCHEDULE%" and tick_binding["runOnStartup"] is False
    queue_binding = functions["agent_execute"].get_bindings()[0].get_dict_repr()
    assert queue_binding["queueName"] == "%AGENT_QUEUE_NAME%" and queue_binding["connection"] == "AzureWebJobsStorage"


def test_timer_then_queue_trigger_run_a_job(app_settings, azurite, monkeypatch):
    """The function app's path: the timer dispatches to the storage queue (Azurite), the queue
    trigger runs the job from the message."""
    from functions import queue_trigger, timer_trigger

    name = azurite.unique_name()
    for key, value in azurite.settings().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AGENT_QUEUE_NAME", name)
    reset_default_agent()
    azurite.queue(name).ensure_exists()
    agent = make_agent(app_settings, queue=azurite.queue(name))
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    tick, _ = _user_function(timer_trigger, "agent_tick")
    tick(TimerRequest(past_due=False))
    (message,) = agent.queue.receive(1, 30)
    execute_fn, _ = _user_function(queue_trigger, "agent_execute")
    execute_fn(QueueMessage(id=message.id, body=message.body.encode(), dequeue_count=message.dequeue_count,
                            pop_receipt=message.pop_receipt))
    assert query(agent, "SELECT job FROM marker") == [("stamp",)]
    (run,) = agent.store().execute("list_history", job_name="stamp", limit=5).rows
    assert run["status"] == "succeeded"
    agent.close()


def test_queue_trigger_poisons_a_malformed_message_and_returns(app_settings):
    from functions import queue_trigger

    agent = make_agent(app_settings)
    execute_fn, _ = _user_function(queue_trigger, "agent_execute")
    execute_fn(QueueMessage(id="abc", body=b"\xff\xfe not utf-8", dequeue_count=1))   # returns: host deletes it
    (poison,) = agent.store().execute("list_poison", limit=5).rows
    assert poison["message_id"] == "abc" and "UTF-8" in poison["reason"]
    agent.close()


def test_queue_trigger_at_threshold_poisons_instead_of_raising(app_settings, monkeypatch):
    from functions import queue_trigger

    agent = make_agent(app_settings)
    body = RunMessage(run_id=123456, token=1).to_json().encode()
    execute_fn, _ = _user_function(queue_trigger, "agent_execute")
    execute_fn(QueueMessage(id="m", body=body, dequeue_count=5))
    assert agent.store().execute("list_poison", limit=5).rows[0]["dequeue_count"] == 5
    agent.close()


def test_cold_import_of_function_app_stays_light():
    """The engine's heavy dependencies load at first use, not at import."""
    code = ("import sys, function_app; heavy = [m for m in ('pyodbc', 'azure.identity', 'azure.storage.queue', "
            "'opencensus', 'opentelemetry', 'azure.monitor', 'shared.telemetry.otel', 'croniter', 'shared.control.store', "
            "'icalendar', 'recurring_ical_events') "
            "if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
