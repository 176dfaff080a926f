"""function_app.py as the Azure Functions host sees it on Python 3.13: indexed by the real worker
runtime (`azure-functions-runtime`, pinned in requirements.txt for 3.13, the library the 3.13
worker loads the app with), not by our own reading of the decorators.

tests/support/worker_indexing.py runs the runtime's WorkerInitRequest and FunctionMetadataRequest
handlers in a fresh interpreter started in the app's folder, as the worker does, with no app
setting set (the host resolves `%SETTING%` later), and prints what the host would receive: each
function's name, script file, entry point, bindings, and the raw JSON bindings.

Python 3.13 or later only: the runtime library requires it. On an older interpreter the tests skip
(CI runs them in .venv313, scripts/test.sh's second environment, where they cannot skip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared import settings
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.version_info < (3, 13), reason="azure-functions-runtime (the 3.13 worker's "
                                "indexer) installs on Python 3.13 and later only; scripts/test.sh runs these in .venv313")

SUCCESS = 1           # StatusResult.Status.Success in FunctionRpc.proto
BINDING_IN, BINDING_OUT = 0, 1


def index(app_directory: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AGENT_", "JOB__", "PYTHONPATH"))}
    completed = subprocess.run([sys.executable, "-m", "tests.support.worker_indexing", str(app_directory)],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


@pytest.fixture(scope="module")
def host_view() -> dict:
    return index(ROOT)


def test_the_runtime_is_the_version_requirements_txt_pins(host_view: dict):
    pins = [line.split(";")[0].strip() for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
            if line.startswith("azure-functions-runtime==")]
    assert pins == [f"azure-functions-runtime=={host_view['runtime']}"]


def test_the_worker_indexes_the_app_without_error(host_view: dict):
    init = host_view["init"]
    assert init["result"] == {"@type": "StatusResult", "status": SUCCESS}, init["result"]
    assert init["worker_metadata"]["runtime_version"] == "%d.%d" % sys.version_info[:2]
    assert host_view["metadata"]["result"]["status"] == SUCCESS
    # The worker indexes (the host does not read function.json files): use_default_metadata_indexing false.
    assert host_view["metadata"]["use_default_metadata_indexing"] is False


def _functions(host_view: dict) -> dict[str, dict]:
    return {function["name"]: function for function in host_view["metadata"]["function_metadata_results"]}


def test_the_host_receives_the_three_functions_their_triggers_and_bindings(host_view: dict):
    functions = _functions(host_view)
    assert set(functions) == {"agent_tick", "agent_execute", "agent_monitor"}
    for name, function in functions.items():
        assert (function["script_file"], function["entry_point"], function["language"]) == ("function_app.py", name, "python")
        assert function["properties"] == {"worker_indexed": "True"}
        assert function.get("retry_options") is None          # retries are the engine's, not the host's
    bindings = {name: {binding: (info["type"], info["direction"]) for binding, info in function["bindings"].items()}
                for name, function in functions.items()}
    assert bindings == {
        "agent_tick": {"timer": ("timerTrigger", BINDING_IN)},
        "agent_execute": {"message": ("queueTrigger", BINDING_IN)},
        "agent_monitor": {"req": ("httpTrigger", BINDING_IN), "$return": ("http", BINDING_OUT)},
    }


def _raw_bindings(host_view: dict) -> dict[str, list[dict]]:
    return {name: [json.loads(raw) for raw in function["raw_bindings"]] for name, function in _functions(host_view).items()}


def test_the_raw_bindings_the_host_reads(host_view: dict):
    raw = _raw_bindings(host_view)
    assert raw["agent_tick"] == [{"direction": "IN", "type": "timerTrigger", "name": "timer",
                                  "schedule": "%AGENT_TICK_SCHEDULE%", "runOnStartup": False, "useMonitor": True}]
    assert raw["agent_execute"] == [{"direction": "IN", "type": "queueTrigger", "name": "message",
                                     "queueName": "%AGENT_QUEUE_NAME%", "connection": "AzureWebJobsStorage"}]
    (trigger, output) = raw["agent_monitor"]
    assert trigger == {"direction": "IN", "type": "httpTrigger", "name": "req", "authLevel": "ANONYMOUS",
                       "route": "monitor/{*path}"}
    assert output == {"direction": "OUT", "type": "http", "name": "$return"}


def test_every_setting_expression_names_a_setting_the_engine_declares(host_view: dict):
    """The host resolves %NAME% from the app settings: each one must be a setting the engine
    declares (shared/settings.py, which tests/repo/test_infra.py keeps in step with the Bicep)."""
    import re

    expressions = {name for bindings in _raw_bindings(host_view).values() for binding in bindings
                   for value in binding.values() if isinstance(value, str) for name in re.findall(r"%([^%]+)%", value)}
    assert expressions == {"AGENT_TICK_SCHEDULE", "AGENT_QUEUE_NAME"}
    declared = {spec.name: spec for spec in settings.ENGINE_SETTINGS}
    assert expressions <= set(declared)
    assert all(declared[name].default for name in expressions), "the Bicep sets them, and locally they need a default"


def test_an_app_the_worker_cannot_index_is_reported_as_a_failure(tmp_path: Path):
    """The harness reports the worker's failure (it does not pass on an app that breaks): two
    FunctionApp instances at top level are refused by the runtime's loader."""
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\nfirst = func.FunctionApp()\nsecond = func.FunctionApp()\n", encoding="utf-8")
    init = index(tmp_path)["init"]
    assert init["result"]["status"] != SUCCESS
    assert "More than one" in init["result"]["exception"]["message"]
