"""An in-memory queue with Azure Storage queue semantics: the double the engine's tests and the
benchmarks (bench/) run the queue path on. The function app never uses it.

It keeps the contract of ``shared.messaging.port.QueuePort`` as the real service does: a message can
be sent invisible for a delay and with a time to live; a received message is hidden for a
visibility timeout, its dequeue count grows on every receive, and it stays until deleted with
the receipt of its latest delivery. ``tests/integration/test_queue_contract.py`` runs the same contract
against this queue and against Azurite, so it cannot drift from the real service; the engine's
end-to-end tests on Azurite cover the rest.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from shared.messaging.port import ReceivedMessage


@dataclass
class _Message:
    id: str
    body: str
    visible_at: float
    expires_at: float | None
    dequeue_count: int = 0
    pop_receipt: str | None = None


class MemoryQueue:
    def __init__(self, name: str = "agent-tasks", clock=time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._messages: dict[str, _Message] = {}
        self._order = itertools.count()
        self._lock = threading.Lock()
        self.poisoned: list[str] = []     # bodies moved to "<name>-poison"
        self.sent: list[tuple[str, float]] = []   # every (body, delay) sent, for assertions

    def ensure_exists(self) -> None:
        return None

    def send_many(self, bodies: Sequence[str], *, delays: Sequence[float] | None = None,
                  time_to_live: float | None = None) -> None:
        now = self._clock()
        with self._lock:
            for index, body in enumerate(bodies):
                delay = float(delays[index]) if delays is not None else 0.0
                key = f"{next(self._order):012d}-{uuid.uuid4().hex[:8]}"
                self._messages[key] = _Message(key, body, now + delay,
                                               None if time_to_live is None else now + time_to_live)
                self.sent.append((body, delay))

    def receive(self, max_messages: int, visibility_timeout: float) -> list[ReceivedMessage]:
        now = self._clock()
        out = []
        with self._lock:
            for key in sorted(self._messages):
                message = self._messages[key]
                if message.expires_at is not None and message.expires_at <= now:
                    del self._messages[key]
                    continue
                if message.visible_at > now:
                    continue
                message.dequeue_count += 1
                message.visible_at = now + max(1.0, visibility_timeout)   # the service's minimum: 1 s
                message.pop_receipt = uuid.uuid4().hex
                out.append(ReceivedMessage(id=message.id, body=message.body, dequeue_count=message.dequeue_count,
                                           pop_receipt=message.pop_receipt))
                if len(out) >= max_messages:
                    break
        return out

    def delete(self, message: ReceivedMessage) -> None:
        with self._lock:
            current = self._messages.get(message.id)
            if current is not None and current.pop_receipt == message.pop_receipt:
                del self._messages[message.id]

    def release(self, message: ReceivedMessage, visibility_timeout: float) -> None:
        with self._lock:
            current = self._messages.get(message.id)
            if current is not None and current.pop_receipt == message.pop_receipt:
                current.visible_at = self._clock() + visibility_timeout

    def move_to_poison(self, message: ReceivedMessage) -> None:
        with self._lock:
            self.poisoned.append(message.body)
        self.delete(message)

    def depth(self) -> int:
        now = self._clock()
        with self._lock:
            return sum(1 for m in self._messages.values() if m.expires_at is None or m.expires_at > now)

    def run_messages(self) -> int:
        """Run messages waiting (doorbells left out)."""
        with self._lock:
            return sum(1 for m in self._messages.values() if '"run_id"' in m.body)

    def visible(self) -> int:
        now = self._clock()
        with self._lock:
            return sum(1 for m in self._messages.values()
                       if m.visible_at <= now and (m.expires_at is None or m.expires_at > now))
