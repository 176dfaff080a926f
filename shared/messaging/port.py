"""The queue port: where dispatch rings the doorbell and the queue trigger answers it.

The contract is Azure Storage queues' (``shared.messaging.azure_storage.AzureStorageQueue``; Azurite
locally): a message may be sent invisible for a delay (up to 7 days) and with a time to live;
a received message is hidden for a visibility timeout, its dequeue count grows on every
receive, and it stays until deleted with the receipt of its latest delivery. Without a storage
queue the local runner needs none: its workers claim straight from agent.runs.

``host.json`` is read by :func:`host_queue_options` so that the local runner treats a
failed message as the Functions host would (same visibility timeout, same
maxDequeueCount, same ``<queue>-poison`` queue).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol, Sequence

from shared.errors import ConfigError

UTC = timezone.utc
HOST_JSON = Path(__file__).resolve().parents[2] / "host.json"


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

    def send_many(self, bodies: Sequence[str], *, delays: Sequence[float] | None = None,
                  time_to_live: float | None = None) -> None: ...

    def receive(self, max_messages: int, visibility_timeout: float) -> list[ReceivedMessage]: ...

    def delete(self, message: ReceivedMessage) -> None: ...

    def release(self, message: ReceivedMessage, visibility_timeout: float) -> None: ...

    def move_to_poison(self, message: ReceivedMessage) -> None: ...

    def depth(self) -> int: ...


@dataclass(frozen=True)
class HostQueueOptions:
    """The parts of host.json extensions.queues that decide delivery."""

    visibility_timeout_seconds: float = 0.0
    max_dequeue_count: int = 5
    message_encoding: str = "base64"
    batch_size: int = 16
    # The longest an idle consumer waits between polls (the host's default: one minute).
    max_polling_interval_seconds: float = 60.0


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
        max_polling_interval_seconds=parse_timespan(queues.get("maxPollingInterval", "00:01:00"),
                                                    f"{file.name} extensions.queues.maxPollingInterval"),
    )


# The host's shortest wait between polls of an idle queue (QueuePollingIntervals.Minimum).
MIN_POLLING_INTERVAL_SECONDS = 0.1


def next_polling_interval(previous: float | None, found_message: bool, maximum: float,
                          random: float = 0.5) -> float:
    """How long an idle queue consumer waits before polling again, as the Functions host's
    queue listener does: right away again after a message; when the queue was empty, a
    randomized exponential back-off from 100 ms up to host.json's maxPollingInterval.
    ``random`` in [0, 1) spreads consumers (0.5: no jitter)."""
    if found_message:
        return 0.0
    maximum = max(MIN_POLLING_INTERVAL_SECONDS, maximum)
    base = MIN_POLLING_INTERVAL_SECONDS if not previous else min(maximum, previous * 2)
    jittered = base * (0.8 + 0.4 * random)       # +-20%
    return min(maximum, max(MIN_POLLING_INTERVAL_SECONDS, jittered))


def parse_timespan(value: object, setting: str) -> float:
    """A .NET TimeSpan string ``[d.]hh:mm:ss[.fff]`` in seconds."""
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)", str(value).strip())
    if not match:
        raise ConfigError(setting, value, "a time span hh:mm:ss")
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)

