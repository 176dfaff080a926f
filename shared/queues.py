"""The queue port: where the scheduler rings the doorbell and the executor answers it.

Two implementations share the contract (and the delivery semantics of Azure Storage
queues: a received message is hidden for a visibility timeout, its dequeue count grows on
every receive, and it stays until deleted with the receipt of its latest delivery):

* :class:`DatabaseQueue` — a table in the control database; the embedded default.
* ``shared.azure_queue.AzureStorageQueue`` — Azure Storage (Azurite locally).

``host.json`` is read by :func:`host_queue_options` so that the local runner treats a
failed message as the Functions host would (same visibility timeout, same
maxDequeueCount, same ``<queue>-poison`` queue).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from .errors import ConfigError, QueueError

if TYPE_CHECKING:
    from .store import Store

UTC = timezone.utc
HOST_JSON = Path(__file__).resolve().parent.parent / "host.json"


@dataclass(frozen=True)
class ReceivedMessage:
    id: str
    body: str
    dequeue_count: int
    pop_receipt: str
    inserted_at: datetime | None = None


class QueuePort(Protocol):
    name: str

    def ensure_exists(self) -> None: ...

    def send_many(self, bodies: Sequence[str]) -> None: ...

    def receive(self, max_messages: int, visibility_timeout: float) -> list[ReceivedMessage]: ...

    def delete(self, message: ReceivedMessage) -> None: ...

    def release(self, message: ReceivedMessage, visibility_timeout: float) -> None: ...

    def move_to_poison(self, message: ReceivedMessage) -> None: ...

    def depth(self) -> int: ...


class DatabaseQueue:
    """A queue in the control database (table ``queue_messages``)."""

    def __init__(self, store_provider: Callable[[], "Store"], name: str,
                 clock: Callable[[], datetime] | None = None) -> None:
        self._store = store_provider
        self.name = name
        self._clock = clock or (lambda: datetime.now(UTC))

    def ensure_exists(self) -> None:
        return None  # the table is created by the migrations

    def send_many(self, bodies: Sequence[str]) -> None:
        if not bodies:
            return
        try:
            self._store().execute("queue_send", queue_name=self.name, bodies=list(bodies), now=self._clock())
        except Exception as exc:
            raise QueueError(f"local queue {self.name!r}: cannot enqueue: {exc}") from exc

    def receive(self, max_messages: int, visibility_timeout: float) -> list[ReceivedMessage]:
        now = self._clock()
        rows = self._store().execute(
            "queue_receive", queue_name=self.name, now=now, limit=max(1, int(max_messages)),
            invisible_until=now + timedelta(seconds=visibility_timeout),
            pop_receipt=str(uuid.uuid4())).rows
        return [ReceivedMessage(id=str(r["message_id"]), body=r["body"], dequeue_count=int(r["dequeue_count"]),
                                pop_receipt=r["pop_receipt"], inserted_at=r["inserted_at"])
                for r in sorted(rows, key=lambda r: r["message_id"])]

    def delete(self, message: ReceivedMessage) -> None:
        self._store().execute("queue_delete", message_id=int(message.id), pop_receipt=message.pop_receipt)

    def release(self, message: ReceivedMessage, visibility_timeout: float) -> None:
        self._store().execute("queue_release", message_id=int(message.id), pop_receipt=message.pop_receipt,
                              visible_at=self._clock() + timedelta(seconds=visibility_timeout))

    def move_to_poison(self, message: ReceivedMessage) -> None:
        store = self._store()
        with store.transaction():
            store.execute("queue_send", queue_name=f"{self.name}-poison", bodies=[message.body], now=self._clock())
            store.execute("queue_delete", message_id=int(message.id), pop_receipt=message.pop_receipt)

    def depth(self) -> int:
        row = self._store().execute("queue_depth", queue_name=self.name, now=self._clock()).one()
        return int(row["total"]) if row else 0


@dataclass(frozen=True)
class HostQueueOptions:
    """The parts of host.json extensions.queues that decide delivery."""

    visibility_timeout_seconds: float = 0.0
    max_dequeue_count: int = 5
    message_encoding: str = "base64"
    batch_size: int = 16


def host_queue_options(path: Path | None = None) -> HostQueueOptions:
    file = path or HOST_JSON
    if not file.exists():
        return HostQueueOptions()
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(str(file), "<unreadable>", f"valid JSON ({exc})") from None
    queues = (document.get("extensions") or {}).get("queues") or {}
    return HostQueueOptions(
        visibility_timeout_seconds=parse_timespan(queues.get("visibilityTimeout", "00:00:00"),
                                                  f"{file.name} extensions.queues.visibilityTimeout"),
        max_dequeue_count=int(queues.get("maxDequeueCount", 5)),
        message_encoding=str(queues.get("messageEncoding", "base64")).lower(),
        batch_size=int(queues.get("batchSize", 16)),
    )


def parse_timespan(value: object, setting: str) -> float:
    """A .NET TimeSpan string ``[d.]hh:mm:ss[.fff]`` in seconds."""
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)", str(value).strip())
    if not match:
        raise ConfigError(setting, value, "a time span hh:mm:ss")
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)

