"""The Azure Monitor workbook (infra/workbook.json), as infra/monitoring.bicep deploys it.

* It is a workbook (Notebook/1.0) whose query items all run KQL on the Application Insights
  resource, with the sections the issue asks for (runs per job over time by outcome, duration
  percentiles, slot lateness, poison, the dead man's switch), and every `{parameter}` a query
  uses is one the workbook defines.
* Every query reads only tables the engine writes (customEvents, customMetrics, dependencies),
  only the columns of those tables the engine's envelopes fill, only event and metric names of
  shared/telemetry/client.py and only dimension (customDimensions) names of its STANDARD_DIMENSIONS.
* And what the engine really sends: a tick and runs that succeed, fail, retry and are poisoned,
  exported to the loopback ingestion endpoint with each exporter: each query's dimensions are
  carried by the events or metrics it names, the events and metrics it counts on arrive, and
  the metric fields it reads (valueCount, valueMax) are in the metric envelopes.
* The Bicep deploys exactly this file (loadTextContent) with the placeholder replaced by the
  Application Insights resource id.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest

from shared.messaging.memory import MemoryQueue
from shared.telemetry import client as telemetry
from tests.support.appinsights_endpoint import AppInsightsEndpoint
from tests.support.harness import ROOT, make_agent, work

UTC = timezone.utc
WORKBOOK = json.loads((ROOT / "infra" / "workbook.json").read_text(encoding="utf-8"))
PLACEHOLDER = "__APP_INSIGHTS_ID__"

# The Application Insights tables (classic names, as the workbook queries the component) and the
# workspace names of the same data: a query naming any other than the engine's three fails.
ENGINE_TABLES = ("customEvents", "customMetrics", "dependencies")
OTHER_TABLES = ("requests", "traces", "exceptions", "pageViews", "browserTimings", "availabilityResults",
                "performanceCounters", "AppEvents", "AppMetrics", "AppDependencies", "AppRequests", "AppTraces")
# Columns the engine's envelopes fill, per table (the envelope field each comes from).
ENGINE_COLUMNS = {
    "customEvents": {"timestamp", "name", "customDimensions", "operation_Id", "itemType"},
    # metrics[0]: value, count -> valueCount, max -> valueMax (min -> valueMin)
    "customMetrics": {"timestamp", "name", "value", "valueCount", "valueMax", "valueMin", "customDimensions",
                      "operation_Id", "itemType"},
    "dependencies": {"timestamp", "name", "target", "type", "data", "duration", "success", "resultCode",
                     "customDimensions", "operation_Id", "itemType"},
}
# Every column of the Application Insights tables, so that a column the engine does not fill
# (or one of another table) is recognised in a query.
AI_COLUMNS = {
    "timestamp", "name", "itemType", "customDimensions", "customMeasurements", "operation_Name", "operation_Id",
    "operation_ParentId", "operation_SyntheticSource", "session_Id", "user_Id", "user_AuthenticatedId",
    "user_AccountId", "application_Version", "client_Type", "client_Model", "client_OS", "client_IP", "client_City",
    "client_StateOrProvince", "client_CountryOrRegion", "client_Browser", "cloud_RoleName", "cloud_RoleInstance",
    "appId", "appName", "iKey", "sdkVersion", "itemId", "itemCount", "value", "valueCount", "valueSum", "valueMin",
    "valueMax", "valueStdDev", "id", "target", "type", "data", "success", "resultCode", "duration",
    "performanceBucket", "url", "source", "message", "severityLevel", "problemId", "outerMessage", "innermostMessage",
    "details", "location", "size", "counter", "category", "instance",
}


def query_items() -> list[dict]:
    return [item for item in WORKBOOK["items"] if item["type"] == 3]


def parameter_items() -> list[dict]:
    return [param for item in WORKBOOK["items"] if item["type"] == 9 for param in item["content"]["parameters"]]


def all_queries() -> dict[str, str]:
    """Every KQL text of the workbook: its query items and its query-based parameters."""
    queries = {item["name"]: item["content"]["query"] for item in query_items()}
    queries.update({f"parameter {p['name']}": p["query"] for p in parameter_items() if p.get("query")})
    return queries


def without_strings(kql: str) -> str:
    return re.sub(r'"[^"]*"|\'[^\']*\'', '""', kql)


def tables(kql: str) -> set[str]:
    code = without_strings(kql)
    return {table for table in ENGINE_TABLES + OTHER_TABLES if re.search(rf"\b{table}\b", code)}


def names_compared(kql: str) -> set[str]:
    """The event or metric names a query filters on: name == "X", name in ("X", "Y")."""
    found = set(re.findall(r'\bname\s*==\s*"(\w+)"', kql))
    for group in re.findall(r'\bname\s+in\s*\(([^)]*)\)', kql):
        found |= set(re.findall(r'"(\w+)"', group))
    return found


def dimensions(kql: str) -> set[str]:
    return set(re.findall(r"customDimensions\.(\w+)", kql))


# ---------------------------------------------------------------- the document


def test_it_is_a_workbook_with_the_sections_asked_for():
    assert WORKBOOK["version"] == "Notebook/1.0"
    assert WORKBOOK["fallbackResourceIds"] == [PLACEHOLDER]
    names = [item["name"] for item in WORKBOOK["items"]]
    assert len(names) == len(set(names)), names
    for item in query_items():
        content = item["content"]
        assert content["version"] == "KqlItem/1.0" and content["queryType"] == 0, item["name"]
        assert content["resourceType"] == "microsoft.insights/components", item["name"]
        assert content["title"] and content["visualization"] in ("table", "timechart", "barchart"), item["name"]
    assert {"runs-by-outcome", "runs-per-job", "duration-percentiles", "lateness", "poison",
            "dead-mans-switch", "ticks"} <= set(names)


def test_every_parameter_a_query_uses_is_defined():
    defined = {param["name"] for param in parameter_items()}
    assert defined == {"TimeRange", "Job"}
    for name, kql in all_queries().items():
        used = {match.split(":")[0] for match in re.findall(r"\{(\w+(?::\w+)?)\}", kql)}
        assert used <= defined, (name, used - defined)
    # Every query follows the time range, but the dead man's switch (it looks at now, as the alert).
    for item in query_items():
        follows = "{TimeRange}" in item["content"]["query"]
        assert follows == (item["name"] != "dead-mans-switch"), item["name"]
        assert item["content"]["timeContextFromParameter"] == "TimeRange"


def test_every_query_reads_only_what_the_engine_writes():
    for name, kql in all_queries().items():
        used_tables = tables(kql)
        assert used_tables and used_tables <= set(ENGINE_TABLES), (name, used_tables)
        allowed = set().union(*(ENGINE_COLUMNS[table] for table in used_tables))
        identifiers = set(re.findall(r"\b[A-Za-z_]\w*\b", without_strings(kql)))
        columns = identifiers & AI_COLUMNS
        assert columns <= allowed, f"{name}: {sorted(columns - allowed)} are not columns the engine fills " \
                                   f"in {sorted(used_tables)}"
        compared = names_compared(kql)
        if used_tables == {"customEvents"}:
            assert compared <= set(telemetry.EVENT_NAMES), (name, compared - set(telemetry.EVENT_NAMES))
        elif used_tables == {"customMetrics"}:
            assert compared <= set(telemetry.METRIC_NAMES), (name, compared - set(telemetry.METRIC_NAMES))
        else:
            assert compared <= set(telemetry.EVENT_NAMES) | set(telemetry.METRIC_NAMES), name
        assert dimensions(kql) <= set(telemetry.STANDARD_DIMENSIONS), \
            (name, dimensions(kql) - set(telemetry.STANDARD_DIMENSIONS))


def test_the_check_finds_a_column_or_name_the_engine_does_not_write():
    """The rules above can fail: a request column, a made-up event and dimension are caught."""
    assert tables("requests | where timestamp > ago(1d)") == {"requests"}
    bad = 'customEvents | where name == "RunExploded" | extend x = customDimensions.colour, c = client_City'
    assert names_compared(bad) - set(telemetry.EVENT_NAMES) == {"RunExploded"}
    assert dimensions(bad) - set(telemetry.STANDARD_DIMENSIONS) == {"colour"}
    identifiers = set(re.findall(r"\b[A-Za-z_]\w*\b", without_strings(bad))) & AI_COLUMNS
    assert identifiers - ENGINE_COLUMNS["customEvents"] == {"client_City"}
    assert "duration" not in ENGINE_COLUMNS["customMetrics"]


def test_the_bicep_deploys_this_file_on_the_application_insights_resource():
    text = (ROOT / "infra" / "monitoring.bicep").read_text(encoding="utf-8")
    assert "resource workbook 'Microsoft.Insights/workbooks@" in text
    assert f"serializedData: replace(loadTextContent('workbook.json'), '{PLACEHOLDER}', appInsights.id)" in text
    assert "sourceId: appInsights.id" in text and "category: 'workbook'" in text and "kind: 'shared'" in text
    # A workbook's name is a GUID: the Bicep makes it with guid().
    assert re.search(r"^\s*name: guid\(", text[text.index("resource workbook"):], re.MULTILINE)
    raw = (ROOT / "infra" / "workbook.json").read_text(encoding="utf-8")
    # The placeholder stands only where a resource id goes, and nothing else needs substituting.
    assert raw.count(PLACEHOLDER) == 3
    assert not re.search(r"\$\{|\[parameters\(|\[variables\(", raw)


# ---------------------------------------------------------------- against what the engine sends


@pytest.fixture(scope="module", params=["opentelemetry", "opencensus"])
def sent(request, tmp_path_factory):
    """What the engine posts to the loopback ingestion endpoint for a tick and runs that
    succeed, fail, retry, and a malformed (poisoned) message: {name: dimension keys} for events
    and metrics, and the metric data points."""
    endpoint = AppInsightsEndpoint()
    now = "@once " + datetime.now(UTC).isoformat()
    db = f"sqlite:///{tmp_path_factory.mktemp('workbook') / 'agent.db'}"
    agent = make_agent(db, {"good": {"SCHEDULE": now, "COMMAND": "SELECT 1"},
                            "broken": {"SCHEDULE": now, "COMMAND": "SELECT * FROM missing_table", "MAX_ATTEMPTS": "1"},
                            "flaky": {"SCHEDULE": now, "COMMAND": "SELECT * FROM missing_table", "MAX_ATTEMPTS": "2"},
                            "redelivered": {"SCHEDULE": now, "COMMAND": "SELECT 1"}},
                       queue=MemoryQueue(), simulated_time=False,
                       APPLICATIONINSIGHTS_CONNECTION_STRING=endpoint.connection_string,
                       AGENT_TELEMETRY_EXPORTER=request.param, AGENT_RETRY_BACKOFF_SECONDS="3600")
    try:
        report = agent.tick()
        # One run's message delivered once too often (poisoned with its run id), and a message
        # that names no run (poisoned malformed).
        (run,) = [r for r in report.claimed if r["job_name"] == "redelivered"]
        messages = agent.queue.receive(16, 0)
        for other in messages:
            if json.loads(other.body).get("run_id") != run["run_id"]:
                agent.queue.release(other, 0)
        (message,) = [m for m in messages if json.loads(m.body).get("run_id") == run["run_id"]]
        assert agent.handle_message(message.body, dequeue_count=6, message_id=message.id).outcome == "poisoned"
        agent.queue.delete(message)
        agent.queue.send_many(["not a run message"])
        work(agent)
        agent.telemetry.flush()
        events: dict[str, set[str]] = {}
        for envelope in endpoint.events():
            data = envelope["data"]["baseData"]
            events.setdefault(data["name"], set()).update(data.get("properties", {}))
        metrics: dict[str, set[str]] = {}
        points: dict[str, list[dict]] = {}
        for envelope in endpoint.metrics():
            data = envelope["data"]["baseData"]
            point = data["metrics"][0]
            metrics.setdefault(point["name"], set()).update(data.get("properties", {}))
            points.setdefault(point["name"], []).append(point)
        yield {"events": events, "metrics": metrics, "points": points, "exporter": request.param}
    finally:
        agent.close()
        endpoint.close()


def test_the_events_and_metrics_the_workbook_counts_on_arrive(sent):
    assert {"RunClaimed", "RunStarted", "RunSucceeded", "RunFailed", "RunRetried", "RunPoisoned"} <= set(sent["events"])
    assert {"TickDurationMs", "ScheduleLagSeconds", "RunDurationMs"} <= set(sent["metrics"])


def statements(kql: str) -> list[str]:
    """A query's statements (`let x = ...;` each, then the last), each a pipeline of its own."""
    return [part for part in without_strings_keep(kql).split(";") if part.strip()]


def without_strings_keep(kql: str) -> str:
    return re.sub(r'"[^"]*"', lambda m: m.group(0).replace(";", ","), kql)


def test_each_querys_dimensions_are_carried_by_what_it_names(sent):
    """Per statement: the dimensions it reads are on at least one of the events or metrics it
    filters on (a statement without a name filter: on some event of its table)."""
    checked = 0
    for name, kql in all_queries().items():
        for statement in statements(kql):
            if not dimensions(statement):
                continue
            named = names_compared(statement)
            seen_named = {n: keys for n, keys in {**sent["events"], **sent["metrics"]}.items() if n in named}
            if not named:
                seen_named = sent["events"] if "customEvents" in statement else sent["metrics"]
            assert seen_named, f"{name}: none of {sorted(named)} was sent"
            carried = set().union(*seen_named.values())
            assert dimensions(statement) <= carried, (
                f"{name} ({sent['exporter']}): {sorted(dimensions(statement) - carried)} are on none of "
                f"{sorted(seen_named)}")
            checked += 1
    assert checked >= 10


def test_the_metric_fields_the_workbook_reads_are_sent(sent):
    """valueCount and valueMax come from a data point's count and max; where a point lacks them
    (a single measurement), the workbook's queries fall back to 1 and value."""
    reads = {field for kql in all_queries().values() for field in ("valueCount", "valueMax") if field in kql}
    assert reads == {"valueCount", "valueMax"}
    for kql in all_queries().values():
        for field in reads & set(re.findall(r"\b(valueCount|valueMax)\b", kql)):
            assert re.search(rf"isnull\({field}\)", kql), f"a query reads {field} without its fallback"
    lag = sent["points"]["ScheduleLagSeconds"]
    assert all(point["value"] >= 0 for point in lag)
    if sent["exporter"] == "opentelemetry":        # aggregated: count and max carried
        assert all("count" in point and "max" in point for point in lag), lag
