"""The queue message: a doorbell carrying ``{run_id, token}``, never SQL text.

``{"v": 1, "run_id": 42, "token": 7, "op": "<32 hex operation id>"}``

Validation is strict: anything else is malformed and goes to the poison table at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import MessageError

MESSAGE_VERSION = 1
MAX_MESSAGE_BYTES = 1024
_OPERATION_ID = re.compile(r"^[0-9a-f]{32}$")
_FIELDS = {"v", "run_id", "token", "op"}


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


def decode_body(body: str | bytes) -> str:
    if isinstance(body, str):
        return body
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise MessageError("body is not UTF-8 text") from None


def parse_message(body: str | bytes) -> RunMessage:
    text = decode_body(body)
    if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
        raise MessageError(f"body is {len(text)} characters; a run message is at most {MAX_MESSAGE_BYTES} bytes")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MessageError(f"body is not JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(document, dict):
        raise MessageError(f"body is JSON {type(document).__name__}; expected an object with v, run_id and token")
    unknown = set(document) - _FIELDS
    if unknown:
        raise MessageError(f"unknown field(s) {sorted(unknown)}; expected only {sorted(_FIELDS)}")
    version = document.get("v")
    if version != MESSAGE_VERSION or isinstance(version, bool):
        raise MessageError(f"field v={version!r}: expected message version {MESSAGE_VERSION}")
    run_id = _positive_int(document, "run_id")
    token = _positive_int(document, "token")
    operation_id = document.get("op")
    if operation_id is not None and (not isinstance(operation_id, str) or not _OPERATION_ID.match(operation_id)
                                     or operation_id == "0" * 32):
        raise MessageError(f"field op={operation_id!r}: expected 32 lowercase hex characters, not all zeros")
    return RunMessage(run_id=run_id, token=token, operation_id=operation_id)


def _positive_int(document: dict, name: str) -> int:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MessageError(f"field {name}={value!r}: expected a positive whole number")
    return value
