"""shared.telemetry.client against the real opencensus-ext-azure transport and a loopback ingestion
endpoint (tests/support/appinsights_endpoint.py): what is POSTed, how failures of ingestion are
absorbed, and that the no-op path neither imports opencensus nor sends anything."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.telemetry.client import (
    EVENT_NAMES,
    METRIC_NAMES,
    AppInsightsTelemetry,
    Telemetry,
    is_valid_operation_id,
    new_operation_id,
    parse_authentication_string,
    parse_connection_string,
)
from shared.telemetry.factory import create_telemetry, create_telemetry_from_env
from tests.support.appinsights_endpoint import (  # noqa: F401 (pytest fixtures)
    AppInsightsEndpoint,
    appinsights_endpoint,
    silent_endpoint,
    unused_port,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["opentelemetry", "opencensus"])
def exporter(request) -> str:
    """Every test that sends runs once per exporter (AGENT_TELEMETRY_EXPORTER)."""
    return request.param


@pytest.fixture
def appinsights_endpoint(exporter):  # noqa: F811 (overrides the shared fixture per exporter)
    endpoint = AppInsightsEndpoint()
    endpoint.exporter = exporter
    try:
        yield endpoint
    finally:
        endpoint.close()


def otel(endpoint_or_name) -> bool:
    name = getattr(endpoint_or_name, "exporter", endpoint_or_name)
    return name == "opentelemetry"


def result_code(dependency: dict, endpoint) -> str:
    """A dependency's result code: customDimensions.result_code with either exporter; the
    resultCode column agrees on OpenCensus and is "0" for every SQL call on OpenTelemetry."""
    body = dependency["data"]["baseData"]
    code = body["properties"]["result_code"]
    assert body["resultCode"] == ("0" if otel(endpoint) else code)
    return code


def props(envelope: dict) -> dict:
    """customDimensions as sent, without the logger name the OpenTelemetry exporter adds to
    every log-based item (events)."""
    properties = dict(envelope["data"]["baseData"]["properties"])
    properties.pop("logger_name", None)
    return properties


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with the repo on sys.path (a clean sys.modules)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("APPLICATIONINSIGHTS_")}
    full_env["PYTHONPATH"] = str(REPO)
    full_env.update(env or {})
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"subprocess failed:\n{result.stdout}\n{result.stderr}"
    return result


def run_dimensions(op: str | None = None) -> dict[str, object]:
    return {"job": "nightly-purge", "run_id": 42, "attempt": 2,
            "scheduled_for": dt.datetime(2025, 3, 30, 1, 30, tzinfo=dt.timezone.utc),
            "token": 7, "outcome": "failed", "error_number": 40613,
            "error_message": "Database 'agent' on server 'x' is not currently available."}


# -- the no-op path -----------------------------------------------------------------

@pytest.mark.parametrize("value", [None, "", "   "])
def test_no_connection_string_gives_the_noop(value):
    telemetry = create_telemetry(value)
    assert type(telemetry) is Telemetry and telemetry.enabled is False
    op = new_operation_id()
    assert telemetry.event("RunStarted", run_dimensions(), operation_id=op) is None
    assert telemetry.metric("RunDurationMs", 12.5, {"job": "j"}, operation_id=op) is None
    assert telemetry.dependency("claim", target="db", duration_ms=3, success=True) is None
    with telemetry.sql_call("claim", target="db", operation_id=op) as call:
        call.properties["rows"] = 3
    assert telemetry.flush() is None
    assert telemetry.close() is None


def test_noop_sql_call_reraises_the_same_exception():
    telemetry = create_telemetry(None)
    error = RuntimeError("deadlock victim (1205)")
    with pytest.raises(RuntimeError) as raised:
        with telemetry.sql_call("complete_run", target="db"):
            raise error
    assert raised.value is error


def test_noop_does_not_import_opencensus_and_is_fast():
    """In a fresh interpreter, with the connection string unset: using every method of the
    no-op imports no exporter (nor requests/azure), and 20,000 calls take well under a second."""
    result = run_python("""
        import json, sys, time
        from shared.telemetry.client import new_operation_id, Telemetry
        from shared.telemetry.factory import create_telemetry_from_env
        t = create_telemetry_from_env()
        assert type(t) is Telemetry, type(t)
        op = new_operation_id()
        started = time.perf_counter()
        for i in range(10_000):
            t.event("RunSucceeded", {"job": "j", "run_id": i, "attempt": 1}, operation_id=op)
            t.metric("RunDurationMs", i, {"job": "j"}, operation_id=op)
        with t.sql_call("claim_due", target="db", operation_id=op):
            pass
        t.dependency("x", target="db", duration_ms=1.0, success=False)
        t.flush(); t.close()
        elapsed = time.perf_counter() - started
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("opencensus", "requests", "azure"))
        print(json.dumps({"loaded": loaded, "elapsed": elapsed}))
    """)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["elapsed"] < 1.0, report


def test_importing_the_module_never_imports_an_exporter(appinsights_endpoint, tmp_path):
    """Even with the connection string set, import stays light; the exporter chosen by
    AGENT_TELEMETRY_EXPORTER arrives when the real telemetry is created, and that one sends."""
    result = run_python("""
        import json, sys
        import shared.telemetry.factory as telemetry
        def loaded():
            return sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("opencensus", "opentelemetry")}
                          | {"azure.monitor" for m in sys.modules if m.startswith("azure.monitor")})
        before = loaded()
        t = telemetry.create_telemetry_from_env()
        after = loaded()
        t.event("RunClaimed", {"job": "j"})
        t.flush()
        print(json.dumps({"before": before, "after": after, "type": type(t).__name__}))
    """, env={"APPLICATIONINSIGHTS_CONNECTION_STRING": appinsights_endpoint.connection_string,
              "TMPDIR": str(tmp_path), "AGENT_TELEMETRY_EXPORTER": appinsights_endpoint.exporter})
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if otel(appinsights_endpoint):
        assert report == {"before": [], "after": ["azure.monitor", "opentelemetry"],
                          "type": "OpenTelemetryTelemetry"}
    else:
        assert report == {"before": [], "after": ["opencensus"], "type": "AppInsightsTelemetry"}
    assert [e["data"]["baseData"]["name"] for e in appinsights_endpoint.events()] == ["RunClaimed"]


def test_the_exporter_setting_is_validated_and_defaults_to_opentelemetry(appinsights_endpoint, monkeypatch):
    from shared.telemetry.exporters import EXPORTER_SETTING, parse_exporter

    assert parse_exporter(None) == parse_exporter("  ") == "opentelemetry"
    assert parse_exporter(" OpenCensus ") == "opencensus"
    for bad in ("otel", "opencensus-ext-azure", "1"):
        with pytest.raises(ConfigError) as raised:
            parse_exporter(bad)
        assert (raised.value.setting, raised.value.value) == (EXPORTER_SETTING, bad)
        assert "opentelemetry, opencensus" in str(raised.value)
        env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": appinsights_endpoint.connection_string,
               EXPORTER_SETTING: bad}
        with pytest.raises(ConfigError):
            create_telemetry_from_env(env)
        with pytest.raises(ConfigError):  # also when telemetry is off: the setting is wrong
            create_telemetry_from_env({EXPORTER_SETTING: bad})
    monkeypatch.delenv(EXPORTER_SETTING, raising=False)
    t = create_telemetry(appinsights_endpoint.connection_string, enable_local_storage=False)
    try:
        assert type(t).__name__ == "OpenTelemetryTelemetry"
    finally:
        t.close()


# -- what is sent -------------------------------------------------------------------

def test_every_lifecycle_event_is_posted_with_dimensions_and_operation(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry(role_name="agent-prod")
    op = new_operation_id()
    for name in EVENT_NAMES:
        telemetry.event(name, run_dimensions(), operation_id=op)
    telemetry.flush()

    assert appinsights_endpoint.rejected == []
    assert [p.path for p in appinsights_endpoint.posts] == ["/v2.1/track"]
    post = appinsights_endpoint.posts[0]
    assert post.headers["content-type"].startswith("application/json")
    events = appinsights_endpoint.events()
    assert [e["data"]["baseData"]["name"] for e in events] == list(EVENT_NAMES)
    for envelope in events:
        assert envelope["name"] == "Microsoft.ApplicationInsights.Event"
        assert envelope["iKey"] == appinsights_endpoint.instrumentation_key
        assert envelope["tags"]["ai.operation.id"] == op
        # OpenCensus: a child of the operation root; OpenTelemetry: of the span id taken
        # from the operation id's low half (a log record's parent is a 16-hex span id).
        assert envelope["tags"]["ai.operation.parentId"] == (op[16:] if otel(appinsights_endpoint) else op)
        assert envelope["tags"]["ai.cloud.role"] == "agent-prod"
        assert envelope["time"].endswith("Z")
        assert props(envelope) == {
            "job": "nightly-purge", "run_id": "42", "attempt": "2",
            "scheduled_for": "2025-03-30T01:30:00.000000Z", "token": "7", "outcome": "failed",
            "error_number": "40613",
            "error_message": "Database 'agent' on server 'x' is not currently available."}


def test_property_values_are_converted_and_none_is_omitted(appinsights_endpoint):
    class Outcome(enum.Enum):
        SKIPPED = "skipped"

    telemetry = appinsights_endpoint.telemetry()
    paris = dt.timezone(dt.timedelta(hours=2))
    run_uuid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    telemetry.event("MisfireSkipped", {
        "job": "j", "error_number": None, "aware": dt.datetime(2025, 6, 1, 14, 0, tzinfo=paris),
        "naive": dt.datetime(2025, 6, 1, 12, 0, 0, 250000), "day": dt.date(2025, 6, 1),
        "ok": True, "ratio": 0.25, "amount": decimal.Decimal("1.50"), "uuid": run_uuid,
        "outcome": Outcome.SKIPPED, "error_message": "x" * 10_000})
    telemetry.flush()
    (event,) = appinsights_endpoint.events("MisfireSkipped")
    properties = props(event)
    assert properties.pop("error_message") == "x" * 8192  # the Application Insights value limit
    assert properties == {"job": "j", "aware": "2025-06-01T12:00:00.000000Z",
                     "naive": "2025-06-01T12:00:00.250000Z", "day": "2025-06-01", "ok": "true",
                     "ratio": "0.25", "amount": "1.50", "uuid": str(run_uuid), "outcome": "skipped"}
    # No operation given: none (OpenCensus) or a fresh one of its own (OpenTelemetry, where an
    # item always has a trace id), never the all-zero id that would group unrelated items.
    assert event["tags"].get("ai.operation.id", "x") != "0" * 32
    assert ("ai.operation.id" in event["tags"]) is otel(appinsights_endpoint)


def test_metrics_are_posted_with_name_value_and_dimensions(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    op = new_operation_id()
    for index, name in enumerate(METRIC_NAMES):
        telemetry.metric(name, index + 0.5, {"job": "j", "slot": None}, operation_id=op)
    telemetry.metric("RunsDue", 3)
    telemetry.flush()
    assert appinsights_endpoint.rejected == []
    metrics = appinsights_endpoint.metrics()

    def point(m):
        return (m["data"]["baseData"]["metrics"][0]["name"], m["data"]["baseData"]["metrics"][0]["value"],
                m["data"]["baseData"]["properties"])

    # One item per metric name and dimension set (OpenTelemetry aggregates a flush's
    # recordings of one name and dimensions into one item: value = sum, count = recordings).
    assert sorted(map(point, metrics), key=repr) == sorted(
        [(n, i + 0.5, {"job": "j"}) for i, n in enumerate(METRIC_NAMES)] + [("RunsDue", 3.0, {})], key=repr)
    for metric in metrics:
        assert metric["name"] == "Microsoft.ApplicationInsights.Metric"
        assert metric["data"]["baseData"]["metrics"][0].get("count", 1) == 1
        # A metric is an aggregate on OpenTelemetry: no operation id.
        expected_op = None if otel(appinsights_endpoint) or not metric["data"]["baseData"]["properties"] else op
        assert metric["tags"].get("ai.operation.id") == expected_op


def test_dependency_is_posted_as_remote_dependency(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    op = new_operation_id()
    before = dt.datetime.now(dt.timezone.utc)
    telemetry.dependency("complete_run", target="srv.database.windows.net|agent", duration_ms=1234.5,
                         success=False, operation_id=op, data="complete_run", result_code="40613",
                         properties={"run_id": 5})
    telemetry.flush()
    (dep,) = appinsights_endpoint.dependencies("complete_run")
    body = dep["data"]["baseData"]
    assert dep["name"] == "Microsoft.ApplicationInsights.RemoteDependency"
    assert body["type"] == "SQL"
    assert body["target"] == "srv.database.windows.net|agent"
    assert body["data"] == "complete_run"
    assert body["duration"] == "0.00:00:01.235"
    assert body["success"] is False
    assert result_code(dep, appinsights_endpoint) == "40613"
    assert body["properties"] == {"run_id": "5", "result_code": "40613"}
    assert len(body["id"]) == 16
    assert dep["tags"]["ai.operation.id"] == op
    # The item's time is when the call started: duration before it was recorded.
    started = dt.datetime.fromisoformat(dep["time"].replace("Z", "+00:00"))
    assert before - dt.timedelta(seconds=2) < started < before


def test_sql_call_times_the_block_and_records_failures(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    op = new_operation_id()
    with telemetry.sql_call("claim_due", target="pg|agent", operation_id=op, data="claim_due") as call:
        time.sleep(0.12)
        call.properties["rows"] = 3
    error = LookupError("Invalid object name 'dbo.missing' (208)")
    with pytest.raises(LookupError) as raised:
        with telemetry.sql_call("run_command", target="pg|agent", operation_id=op) as call:
            call.result_code = "208"
            raise error
    assert raised.value is error
    with pytest.raises(ZeroDivisionError):
        with telemetry.sql_call("heartbeat", target="pg|agent"):
            1 / 0
    telemetry.flush()

    ok_dep = appinsights_endpoint.dependencies("claim_due")[0]
    ok = ok_dep["data"]["baseData"]
    assert ok["success"] is True and result_code(ok_dep, appinsights_endpoint) == "0" and ok["type"] == "SQL"
    assert ok["properties"] == {"rows": "3", "result_code": "0"}
    seconds = float(ok["duration"].rsplit(":", 1)[1])
    assert 0.12 <= seconds < 2.0
    failed_dep = appinsights_endpoint.dependencies("run_command")[0]
    failed = failed_dep["data"]["baseData"]
    assert failed["success"] is False and result_code(failed_dep, appinsights_endpoint) == "208"
    assert failed["properties"] == {"error_type": "LookupError", "result_code": "208",
                                    "error_message": "Invalid object name 'dbo.missing' (208)"}
    hb = appinsights_endpoint.dependencies("heartbeat")[0]
    assert result_code(hb, appinsights_endpoint) == "ZeroDivisionError"
    assert ("ai.operation.id" in hb["tags"]) is otel(appinsights_endpoint)  # a fresh one on OpenTelemetry
    assert hb["tags"].get("ai.operation.id") not in (op, "0" * 32)


def test_nothing_is_posted_until_flush_and_flush_posts_before_returning(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    telemetry.event("RunClaimed", {"job": "j"})
    telemetry.metric("RunsClaimed", 1)
    time.sleep(0.2)
    assert appinsights_endpoint.posts == []  # buffered: no background sender
    telemetry.flush()
    # No waiting: the server recorded the POST before answering it.
    assert len(appinsights_endpoint.envelopes) == 2
    # One POST (OpenCensus), or one per signal (OpenTelemetry: a log and a metric exporter).
    assert len(appinsights_endpoint.posts) == (2 if otel(appinsights_endpoint) else 1)
    posts = len(appinsights_endpoint.posts)
    telemetry.flush()  # nothing new: no empty POST
    assert len(appinsights_endpoint.posts) == posts


def test_many_envelopes_go_in_batches_and_none_is_lost(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    for i in range(1234):
        telemetry.event("RunDispatched", {"run_id": i})
    # Past the auto-flush threshold the recording call itself posts.
    assert len(appinsights_endpoint.envelopes) >= AppInsightsTelemetry.auto_flush_threshold
    telemetry.flush()
    sizes = [len(p.envelopes) for p in appinsights_endpoint.posts]
    assert max(sizes) <= AppInsightsTelemetry.max_batch_size
    ids = [int(e["data"]["baseData"]["properties"]["run_id"]) for e in appinsights_endpoint.events()]
    assert ids == list(range(1234))


def test_recording_from_many_threads(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()

    def work(worker: int) -> None:
        for i in range(150):
            telemetry.event("RunStarted", {"worker": worker, "run_id": i})
            if i % 50 == 0:
                telemetry.flush()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    telemetry.flush()
    seen = [(e["data"]["baseData"]["properties"]["worker"], e["data"]["baseData"]["properties"]["run_id"])
            for e in appinsights_endpoint.events()]
    assert sorted(seen) == sorted((str(w), str(i)) for w in range(8) for i in range(150))


def test_one_operation_id_from_timer_through_queue_to_worker_process(appinsights_endpoint, tmp_path):
    """The tick records claim/dispatch under a new operation id and puts it in the queue
    message; the worker, another process that reads the connection string from its app
    settings, records its events and SQL calls under the id from the message and flushes
    before the invocation returns; the process is then killed without any exit handler
    (the host freezing it): everything is already at the endpoint, as one operation."""
    tick = appinsights_endpoint.telemetry()
    op = new_operation_id()
    with tick.sql_call("claim_due", target="pg|agent", operation_id=op):
        pass
    tick.event("RunClaimed", {"job": "j", "run_id": 1}, operation_id=op)
    tick.event("RunDispatched", {"job": "j", "run_id": 1, "token": 1}, operation_id=op)
    tick.flush()
    message = json.dumps({"run_id": 1, "token": 1, "operation_id": op})

    run_python("""
        import json, os, time
        from shared.telemetry.client import is_valid_operation_id
        from shared.telemetry.factory import create_telemetry_from_env
        message = json.loads(os.environ["MESSAGE"])
        op = message["operation_id"]
        assert is_valid_operation_id(op)
        t = create_telemetry_from_env()
        t.event("RunStarted", {"job": "j", "run_id": message["run_id"], "token": message["token"]},
                operation_id=op)
        with t.sql_call("run_command", target="pg|agent", operation_id=op):
            time.sleep(0.01)
        t.metric("RunDurationMs", 10.0, {"job": "j"}, operation_id=op)
        t.event("RunSucceeded", {"job": "j", "run_id": message["run_id"], "outcome": "succeeded"},
                operation_id=op)
        t.flush()
        os._exit(0)  # no atexit, no interpreter shutdown: only flush() could have sent
    """, env={"APPLICATIONINSIGHTS_CONNECTION_STRING": appinsights_endpoint.connection_string,
              "MESSAGE": message, "WEBSITE_SITE_NAME": "func-sqlagent", "TMPDIR": str(tmp_path),
              "AGENT_TELEMETRY_EXPORTER": appinsights_endpoint.exporter})

    envelopes = appinsights_endpoint.envelopes
    assert appinsights_endpoint.rejected == []
    # Metrics are aggregates on OpenTelemetry: they carry no operation id.
    traced = [e for e in envelopes if not (otel(appinsights_endpoint) and e["name"].endswith(".Metric"))]
    assert {e["tags"]["ai.operation.id"] for e in traced} == {op}
    names = [e["data"]["baseData"].get("name") or e["data"]["baseData"]["metrics"][0]["name"]
             for e in envelopes]
    if otel(appinsights_endpoint):  # each flush: dependencies, then events, then metrics
        assert names == ["claim_due", "RunClaimed", "RunDispatched", "run_command", "RunStarted",
                         "RunSucceeded", "RunDurationMs"]
    else:
        assert names == ["claim_due", "RunClaimed", "RunDispatched", "RunStarted", "run_command",
                         "RunDurationMs", "RunSucceeded"]
    roles = {e["tags"]["ai.cloud.role"] for e in envelopes}
    assert roles == {"sql-agent", "func-sqlagent"}


def test_without_flush_a_frozen_process_sends_nothing_but_a_normal_exit_does(appinsights_endpoint, tmp_path):
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": appinsights_endpoint.connection_string,
           "TMPDIR": str(tmp_path), "AGENT_TELEMETRY_EXPORTER": appinsights_endpoint.exporter}
    code = """
        import os
        from shared.telemetry.factory import create_telemetry_from_env
        t = create_telemetry_from_env()
        t.event("RunSucceeded", {"job": os.environ["HOW"]})
        if os.environ["HOW"] == "killed":
            os._exit(0)
    """
    run_python(code, env={**env, "HOW": "killed"})
    assert appinsights_endpoint.posts == []  # why the engine must flush before returning
    run_python(code, env={**env, "HOW": "exited"})  # a CLI run: flushed at interpreter exit
    assert [e["data"]["baseData"]["properties"]["job"] for e in appinsights_endpoint.events()] == ["exited"]


def test_no_statsbeat_and_no_exporter_threads(appinsights_endpoint):
    before = set(threading.enumerate())
    telemetry = appinsights_endpoint.telemetry()
    telemetry.event("RunClaimed", {"job": "j"})
    telemetry.metric("RunsClaimed", 1)
    telemetry.flush()
    statsbeat = sys.modules.get("opencensus.ext.azure.statsbeat.statsbeat")
    assert statsbeat is None or statsbeat._STATSBEAT_EXPORTER is None
    # Only the local storage's maintenance threads (and the test server's own) may start: no
    # exporter, statsbeat, SDK-stats or control-plane thread sending in the background.
    names = [t.name for t in set(threading.enumerate()) - before]
    assert not [n for n in names if "Storage" not in n and "process_request" not in n], names
    assert all(e["name"] != "Statsbeat" for e in appinsights_endpoint.envelopes)
    assert all("statsbeat" not in json.dumps(e).lower() for e in appinsights_endpoint.envelopes)
    assert len(appinsights_endpoint.envelopes) == 2


def test_entra_id_token_is_sent_as_bearer(exporter, monkeypatch):
    """The credential's token for Azure Monitor's scope goes as a bearer token. Over TLS, as
    in Azure: azure-core (the OpenTelemetry exporter's HTTP pipeline) refuses to send a bearer
    token over plain http; the endpoint's self-signed certificate is trusted through
    REQUESTS_CA_BUNDLE, which both exporters' HTTP clients (requests) read."""
    from azure.core.credentials import AccessToken

    endpoint = AppInsightsEndpoint(tls=True)
    endpoint.exporter = exporter
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", endpoint.ca_file)
    try:
        _check_bearer(endpoint, AccessToken)
    finally:
        endpoint.close()


def _check_bearer(appinsights_endpoint, AccessToken):  # noqa: N803

    scopes = []

    class StaticTokenCredential:
        def get_token(self, *requested, **kwargs):
            scopes.extend(requested)
            return AccessToken("token-for-test", int(time.time()) + 3600)

    telemetry = appinsights_endpoint.telemetry(credential=StaticTokenCredential())
    telemetry.event("RunClaimed", {"job": "j"})
    telemetry.flush()
    assert appinsights_endpoint.posts[0].headers["authorization"] == "Bearer token-for-test"
    assert scopes == ["https://monitor.azure.com//.default"]


# -- ingestion failures never reach the job -----------------------------------------

def test_refused_endpoint_does_not_raise_and_stored_envelopes_are_sent_later(appinsights_endpoint, tmp_path):
    storage = tmp_path / "storage"
    dead = (f"InstrumentationKey={appinsights_endpoint.instrumentation_key};"
            f"IngestionEndpoint=http://127.0.0.1:{unused_port()}/")
    telemetry = create_telemetry(dead, storage_path=str(storage), retry_interval_seconds=0,
                                 exporter=appinsights_endpoint.exporter)
    op = new_operation_id()
    telemetry.event("RunFailed", {"job": "j", "error_number": 1205}, operation_id=op)
    telemetry.metric("RunDurationMs", 5.0, operation_id=op)
    started = time.perf_counter()
    telemetry.flush()
    assert time.perf_counter() - started < 2.0
    telemetry.close()
    assert [p.name for p in storage.iterdir() if ".blob" in p.name], list(storage.iterdir())

    # Ingestion reachable again (here: another instance sharing the storage folder).
    later = create_telemetry(appinsights_endpoint.connection_string, storage_path=str(storage),
                             exporter=appinsights_endpoint.exporter)
    later.event("RunSucceeded", {"job": "j"})
    later.flush()
    later.close()
    names = [e["data"]["baseData"].get("name") or e["data"]["baseData"]["metrics"][0]["name"]
             for e in appinsights_endpoint.envelopes]
    assert sorted(names) == ["RunDurationMs", "RunFailed", "RunSucceeded"]
    assert list(storage.iterdir()) == []


def test_retryable_answer_keeps_envelopes_and_pauses_the_network(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry(retry_interval_seconds=30)
    appinsights_endpoint.respond_with(503)
    telemetry.event("RunRetried", {"job": "j", "attempt": 1})
    telemetry.flush()
    assert [p.status for p in appinsights_endpoint.posts] == [503]
    assert appinsights_endpoint.envelopes == []
    stored = [p for p in Path(telemetry.storage_path).iterdir() if ".blob" in p.name]
    assert len(stored) == 1

    # Within the retry interval, a flush does not touch the network: quick, and parked.
    telemetry.event("RunSucceeded", {"job": "j"})
    started = time.perf_counter()
    telemetry.flush()
    assert time.perf_counter() - started < 0.5
    assert len(appinsights_endpoint.posts) == 1
    # Parked: in local storage (OpenCensus), or in memory until the pause ends (OpenTelemetry:
    # only its exporter writes its storage, when an export fails).
    stored = len([p for p in Path(telemetry.storage_path).iterdir() if ".blob" in p.name])
    assert stored == (1 if otel(appinsights_endpoint) else 2)


def test_a_failed_send_loses_none_of_a_large_flush(appinsights_endpoint):
    """Ingestion fails the first batch of a flush of many: that batch is kept (local storage),
    the untried rest waits, and once ingestion is back every item arrives exactly once."""
    telemetry = appinsights_endpoint.telemetry(retry_interval_seconds=0)
    count = AppInsightsTelemetry.max_batch_size * 3 + 7
    for i in range(count):
        telemetry.event("RunDispatched", {"run_id": i})
    appinsights_endpoint.respond_with(503)
    telemetry.flush()
    for _ in range(5):  # each flush sends what waits; stored batches follow a successful send
        telemetry.event("RunClaimed", {"job": "j"})
        telemetry.flush()
    ids = sorted(int(e["data"]["baseData"]["properties"]["run_id"]) for e in appinsights_endpoint.events("RunDispatched"))
    assert ids == list(range(count))


def test_retry_after_a_retryable_answer(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry(retry_interval_seconds=0)
    appinsights_endpoint.respond_with(500)
    telemetry.event("RunRetried", {"job": "j", "attempt": 1})
    telemetry.flush()
    assert appinsights_endpoint.envelopes == []
    if otel(appinsights_endpoint):
        # The OpenTelemetry exporter sends its stored batches after its next successful export.
        telemetry.event("RunSucceeded", {"job": "j"})
        telemetry.flush()  # ingestion back: the new item, then the stored batch, once
        assert sorted(e["data"]["baseData"]["name"] for e in appinsights_endpoint.envelopes) == [
            "RunRetried", "RunSucceeded"]
        telemetry.flush()
        assert len(appinsights_endpoint.envelopes) == 2
        return
    telemetry.flush()  # ingestion back: the stored batch goes out, once
    assert [e["data"]["baseData"]["name"] for e in appinsights_endpoint.envelopes] == ["RunRetried"]
    telemetry.flush()
    assert len(appinsights_endpoint.envelopes) == 1


def test_without_local_storage_unsent_envelopes_wait_in_memory(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry(enable_local_storage=False, retry_interval_seconds=0)
    assert telemetry.storage_path is None
    appinsights_endpoint.respond_with(503)
    telemetry.event("RunPoisoned", {"job": "j", "dequeue_count": 5})
    telemetry.flush()
    assert appinsights_endpoint.envelopes == []
    telemetry.event("RunClaimed", {"job": "k"})
    telemetry.flush()
    assert [e["data"]["baseData"]["name"] for e in appinsights_endpoint.envelopes] == ["RunPoisoned", "RunClaimed"]


def test_non_retryable_answer_drops_without_raising(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry(retry_interval_seconds=0)
    appinsights_endpoint.respond_with(400)
    telemetry.event("StaleMessage", {"run_id": 1, "token": 1})
    telemetry.flush()
    telemetry.event("RunClaimed", {"job": "j"})
    telemetry.flush()
    assert [p.status for p in appinsights_endpoint.posts] == [400, 200]
    assert [e["data"]["baseData"]["name"] for e in appinsights_endpoint.envelopes] == ["RunClaimed"]
    assert telemetry.dropped == 0 and list(Path(telemetry.storage_path).iterdir()) == []


def test_hanging_endpoint_bounds_flush_by_the_timeout(silent_endpoint, tmp_path, exporter):
    telemetry = create_telemetry(silent_endpoint.connection_string, storage_path=str(tmp_path / "s"),
                                 timeout_seconds=0.5, retry_interval_seconds=30, exporter=exporter)
    try:
        telemetry.event("LeaseExpired", {"job": "j", "run_id": 1})
        started = time.perf_counter()
        telemetry.flush()
        first = time.perf_counter() - started
        assert 0.4 < first < 2.5
        assert silent_endpoint.connections == 1
        telemetry.event("RunClaimed", {"job": "j"})
        started = time.perf_counter()
        telemetry.flush()
        assert time.perf_counter() - started < 0.3
        assert silent_endpoint.connections == 1
    finally:
        telemetry.close()


def test_default_local_storage_is_in_the_temp_directory(exporter):
    key = str(uuid.uuid4())
    telemetry = create_telemetry(f"InstrumentationKey={key};IngestionEndpoint=http://127.0.0.1:{unused_port()}/",
                                 exporter=exporter)
    try:
        path = Path(telemetry.storage_path)
        assert path == Path(os.path.abspath(tempfile.gettempdir())) / "sql-agent-telemetry" / key
        assert path.is_dir()
        assert REPO not in path.parents and Path.home() not in path.parents
    finally:
        telemetry.close()
        shutil.rmtree(telemetry.storage_path, ignore_errors=True)


def test_closed_telemetry_records_nothing(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    telemetry.event("RunClaimed", {"job": "j"})
    telemetry.close()
    assert len(appinsights_endpoint.envelopes) == 1  # close flushes
    telemetry.event("RunClaimed", {"job": "j"})
    telemetry.flush()
    telemetry.close()
    assert len(appinsights_endpoint.envelopes) == 1


# -- programming errors are caught, in both modes --------------------------------------

@pytest.fixture(params=["noop", "opentelemetry", "opencensus"])
def any_telemetry(request):
    if request.param == "noop":
        yield create_telemetry(None)
        return
    endpoint = AppInsightsEndpoint()
    endpoint.exporter = request.param
    try:
        yield endpoint.telemetry()
    finally:
        endpoint.close()


def test_unknown_event_and_metric_names_raise(any_telemetry):
    with pytest.raises(ValueError, match=r"event name 'RunStart'.*RunStarted"):
        any_telemetry.event("RunStart")
    with pytest.raises(ValueError, match=r"metric name 'Lag'.*ScheduleLagSeconds"):
        any_telemetry.metric("Lag", 1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "3", True, None])
def test_metric_value_must_be_a_finite_number(any_telemetry, value):
    with pytest.raises(ValueError, match="expected a finite number"):
        any_telemetry.metric("RunsDue", value)


@pytest.mark.parametrize("op", ["", "0" * 32, "abc", "g" * 32, 12345])
def test_malformed_operation_id_is_dropped_with_a_warning_never_raised(any_telemetry, op, caplog):
    """Operation ids are data (runs table, queue message): a bad one must not fail the job."""
    any_telemetry.event("RunStarted", {"job": "j"}, operation_id=op)
    with any_telemetry.sql_call("x", target="db", operation_id=op):
        pass
    any_telemetry.flush()
    assert "is not 32 hex characters" in caplog.text


def test_operation_id_forms_are_normalised_and_malformed_ones_left_off(appinsights_endpoint):
    telemetry = appinsights_endpoint.telemetry()
    guid = uuid.uuid4()
    telemetry.event("RunStarted", {"n": 1}, operation_id=str(guid).upper())   # e.g. T-SQL NEWID()
    telemetry.event("RunStarted", {"n": 2}, operation_id=guid.hex.upper())
    telemetry.event("RunStarted", {"n": 3}, operation_id="not-an-id")
    telemetry.flush()
    tags = [e["tags"] for e in appinsights_endpoint.events()]
    assert tags[0]["ai.operation.id"] == tags[1]["ai.operation.id"] == guid.hex
    if otel(appinsights_endpoint):  # left off: a fresh operation of its own
        assert tags[2]["ai.operation.id"] not in (guid.hex, "0" * 32)
    else:
        assert "ai.operation.id" not in tags[2] and "ai.operation.parentId" not in tags[2]


def test_bad_properties_raise(any_telemetry):
    with pytest.raises(TypeError, match="property 'rows' value of type list"):
        any_telemetry.event("RunStarted", {"rows": [1, 2]})
    with pytest.raises(ValueError, match="property name"):
        any_telemetry.event("RunStarted", {"": "x"})
    with pytest.raises(TypeError, match="property 'blob' value of type bytes"):
        with any_telemetry.sql_call("x", target="db") as call:
            call.properties["blob"] = b"\x00"


def test_bad_dependency_arguments_raise(any_telemetry):
    with pytest.raises(ValueError, match="duration_ms"):
        any_telemetry.dependency("x", target="db", duration_ms=-1, success=True)
    with pytest.raises(ValueError, match="target"):
        any_telemetry.dependency("x", target="", duration_ms=1, success=True)
    with pytest.raises(ValueError, match="success"):
        any_telemetry.dependency("x", target="db", duration_ms=1, success=1)


def test_operation_ids():
    ids = {new_operation_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(is_valid_operation_id(i) and len(i) == 32 for i in ids)
    assert not is_valid_operation_id(None)
    assert not is_valid_operation_id("g" * 32)


# -- settings ---------------------------------------------------------------------------

def test_connection_string_forms():
    key = "0a1b2c3d-0000-4000-8000-000000000001"
    assert parse_connection_string(
        f"InstrumentationKey={key};IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/;"
        f"LiveEndpoint=https://westeurope.livediagnostics.monitor.azure.com/;ApplicationId=abc;") \
        .endpoint == "https://westeurope-5.in.applicationinsights.azure.com"
    assert parse_connection_string(f" instrumentationkey={key.upper()} ").instrumentation_key == key
    assert parse_connection_string(f"InstrumentationKey={key}").endpoint == "https://dc.services.visualstudio.com"
    assert parse_connection_string(f"InstrumentationKey={key};EndpointSuffix=applicationinsights.azure.cn;Location=chinaeast2") \
        .endpoint == "https://chinaeast2.dc.applicationinsights.azure.cn"


@pytest.mark.parametrize("value, fragment", [
    ("IngestionEndpoint=https://x.in.applicationinsights.azure.com/", "<missing>: expected an InstrumentationKey"),
    ("InstrumentationKey=not-a-guid", "'InstrumentationKey=not-a-guid': expected InstrumentationKey to be a GUID"),
    ("InstrumentationKey", "'InstrumentationKey': expected Key=Value pairs"),
    ("InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=ftp://x", "an http(s) URL"),
    ("InstrumentationKey=00000000-0000-0000-0000-000000000000;Authorization=AAD", "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"),
])
def test_malformed_connection_string_is_a_clear_config_error(value, fragment):
    with pytest.raises(ConfigError) as raised:
        create_telemetry(value)
    assert str(raised.value).startswith("APPLICATIONINSIGHTS_CONNECTION_STRING=")
    assert fragment in str(raised.value)


def test_authentication_string():
    assert parse_authentication_string(None) is False
    assert parse_authentication_string("") is False
    assert parse_authentication_string("Authorization=AAD") is None
    cid = "11111111-2222-3333-4444-555555555555"
    assert parse_authentication_string(f"Authorization=AAD;ClientId={cid.upper()}") == cid
    for bad in ("Authorization=ikey", "Authorization=AAD;ClientId=me", "Authorization=AAD;Secret=x", "AAD"):
        with pytest.raises(ConfigError, match="^APPLICATIONINSIGHTS_AUTHENTICATION_STRING="):
            parse_authentication_string(bad)


def test_create_from_env_reads_the_app_settings(appinsights_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR for the default storage path
    assert type(create_telemetry_from_env({})) is Telemetry
    telemetry = create_telemetry_from_env({
        "APPLICATIONINSIGHTS_CONNECTION_STRING": appinsights_endpoint.connection_string,
        "WEBSITE_SITE_NAME": "func-agent-prod"})
    try:
        assert Path(telemetry.storage_path).is_relative_to(tmp_path)
        telemetry.event("JobConfigInvalid", {"job": "bad", "error_message": "JOB__bad__SCHEDULE=..."})
        telemetry.flush()
    finally:
        telemetry.close()
    (event,) = appinsights_endpoint.events("JobConfigInvalid")
    assert event["tags"]["ai.cloud.role"] == "func-agent-prod"
