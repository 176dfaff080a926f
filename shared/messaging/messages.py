"""Queue messages: doorbells, never SQL text.

* a run message ``{"v": 1, "run_id": 42, "token": 7, "op": "<32 hex operation id>"}`` asks the
  queue trigger to start run 42 if token 7 is still its current token;
* a doorbell ``{"v": 1, "doorbell": 1795000000}`` (the tick period it belongs to, in Unix
  seconds) asks it only to dispatch what became runnable: the chain the tick leaves between
  two ticks, so that work inserted behind the agent's back starts within AGENT_POLL_SECONDS.

Validation is strict: anything else is malformed and goes to the poison table at once.
Numbers are checked against the columns they land in (BIGINT), so an out-of-range value is
malformed too, never a crash of the handler.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from shared.errors import MessageError

MESSAGE_VERSION = 1
MAX_MESSAGE_BYTES = 1024
BIGINT_MAX = 2 ** 63 - 1
_OPERATION_ID = re.compile(r"^[0-9a-f]{32}\Z")
_RUN_FIELDS = {"v", "run_id", "token", "op"}
_DOORBELL_FIELDS = {"v", "doorbell"}


@dataclass(frozen=True)
class RunMessage:
    run_id: int
    token: int
    operation_id: str | None = None

    def to_json(self) -> str:
        document: dict[str, object] = {"v": MESSAGE_VERSION, "run_id": self.run_id, "token": self.token}
        if self.operation_id:
            document["op"] = self.operation_id
        return json.dumps(document, separators=(",", ":"))


@dataclass(frozen=True)
class DoorbellMessage:
    period: int  # the tick period (Unix seconds of the tick that rang it)

    def to_json(self) -> str:
        return json.dumps({"v": MESSAGE_VERSION, "doorbell": self.period}, separators=(",", ":"))


def decode_body(body: str | bytes) -> str:
    if isinstance(body, str):
        return body
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise MessageError("body is not UTF-8 text") from None


def parse_message(body: str | bytes) -> RunMessage | DoorbellMessage:
    text = decode_body(body)
    if len(text.encode("utf-8", errors="replace")) > MAX_MESSAGE_BYTES:
        raise MessageError(f"body is {len(text)} characters; a run message is at most {MAX_MESSAGE_BYTES} bytes")
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        reason = f"{exc.msg} at position {exc.pos}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise MessageError(f"body is not JSON ({reason})") from None
    if not isinstance(document, dict):
        raise MessageError(f"body is JSON {type(document).__name__}; expected an object with v, run_id and token")
    version = document.get("v")
    if version != MESSAGE_VERSION or isinstance(version, bool):
        raise MessageError(f"field v={_shown(version)}: expected message version {MESSAGE_VERSION}")
    if "doorbell" in document:
        unknown = set(document) - _DOORBELL_FIELDS
        if unknown:
            raise MessageError(f"unknown field(s) {sorted(unknown)} in a doorbell; expected only {sorted(_DOORBELL_FIELDS)}")
        return DoorbellMessage(period=_bounded_int(document, "doorbell", 0))
    unknown = set(document) - _RUN_FIELDS
    if unknown:
        raise MessageError(f"unknown field(s) {sorted(unknown)}; expected only {sorted(_RUN_FIELDS)}")
    run_id = _bounded_int(document, "run_id", 1)
    token = _bounded_int(document, "token", 1)
    operation_id = document.get("op")
    if operation_id is not None and (not isinstance(operation_id, str) or not _OPERATION_ID.match(operation_id)
                                     or operation_id == "0" * 32):
        raise MessageError(f"field op={_shown(operation_id)}: expected 32 lowercase hex characters, not all zeros")
    return RunMessage(run_id=run_id, token=token, operation_id=operation_id)


def _bounded_int(document: dict, name: str, low: int) -> int:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= BIGINT_MAX:
        raise MessageError(f"field {name}={_shown(value)}: expected a whole number from {low} to {BIGINT_MAX}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
