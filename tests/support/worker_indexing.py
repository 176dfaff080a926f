"""What the Azure Functions host receives when the Python 3.13+ worker indexes a function app.

Run as `python -m tests.support.worker_indexing APP_DIR` (Python 3.13 or later, with
`azure-functions-runtime` installed: requirements.txt pins it there). It does what the worker
does when the host starts it: the worker (proxy_worker's dispatcher) hands its
WorkerInitRequest to the runtime library `azure_functions_runtime.handle_event`, whose
`worker_init_request` indexes `function_app.py` of the app directory (loader.index_function_app,
then process_indexed_function and get_fx_raw_bindings), and its `functions_metadata_request`
returns what the host reads: one RpcFunctionMetadata per function, with the JSON raw bindings
the host resolves `%SETTING%` expressions in. The indexing code is the runtime's own; this
module only calls it and prints the answer as JSON on stdout.

The one thing not the worker's own: its protobuf module (generated from the host's
FunctionRpc.proto inside the worker, which is not published as a package). The runtime builds
every message through `protos.<Message>(**fields)` and reads a few enum values; `PROTOS` below
stands in for that module with records that accept exactly the fields FunctionRpc.proto declares
for the messages of the indexing path (an unknown message or field raises, as protobuf does) and
the enum numbers the proto gives (BindingInfo.Direction in=0 out=1 inout=2, DataType
undefined=0 string=1 binary=2 stream=3, StatusResult.Status Failure=0 Success=1 Cancelled=2).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# Fields of the messages the indexing path builds (FunctionRpc.proto of the Functions host).
MESSAGE_FIELDS: dict[str, frozenset[str]] = {
    "WorkerInitResponse": frozenset({"worker_version", "capabilities", "result", "worker_metadata"}),
    "WorkerMetadata": frozenset({"runtime_name", "runtime_version", "worker_version", "worker_bitness",
                                 "custom_properties"}),
    "StatusResult": frozenset({"status", "result", "exception", "logs"}),
    "RpcException": frozenset({"source", "stack_trace", "message", "is_user_exception", "type"}),
    "FunctionMetadataResponse": frozenset({"function_metadata_results", "result", "use_default_metadata_indexing"}),
    "RpcFunctionMetadata": frozenset({"name", "directory", "script_file", "entry_point", "bindings", "is_proxy",
                                      "status", "language", "raw_bindings", "function_id",
                                      "managed_dependency_enabled", "retry_options", "properties"}),
    "BindingInfo": frozenset({"type", "direction", "data_type", "properties"}),
    "RpcRetryOptions": frozenset({"max_retry_count", "delay_interval", "minimum_interval", "maximum_interval",
                                  "retry_strategy"}),
}
ENUM_VALUES: dict[str, dict[str, int]] = {
    "BindingInfo": {"in": 0, "out": 1, "inout": 2, "undefined": 0, "string": 1, "binary": 2, "stream": 3},
    "StatusResult": {"Failure": 0, "Success": 1, "Cancelled": 2},
}


@dataclass(frozen=True)
class Message:
    """One message as the runtime built it: its type and the fields it set."""
    type: str
    fields: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name in MESSAGE_FIELDS.get(self.type, ()):
            return self.fields.get(name)
        raise AttributeError(f"{self.type} has no field {name!r}")


class MessageType:
    def __init__(self, name: str) -> None:
        self.name = name
        for constant, number in ENUM_VALUES.get(name, {}).items():
            setattr(self, constant, number)

    def __call__(self, **fields: Any) -> Message:
        unknown = set(fields) - MESSAGE_FIELDS[self.name]
        if unknown:
            raise ValueError(f'Protocol message {self.name} has no field(s) {sorted(unknown)}')
        return Message(self.name, fields)


class Protos(SimpleNamespace):
    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the indexing path asked for protos.{name}, which tests/support/worker_indexing.py "
                             "does not provide: add it from FunctionRpc.proto")


PROTOS = Protos(**{name: MessageType(name) for name in MESSAGE_FIELDS})


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return {"@type": value.type, **{name: _plain(item) for name, item in value.fields.items()}}
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


async def index(app_directory: str) -> dict[str, Any]:
    """The host's view of the app: the WorkerInitResponse and the FunctionMetadataResponse."""
    from azure_functions_runtime import handle_event

    init = SimpleNamespace(capabilities={}, function_app_directory=app_directory)
    request = SimpleNamespace(name="WorkerInitRequest", request=SimpleNamespace(worker_init_request=init),
                              properties={"protos": PROTOS, "host": "127.0.0.1"})
    init_response = await handle_event.worker_init_request(request)
    metadata = await handle_event.functions_metadata_request(
        SimpleNamespace(name="WorkerMetadataRequest", request=None))
    return {"runtime": handle_event.VERSION, "init": _plain(init_response), "metadata": _plain(metadata)}


def main(argv: list[str]) -> int:
    (app_directory,) = argv
    sys.path.insert(0, app_directory)        # as the worker does: the app's folder first on the path
    print(json.dumps(asyncio.run(index(app_directory))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
