"""Which poison a message reaches: the engine's poison table, or the host's `<queue>-poison`.

docs/queue.md ("Poison: the engine's table or the host's queue") lists the cases; each one names
the test that shows it. The engine records poison itself whenever it can (its table keeps the
body, every error and the run). The Functions host moves a message to `<queue>-poison` on its own
only when the function never ran, or could not return, on the last delivery it allows:

1. a body that is not valid base64 on a base64 queue (tests/e2e/test_e2e_azurite.py,
   test_wrong_encoding_and_garbage_go_to_poison_on_the_first_delivery);
2. the function raised on delivery host.json maxDequeueCount because the engine could not reach
   a verdict: the control database unreachable (below), or the engine unable to start;
3. the invocation failed without the function returning (its worker process crashed, or
   host.json functionTimeout ended it) on that delivery: the host treats it as 2;
4. a delivery whose dequeue count is already above maxDequeueCount (earlier deliveries ended
   with no verdict at all, e.g. the instance died mid-run): moved before the function runs.

These tests play the Functions host with the rules of its Storage queues extension 5.x
(extension bundle v4), `QueueProcessor` in Microsoft.Azure.WebJobs.Extensions.Storage.Queues:
BeginProcessingMessageAsync moves a message whose DequeueCount > MaxDequeueCount to the poison
queue without running the function; CompleteProcessingMessageAsync deletes it when the function
succeeded, else moves it when DequeueCount >= MaxDequeueCount, else releases it for redelivery.
Azurite holds the queue, PostgreSQL the control database (both required in CI).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from azure.functions.queue import QueueMessage

from shared.engine.agent import reset_default_agent
from shared.messaging.azure_storage import AzureStorageQueue
from shared.messaging.port import host_queue_options
from tests.e2e.test_e2e_azurite import (  # noqa: F401  (app: a pytest fixture)
    MARKER,
    App,
    app,
    due_now,
    marker_insert,
    peek,
    poison_rows,
    runs_of,
    user_function,
)
from tests.support.azurite import Azurite, azurite, azurite_server  # noqa: F401  (pytest fixtures)
from tests.support.harness import PG_BASE, execute, query

UTC = timezone.utc
HOST = host_queue_options()
PROCESSING_VISIBILITY_SECONDS = 600


@dataclass(frozen=True)
class Delivery:
    dequeue_count: int
    outcome: str                    # deleted | released | host-poison (after running) | host-poison-unrun
    error: BaseException | None = None


def host_deliver(queue: AzureStorageQueue) -> Delivery | None:
    """One delivery by the host's rules (QueueProcessor), through the real queue trigger."""
    messages = queue.receive(1, PROCESSING_VISIBILITY_SECONDS)
    if not messages:
        return None
    (message,) = messages
    if message.dequeue_count > HOST.max_dequeue_count:            # BeginProcessingMessageAsync
        queue.move_to_poison(message)
        return Delivery(message.dequeue_count, "host-poison-unrun")
    trigger = user_function("queue_trigger", "agent_execute")
    try:
        trigger(QueueMessage(id=message.id, body=message.body.encode("utf-8"),
                             dequeue_count=message.dequeue_count, pop_receipt=message.pop_receipt))
    except Exception as error:                                    # CompleteProcessingMessageAsync, failed
        if message.dequeue_count >= HOST.max_dequeue_count:
            queue.move_to_poison(message)
            return Delivery(message.dequeue_count, "host-poison", error)
        queue.release(message, 0)                                 # visibilityTimeout, shortened for the test
        return Delivery(message.dequeue_count, "released", error)
    queue.delete(message)
    return Delivery(message.dequeue_count, "deleted")


def host_deliver_all(queue: AzureStorageQueue, limit: int = 20) -> list[Delivery]:
    deliveries: list[Delivery] = []
    while (delivery := host_deliver(queue)) is not None:
        deliveries.append(delivery)
        assert len(deliveries) <= limit, deliveries
    return deliveries


def deliveries_without_a_verdict(queue: AzureStorageQueue, count: int) -> None:
    """`count` deliveries whose instance died mid-run: the host neither deleted, released nor
    moved the message; it became visible again when its hidden time ran out."""
    for _ in range(count):
        (message,) = queue.receive(1, PROCESSING_VISIBILITY_SECONDS)
        queue.release(message, 0)


def host_poison_bodies(app: App) -> list[str]:
    if not app.host_poison_exists():
        return []
    return [message.body for message in app.queue(name=app.queue_name + "-poison").receive(32, 60)]


def dispatched_again_and_run(app: App, agent, job: str) -> None:
    """Nothing is lost: the run's dispatch lease lapses, a tick sends a new doorbell, it runs."""
    (run,) = runs_of(agent, job)
    assert run["status"] == "queued", run
    lease = int(agent.settings.agent.dispatch_lease_seconds)
    report = agent.tick(datetime.now(UTC) + timedelta(seconds=lease + 1))
    assert [r["run_id"] for r in report.dispatched] == [run["run_id"]]
    assert [d.outcome for d in host_deliver_all(app.queue())] == ["deleted"]
    assert runs_of(agent, job)[0]["status"] == "succeeded"
    assert query(agent, "SELECT job FROM marker") == [(job,)]


def test_control_database_unreachable_on_the_last_delivery_goes_to_the_host_poison_queue(
        app: App, azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """Case 2: the engine cannot even record poison without its database, so it raises on every
    delivery; on delivery maxDequeueCount the host moves the message, intact, to <queue>-poison.
    The engine's poison table stays empty, and the run is dispatched again once the lease lapses."""
    agent = app.configure({"job": due_now(marker_insert("job"))})
    execute(agent, MARKER)
    agent.tick()
    ((_, stored),) = peek(azurite, app.queue_name)
    sent = base64.b64decode(stored).decode("utf-8")

    monkeypatch.setenv("AGENT_DB", PG_BASE + "Database=agent_test_no_such_database;")
    reset_default_agent()                                         # the trigger's agent: no database
    deliveries = host_deliver_all(app.queue())
    expected = [(n, "released") for n in range(1, HOST.max_dequeue_count)] + [(HOST.max_dequeue_count, "host-poison")]
    assert [(d.dequeue_count, d.outcome) for d in deliveries] == expected
    assert all(d.error is not None for d in deliveries)
    assert poison_rows(agent) == []
    assert host_poison_bodies(app) == [sent]

    monkeypatch.setenv("AGENT_DB", app.db)
    reset_default_agent()
    dispatched_again_and_run(app, agent, "job")


def test_a_delivery_above_the_host_limit_is_moved_by_the_host_before_the_function_runs(app: App) -> None:
    """Case 4, with AGENT_MAX_DEQUEUE_COUNT equal to host.json maxDequeueCount (the defaults):
    every allowed delivery ended with no verdict, so the next one is moved to <queue>-poison
    without running; the engine never sees it. The run is dispatched again once its lease lapses."""
    agent = app.configure({"job": due_now(marker_insert("job"))},
                          AGENT_MAX_DEQUEUE_COUNT=str(HOST.max_dequeue_count))
    execute(agent, MARKER)
    agent.tick()
    deliveries_without_a_verdict(app.queue(), HOST.max_dequeue_count)
    deliveries = host_deliver_all(app.queue())
    assert [(d.dequeue_count, d.outcome) for d in deliveries] == [(HOST.max_dequeue_count + 1, "host-poison-unrun")]
    assert poison_rows(agent) == [] and len(host_poison_bodies(app)) == 1
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(0,)]
    dispatched_again_and_run(app, agent, "job")


def test_below_the_host_limit_the_engine_records_a_delivery_that_never_reached_a_verdict(app: App) -> None:
    """With AGENT_MAX_DEQUEUE_COUNT below host.json maxDequeueCount, the delivery after the
    engine's threshold still reaches the engine, which poisons it in its table before running it
    (the run is marked poisoned); the host's <queue>-poison is never created."""
    threshold = HOST.max_dequeue_count - 2
    agent = app.configure({"job": due_now(marker_insert("job"))}, AGENT_MAX_DEQUEUE_COUNT=str(threshold))
    execute(agent, MARKER)
    agent.tick()
    deliveries_without_a_verdict(app.queue(), threshold)
    deliveries = host_deliver_all(app.queue())
    assert [(d.dequeue_count, d.outcome) for d in deliveries] == [(threshold + 1, "deleted")]
    (poison,) = poison_rows(agent)
    assert poison["dequeue_count"] == threshold + 1
    assert f"above AGENT_MAX_DEQUEUE_COUNT={threshold}" in poison["reason"]
    assert runs_of(agent, "job")[0]["status"] == "poisoned"
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(0,)]
    assert not app.host_poison_exists()
