"""The monitor's actions (issue 32 item 5) over HTTP: the local server (`monitor --operator`, and
read-only without it) and the Azure adapter (the real azure.functions HttpRequest objects through
functions/monitor_trigger.py), on the monitor scenario (SQLite and PostgreSQL).

Each test acts as a browser would (GET the page, take the form's hidden fields, POST them back with
the session cookie and the page's Origin) and then as an attacker would: another origin, no
Origin, a reader's forged POST, a replayed token, a token of another session or another target,
hostile job names in forms and URLs, a double submit, an action on a job removed meanwhile. Each
action done or refused leaves its one audit row (source monitor, the principal, from where)."""

from __future__ import annotations

import base64
import html
import http.client
import json
import os
import re
import threading
from urllib.parse import urlencode

import azure.functions as func
import pytest

from shared.engine.agent import reset_default_agent
from shared.web.local_server import make_server
from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)

READERS = "6f1c3a52-0d7e-4a8e-9b61-3c2f0e9a7d41"
OPERATORS = "0b7e2f44-8c1d-4f3a-a2e9-5d6c7b8a9f10"
AZURE_HOST = "sqlagent-app.azurewebsites.net"


def form_fields(page: str, action: str, target: str | None = None) -> dict[str, str]:
    """The hidden fields of the page's first form for ``action`` (on ``target`` when given)."""
    for match in re.finditer(r'<form class="action action-' + re.escape(action) + r'"[^>]*>(.*?)</form>', page, re.S):
        fields = {html.unescape(n): html.unescape(v)
                  for n, v in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', match.group(1))}
        if target is None or target in fields.values():
            return fields
    raise AssertionError(f"no {action} form for {target!r} on the page")


def audit_rows(scenario, action: str | None = None) -> list[dict]:  # noqa: F811
    store = scenario.agent.new_store()
    try:
        rows = store.execute("list_audit", job_name=None, since=None, limit=1000).rows
    finally:
        store.close()
    return [row for row in rows if action is None or row["action"] == action]


# ---------------------------------------------------------------- the local server

class Client:
    """A browser's part of HTTP: it keeps the session cookie and sends its page's Origin."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookie: str | None = None
        self.origin = f"http://127.0.0.1:{port}"

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if self.cookie and "Cookie" not in sent:
            sent["Cookie"] = self.cookie
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        text = response.read().decode()
        cookie = response.getheader("Set-Cookie")
        if cookie:
            self.cookie = cookie.split(";")[0]
        connection.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, text

    def get(self, path: str):
        return self.request("GET", path)

    def post(self, action: str, fields: dict[str, str], origin: str | None = "own"):
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if origin is not None:
            headers["Origin"] = self.origin if origin == "own" else origin
        return self.request("POST", f"/actions/{action}", urlencode(fields).encode(), headers)


@pytest.fixture(scope="module")
def servers(scenario):  # noqa: F811
    """Two local servers on the scenario: one started with --operator, one without."""
    started = []
    for operator in (True, False):
        server = make_server(scenario.agent, 0, environ={}, operator=operator)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        started.append(server)
    yield {"operator": started[0].server_address[1], "reader": started[1].server_address[1]}
    for server in started:
        server.shutdown()
        server.server_close()


def test_a_reader_sees_no_button_and_every_post_is_403(scenario, servers):  # noqa: F811
    reader = Client(servers["reader"])
    for path in ("/", "/jobs/nightly_ok", f"/runs/{scenario.run_ids['running_long'][0]}", "/poison"):
        status, headers, text = reader.get(path)
        assert status == 200 and "<form" not in text and "set-cookie" not in headers, path
    # A forged POST, with a token lifted from an operator's page and its cookie: still 403.
    operator = Client(servers["operator"])
    fields = form_fields(operator.get("/jobs/nightly_ok")[2], "start")
    before = len(audit_rows(scenario))
    for action in ("start", "stop", "pause", "resume", "cancel", "requeue"):
        reader.cookie = operator.cookie
        status, headers, text = reader.post(action, fields)
        assert status == 403 and "takes no actions" in text, (action, text[:300])
    assert len(audit_rows(scenario)) == before      # the read-only server has no one who could act


def test_an_operator_starts_a_job_by_its_form_and_the_audit_says_who_and_from_where(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    status, headers, page = client.get("/jobs/nightly_ok")
    assert status == 200 and "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    status, _, text = client.post("start", form_fields(page, "start"))
    assert status == 200 and "<h1>Done</h1>" in text and "job &#x27;nightly_ok&#x27; started: run" in text, text
    run_id = int(re.search(r"started: run (\d+)", text).group(1))
    (row,) = [r for r in audit_rows(scenario, "run-now") if r["run_id"] == run_id]
    assert row["source"] == "monitor" and row["outcome"] == "done"
    assert row["principal"] and row["client"].startswith(f"monitor on 127.0.0.1:{servers['operator']}")
    # the same form again: refused, nothing more done (a double click, or a replay)
    status, _, text = client.post("start", form_fields(page, "start"))
    assert status == 409 and "submitted already" in text
    assert len([r for r in audit_rows(scenario, "run-now") if r["source"] == "monitor"]) == 1


def test_csrf_from_another_origin_or_without_one_is_refused_and_writes_nothing(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/jobs/nightly_ok")[2]
    before = len(audit_rows(scenario))
    for origin, says in (("http://evil.example", "cross-origin request refused"),
                         ("http://127.0.0.1:1", "cross-origin request refused"),
                         ("null", "needs an Origin header"), (None, "needs an Origin header")):
        status, _, text = client.post("pause", form_fields(page, "pause"), origin=origin)
        assert status == 403 and says in text, (origin, text[:300])
    # DNS rebinding: another name for the loopback is not served at all
    status, _, _ = client.request("POST", "/actions/pause", b"", {"Host": "evil.example"})
    assert status == 421
    assert len(audit_rows(scenario)) == before


def test_tokens_are_bound_to_their_session_action_and_target(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/")[2]
    other = Client(servers["operator"])
    other.get("/")                                   # a session of its own
    fields = form_fields(page, "pause", "nightly_ok")
    other_fields = dict(fields)
    status, _, text = other.post("pause", other_fields)      # another session's token
    assert status == 403 and "another session, user, action or target" in text
    status, _, text = client.post("pause", {**fields, "job": "flaky_fail"})   # its token, another job
    assert status == 403 and "another session, user, action or target" in text
    status, _, text = client.post("resume", fields)           # its token, another action
    assert status == 403
    status, _, text = client.post("pause", {**fields, "token": ""})
    assert status == 403 and "missing or malformed" in text
    cookie, client.cookie = client.cookie, None
    status, _, text = client.post("pause", fields)            # no cookie
    assert status == 403 and "no session cookie" in text
    client.cookie = cookie
    status, _, text = client.request("POST", "/actions/pause", urlencode(fields).encode(),
                                     {"Origin": client.origin, "Content-Type": "text/plain"})
    assert status == 415


def test_stop_cancel_and_requeue_ask_first_and_then_do_it(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    (run_id,) = scenario.run_ids["queued_job"]
    page = client.get(f"/runs/{run_id}")[2]
    status, _, text = client.post("cancel", form_fields(page, "cancel"))
    assert status == 200 and "<h1>Confirm</h1>" in text and f"Cancel run {run_id}?" in text
    assert not [r for r in audit_rows(scenario, "cancel") if r["run_id"] == run_id]    # nothing done yet
    confirm = form_fields(text, "cancel")
    assert confirm["confirm"] == "yes"
    status, _, text = client.post("cancel", confirm)
    assert status == 200 and f"run {run_id} cancelled" in text
    # again, from a fresh page: the run is finished, the error in words, audited as refused
    page = client.get("/poison")[2]
    status, _, text = client.post("requeue", form_fields(page, "requeue"))
    assert status == 200 and "Requeue poison message" in text
    status, _, text = client.post("requeue", form_fields(text, "requeue"))
    assert status == 200 and "requeued for one more attempt" in text, text
    rows = [r for r in audit_rows(scenario) if r["source"] == "monitor" and r["action"] in ("cancel", "requeue")]
    assert sorted(r["action"] for r in rows) == ["cancel", "requeue"]


def test_pause_with_until_and_reason_then_resume(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/jobs/poison_me")[2]
    fields = {**form_fields(page, "pause"), "until": "2999-01-01 00:00", "reason": "<b>maintenance</b> 'O'Brien'"}
    status, _, text = client.post("pause", fields)
    assert status == 200 and "paused until 2999-01-01 00:00:00 UTC" in text, text
    page = client.get("/jobs/poison_me")[2]
    assert "&lt;b&gt;maintenance&lt;/b&gt;" in page and "<b>maintenance" not in page
    fields = {**form_fields(page, "pause"), "until": "yesterday"}
    status, _, text = client.post("pause", fields)
    assert status == 409 and "until &#x27;yesterday&#x27;: expected a date and time in UTC" in text
    status, _, text = client.post("resume", form_fields(page, "resume"))
    assert status == 200 and "job &#x27;poison_me&#x27; resumed" in text
    status, _, text = client.post("resume", form_fields(client.get("/jobs/poison_me")[2], "pause") | {})
    assert status == 403                              # a pause token is no resume token
    refused = [r for r in audit_rows(scenario, "pause") if r["source"] == "monitor" and r["outcome"] == "refused"]
    assert len(refused) == 1 and "yesterday" in refused[0]["detail"]


HOSTILE_NAMES = ["<script>alert(1)</script>", "a\"b'c", "../../poison", "x&y=z", "\u202eexe.lmth", "job/with/slashes"]


def test_hostile_job_names_in_forms_and_urls(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/")[2]
    base = form_fields(page, "pause", "nightly_ok")
    for name in HOSTILE_NAMES:
        # a token made for nightly_ok does not act on another name
        status, _, text = client.post("pause", {**base, "job": name})
        assert status == 403 and "<script>" not in text
    # an action name that is not one, or a path below it
    for path in ("/actions/drop", "/actions/%3Cscript%3E", "/actions/pause/x", "/actions/"):
        status, _, text = client.request("POST", path, b"", {"Origin": client.origin,
                                                            "Content-Type": "application/x-www-form-urlencoded"})
        assert status in (404, 405) and "<script>" not in text, (path, status)
    status, _, _ = client.request("GET", "/actions/pause")
    assert status == 404


def test_an_action_on_a_job_removed_meanwhile_says_so(scenario, servers):  # noqa: F811
    from tests.support.monitor_scenario import JOBS

    client = Client(servers["operator"])
    # an invalid job has no start button
    assert 'class="action action-start"' not in client.get("/jobs/broken_job")[2]
    fields = form_fields(client.get("/jobs/waiting_job")[2], "start")
    store = scenario.agent.new_store()
    try:        # the settings no longer hold waiting_job (as the next tick's sync records it)
        store.execute("unconfigure_missing_jobs", jobs=[{"job_name": name} for name in JOBS if name != "waiting_job"],
                      now=scenario.clock())
    finally:
        store.close()
    status, _, text = client.post("start", fields)
    assert status == 409 and "was removed from the settings; it cannot run" in text, text
    (row,) = [r for r in audit_rows(scenario, "run-now") if r["outcome"] == "refused" and r["source"] == "monitor"]
    assert "removed" in row["detail"] and row["job_name"] == "waiting_job"


# ---------------------------------------------------------------- the Azure adapter

def principal(*groups: str, name: str) -> str:
    claims = [{"typ": "groups", "val": group} for group in groups] + [{"typ": "name", "val": name}]
    return base64.b64encode(json.dumps({"auth_typ": "aad", "claims": claims, "name_typ": "name"}).encode()).decode()


@pytest.fixture
def azure(scenario, monkeypatch):  # noqa: F811
    for key in [k for k in os.environ if k.startswith(("JOB__", "AGENT_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AGENT_DB", scenario.db)
    monkeypatch.setenv("AGENT_MONITOR_ALLOWED_GROUP", READERS)
    monkeypatch.setenv("AGENT_MONITOR_OPERATOR_GROUP", OPERATORS)
    reset_default_agent()
    from functions import monitor_trigger

    function = monitor_trigger.agent_monitor.build().get_user_function()

    class Browser:
        def __init__(self, group: str, name: str) -> None:
            self.user = principal(group, name=name)
            self.name = name
            self.cookie: str | None = None

        def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
            sent = {"X-MS-CLIENT-PRINCIPAL": self.user, "X-MS-CLIENT-PRINCIPAL-NAME": self.name,
                    "Host": AZURE_HOST, "X-Forwarded-Proto": "https", **(headers or {})}
            if self.cookie:
                sent["Cookie"] = self.cookie
            request = func.HttpRequest(method, f"https://{AZURE_HOST}/api/monitor{path}", headers=sent,
                                       route_params={"path": path.lstrip("/")}, body=body)
            response = function(request)
            cookie = response.headers.get("Set-Cookie")
            if cookie:
                assert cookie.startswith("__Host-agent-monitor-session=") and "Secure" in cookie
                self.cookie = cookie.split(";")[0]
            return response

        def post(self, action: str, fields: dict[str, str], origin: str = f"https://{AZURE_HOST}"):
            return self.call("POST", f"/actions/{action}", urlencode(fields).encode(),
                             {"Origin": origin, "Content-Type": "application/x-www-form-urlencoded"})

    yield Browser
    reset_default_agent()


def test_azure_an_operator_acts_and_a_reader_gets_403_audited(scenario, azure):  # noqa: F811
    operator = azure(OPERATORS, "grace@example.com")
    page = operator.call("GET", "/jobs/running_long").get_body().decode()
    assert 'action="/api/monitor/actions/stop"' in page and "Signed in as grace@example.com" in page
    response = operator.post("stop", form_fields(page, "stop"))
    assert response.status_code == 200 and b"Stop job" in response.get_body()
    response = operator.post("stop", form_fields(response.get_body().decode(), "stop"))
    body = response.get_body().decode()
    assert response.status_code == 200 and "job &#x27;running_long&#x27; stopped: run(s)" in body, body
    (row,) = [r for r in audit_rows(scenario, "stop") if r["source"] == "monitor"]
    assert row["principal"] == "grace@example.com" and row["client"] == f"monitor at {AZURE_HOST}"
    assert row["outcome"] == "done"

    reader = azure(READERS, "ada@example.com")
    page = reader.call("GET", "/jobs/running_long").get_body().decode()
    assert "<form" not in page and "Signed in as ada@example.com" in page
    reader.cookie = operator.cookie
    response = reader.post("start", form_fields(operator.call("GET", "/jobs/nightly_ok").get_body().decode(), "start"))
    assert response.status_code == 403 and b"may read the monitor but not act" in response.get_body()
    (row,) = [r for r in audit_rows(scenario, "run-now") if r["principal"] == "ada@example.com"]
    assert row["outcome"] == "refused" and row["source"] == "monitor"
    # another origin (even another https name of the app) is refused before anything is recorded
    before = len(audit_rows(scenario))
    response = operator.post("start", form_fields(operator.call("GET", "/jobs/nightly_ok").get_body().decode(), "start"),
                             origin="https://evil.example")
    assert response.status_code == 403 and b"cross-origin request refused" in response.get_body()
    response = operator.post("start", {}, origin=f"http://{AZURE_HOST}")
    assert response.status_code == 403
    assert len(audit_rows(scenario)) == before
    # someone in neither group
    stranger = azure("another-group", "mallory@example.com")
    assert stranger.post("start", {}).status_code == 403
