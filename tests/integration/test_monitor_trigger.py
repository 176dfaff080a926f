"""The monitor's HTTP trigger (functions/monitor_trigger.py), called as the Functions host calls it,
with real azure.functions HttpRequest/HttpResponse objects, over the monitor scenario: the user
App Service Authentication signed in (X-MS-CLIENT-PRINCIPAL) must be in AGENT_MONITOR_ALLOWED_GROUP."""

from __future__ import annotations

import base64
import json
import os

import azure.functions as func
import pytest

from shared.engine import views
from shared.engine.agent import reset_default_agent
from shared.web.app import SECURITY_HEADERS
from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped fixture: SQLite and PostgreSQL)

GROUP = "6f1c3a52-0d7e-4a8e-9b61-3c2f0e9a7d41"
HOST = "https://sqlagent-app.azurewebsites.net"


def principal(*groups: str, name: str = "Ada Lovelace") -> str:
    claims = [{"typ": "groups", "val": group} for group in groups] + [{"typ": "name", "val": name}]
    document = {"auth_typ": "aad", "claims": claims, "name_typ": "name", "role_typ": "roles"}
    return base64.b64encode(json.dumps(document).encode()).decode()


@pytest.fixture
def call(scenario, monkeypatch):  # noqa: F811
    for key in [k for k in os.environ if k.startswith(("JOB__", "AGENT_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AGENT_DB", scenario.db)
    monkeypatch.setenv("AGENT_MONITOR_ALLOWED_GROUP", GROUP)
    reset_default_agent()
    from functions import monitor_trigger

    built = monitor_trigger.agent_monitor.build()
    assert built.get_function_name() == "agent_monitor"
    function = built.get_user_function()

    def invoke(path: str, *, method: str = "GET", user: str | None = principal(GROUP), query: str = "",
               headers: dict[str, str] | None = None) -> func.HttpResponse:
        sent = dict(headers or {})
        if user is not None:
            sent["X-MS-CLIENT-PRINCIPAL"] = user
            sent["X-MS-CLIENT-PRINCIPAL-NAME"] = "ada@example.com"
        url = f"{HOST}/api/monitor{path}" + (f"?{query}" if query else "")
        request = func.HttpRequest(method, url, headers=sent, route_params={"path": path.lstrip("/")}, body=b"")
        response = function(request)
        assert isinstance(response, func.HttpResponse)
        for name, value in SECURITY_HEADERS.items():
            assert response.headers[name] == value, (path, name)
        return response

    yield invoke
    reset_default_agent()


def test_the_trigger_is_anonymous_to_the_host_on_the_monitor_route():
    from functions import monitor_trigger

    # (function_app.app.get_functions() may be called once per process: test_triggers.py does.)
    binding = monitor_trigger.agent_monitor.build().get_bindings()[0].get_dict_repr()
    assert binding["type"] == "httpTrigger" and binding["route"] == "monitor/{*path}"
    assert str(binding["authLevel"].value if hasattr(binding["authLevel"], "value") else binding["authLevel"]) == "anonymous"
    assert "methods" not in binding          # every method reaches the engine, which answers 405


def test_a_member_of_the_group_sees_the_jobs_page_with_their_name(call, scenario):  # noqa: F811
    response = call("/")
    assert response.status_code == 200 and response.mimetype == "text/html"
    text = response.get_body().decode()
    assert "Signed in as ada@example.com" in text
    assert "running since" in text and "worker-7" in text and "retrying at" in text
    assert 'href="/api/monitor/jobs/nightly_ok"' in text and 'href="/api/monitor/monitor.css"' in text


def test_pages_and_json_twins(call, scenario):  # noqa: F811
    (failed_run,) = scenario.run_ids["flaky_fail"]
    for path in ("/jobs/nightly_ok", f"/runs/{failed_run}", "/poison", "/stuck", "/monitor.css"):
        assert call(path).status_code == 200, path
    twin = call("/poison", query="format=json")
    assert twin.mimetype == "application/json"
    store = scenario.agent.new_store()
    try:
        assert json.loads(twin.get_body()) == json.loads(views.to_json(views.poison_view(store)))
    finally:
        store.close()
    by_accept = call("/", headers={"Accept": "application/json"})
    assert {row["job_name"] for row in json.loads(by_accept.get_body())} >= {"nightly_ok", "running_long"}
    head = call("/stuck", method="HEAD")
    assert head.status_code == 200 and head.get_body() == b""


def test_no_signed_in_user_gets_401(call):
    response = call("/", user=None)
    assert response.status_code == 401 and b"sign-in required" in response.get_body()
    assert call("/", user="not base64 json!").status_code == 401


def test_a_user_outside_the_group_gets_403(call):
    response = call("/", user=principal("another-group", name="Mallory"))
    assert response.status_code == 403
    assert b"not a member of the Entra group" in response.get_body() and b"running_long" not in response.get_body()
    assert call("/poison", user=principal(name="No Groups"), query="format=json").status_code == 403


def test_without_a_group_setting_the_monitor_is_closed(call, monkeypatch):
    monkeypatch.delenv("AGENT_MONITOR_ALLOWED_GROUP")
    response = call("/")
    assert response.status_code == 403
    assert b"the monitor is closed: AGENT_MONITOR_ALLOWED_GROUP names no Entra group" in response.get_body()


def test_an_invalid_monitor_setting_is_named(call, monkeypatch):
    monkeypatch.setenv("AGENT_MONITOR_REFRESH_SECONDS", "often")
    response = call("/")
    assert response.status_code == 500
    assert b"AGENT_MONITOR_REFRESH_SECONDS=&#x27;often&#x27;: expected a whole number from 0 to 86400" in response.get_body()


def test_nothing_but_get_and_head(call):
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = call("/", method=method)
        assert response.status_code == 405 and response.headers["Allow"] == "GET, HEAD"
    assert call("/", method="POST", user=None).status_code == 405
