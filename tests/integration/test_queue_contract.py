"""The in-memory queue the engine tests use keeps Azure Storage queues' contract: the same
checks run against it and against Azurite (the official emulator), so it cannot drift."""

from __future__ import annotations

import time

import pytest

from shared.messaging.memory import MemoryQueue
from tests.support.azurite import azurite, azurite_server  # noqa: F401  (pytest fixtures)


@pytest.fixture(params=["memory", "azurite"])
def queue(request):
    if request.param == "memory":
        return MemoryQueue()
    server = request.getfixturevalue("azurite")
    port = server.queue(server.unique_name("contract"))
    port.ensure_exists()
    return port


def test_a_message_is_delivered_with_a_growing_dequeue_count_until_deleted(queue):
    queue.send_many(["a"])
    (first,) = queue.receive(1, 1)
    assert first.body == "a" and first.dequeue_count == 1
    assert queue.receive(1, 1) == []                     # hidden while it is processed
    queue.release(first, 0)
    (second,) = queue.receive(1, 30)
    assert second.dequeue_count == 2
    queue.delete(second)
    assert queue.receive(1, 1) == [] and queue.depth() == 0


def test_a_delayed_message_stays_invisible_until_its_delay(queue):
    queue.send_many(["later", "now"], delays=[2, 0])
    (now,) = queue.receive(2, 30)
    assert now.body == "now"
    deadline = time.monotonic() + 10
    later = []
    while not later and time.monotonic() < deadline:
        later = queue.receive(1, 30)
        time.sleep(0.2)
    assert [m.body for m in later] == ["later"] and time.monotonic() < deadline


def test_a_message_past_its_time_to_live_is_gone(queue):
    queue.send_many(["short"], delays=[0], time_to_live=1)
    time.sleep(2.2)
    assert queue.receive(1, 1) == []


def test_a_stale_receipt_does_not_delete_the_redelivered_message(queue):
    queue.send_many(["x"])
    (first,) = queue.receive(1, 0)          # hidden for the service's minimum of 1 s
    assert queue.receive(1, 30) == []
    time.sleep(1.3)
    (second,) = queue.receive(1, 30)
    queue.delete(first)                     # the first delivery's receipt is no longer valid
    assert queue.depth() == 1
    queue.delete(second)
    assert queue.depth() == 0
