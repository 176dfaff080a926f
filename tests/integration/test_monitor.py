"""The Job Activity Monitor's pages (shared/web/app.py, pages.py) on SQLite and PostgreSQL, over jobs in
every state built by the engine itself (tests/support/monitor_scenario.py): what each page shows, that
every value from the database is escaped, that each JSON twin is what the CLI prints, the
security headers, GET/HEAD only, a fixed number of SELECTs whatever the number of jobs, and the
`monitor --port` server on the loopback."""

from __future__ import annotations

import contextlib
import html
import json
import re
import signal
import socket
import time
import subprocess
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from shared.engine import views
from shared.web.app import SECURITY_HEADERS, Monitor, MonitorSettings, monitor_settings
from shared.web.html import OUTCOME_COLOURS
from tests.support import monitor_scenario
from tests.support.harness import ROOT, as_from_a_terminal, create_pg_database, drop_pg_database

UTC = timezone.utc
PYTHON = str(ROOT / ".venv" / "bin" / "python")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def scenario(request, tmp_path_factory):
    if request.param == "sqlite":
        built = monitor_scenario.build(f"sqlite:///{tmp_path_factory.mktemp('monitor') / 'agent.db'}")
        yield built
        built.close()
        return
    name, url = create_pg_database()
    built = monitor_scenario.build(url)
    try:
        yield built
    finally:
        built.close()
        drop_pg_database(name)


class Recorder:
    """The statements a store sends, in order (to check that pages only read, and how often)."""

    def __init__(self, store) -> None:
        self.store = store
        self.statements: list[str] = []
        original = store._execute_statement

        def record(sql, values):
            self.statements.append(sql)
            return original(sql, values)

        store._execute_statement = record


def monitor_on(scenario, base_path: str = "", settings: MonitorSettings | None = None):
    store = scenario.agent.new_store()
    recorder = Recorder(store)

    @contextlib.contextmanager
    def lend():
        # As the monitor's pool lends a store: its connection goes back to the agent's pool
        # (AGENT_MAX_CONNECTIONS) when the request ends.
        try:
            yield store
        finally:
            store.close()

    monitor = Monitor(lend, clock=lambda: datetime.now(UTC),
                      settings=lambda: settings or MonitorSettings(), base_path=base_path)
    return monitor, recorder


def page(monitor, path: str, query: str = "", accept: str = "") -> str:
    response = monitor.handle("GET", path, query, accept)
    assert response.status == 200, (path, response.status, response.body[:500])
    return response.body.decode()


def row_of(text: str, job: str) -> str:
    match = re.search(rf'<tr class="job" id="job-{job}">(.*?)</tr>', text, re.S)
    assert match, f"no row for {job}"
    return re.sub(r"<[^>]+>", " ", match.group(1))


# ---------------------------------------------------------------- what the pages show


def test_jobs_page_shows_every_state(scenario):
    monitor, _ = monitor_on(scenario)
    text = page(monitor, "/")
    running = row_of(text, "running_long")
    assert "running since" in running and "worker-7" in running
    assert "running since" in row_of(text, "stale_worker") and "worker-gone" in row_of(text, "stale_worker")
    assert "queued since its slot" in row_of(text, "queued_job")
    assert "retrying at" in row_of(text, "retrying")
    assert "waiting since its slot" in row_of(text, "waiting_job")
    nightly = row_of(text, "nightly_ok")
    assert "idle" in nightly and "succeeded" in nightly and "settings" in nightly
    assert "at 02:30 every day" in nightly and "0 30 2 * * *" in nightly and "Europe/Paris" in nightly
    assert re.search(r"\d{4}-\d\d-\d\d 02:30:00 Europe/Paris", nightly), nightly     # next slot, local time
    assert "failed" in row_of(text, "flaky_fail") and "poisoned" in row_of(text, "poison_me")
    assert "disabled" in row_of(text, "disabled_job")
    broken = row_of(text, "broken_job")
    assert "invalid" in broken and "JOB__broken_job__SCHEDULE" in broken
    assert "at 09:00, Monday to Friday" in row_of(text, "waiting_job")
    assert '<meta http-equiv="refresh" content="30">' in text


def bars(text: str) -> list[tuple[str, str]]:
    return re.findall(r'<rect class="bar bar-(\w+)" data-run="\d+"[^>]*fill="(#[0-9a-f]{6})"', text)


def test_job_page_draws_one_bar_per_run_coloured_by_outcome(scenario):
    monitor, _ = monitor_on(scenario)
    nightly = page(monitor, "/jobs/nightly_ok")
    assert bars(nightly) == [("succeeded", OUTCOME_COLOURS["succeeded"])] * monitor_scenario.SUCCEEDED_RUNS
    assert "5 run(s) in the window" in nightly
    for run_id in scenario.run_ids["nightly_ok"]:
        assert f'<a href="/runs/{run_id}"><rect' in nightly
    failed = page(monitor, "/jobs/flaky_fail")
    assert bars(failed) == [("failed", "#c62828")]
    assert bars(page(monitor, "/jobs/running_long")) == [("running", OUTCOME_COLOURS["running"])]
    week = page(monitor, "/jobs/nightly_ok", "window=7d")
    assert len(bars(week)) == monitor_scenario.SUCCEEDED_RUNS and "<strong>7d</strong>" in week
    # the history table: every run, its attempts, its error
    assert nightly.count('<tr><td><a href="/runs/') == monitor_scenario.SUCCEEDED_RUNS
    retrying = page(monitor, "/jobs/retrying")
    assert "no_such_table_here" in retrying and "#1 <span class=\"outcome-failed\">failed</span>" in retrying
    bad = monitor.handle("GET", "/jobs/nightly_ok", "window=1y")
    assert bad.status == 400 and b"window=&#x27;1y&#x27;: expected one of 24h, 7d" in bad.body
    assert monitor.handle("GET", "/jobs/ghost").status == 404


def test_timeline_says_when_the_window_holds_more_runs_than_it_draws(scenario, monkeypatch):
    monkeypatch.setattr(views, "TIMELINE_LIMIT", 3)
    monitor, _ = monitor_on(scenario)
    text = page(monitor, "/jobs/nightly_ok")
    assert len(bars(text)) == 3 and "holds more than 3 runs: the latest 3 are drawn" in text
    data = json.loads(page(monitor, "/jobs/nightly_ok", "format=json"))
    assert data["timeline"]["cut"] is True and len(data["timeline"]["runs"]) == 3


def test_run_page_shows_attempts_command_and_poison(scenario):
    monitor, _ = monitor_on(scenario)
    (failed_run,) = scenario.run_ids["flaky_fail"]
    text = page(monitor, f"/runs/{failed_run}")
    assert "<h2>Attempts</h2>" in text and "<h2>Poison messages</h2>" in text
    assert html.escape(f'SELECT * FROM "{monitor_scenario.HOSTILE}"') in text          # the command
    assert text.count('class="outcome-failed"') >= 2                                     # run and attempt
    (poisoned_run,) = scenario.run_ids["poison_me"]
    poisoned = page(monitor, f"/runs/{poisoned_run}")
    assert "dequeue count 6 is above AGENT_MAX_DEQUEUE_COUNT=5" in poisoned
    assert monitor.handle("GET", "/runs/999999").status == 404
    assert monitor.handle("GET", "/runs/abc").status == 404


def test_poison_and_stuck_pages(scenario):
    monitor, _ = monitor_on(scenario)
    poison = page(monitor, "/poison")
    assert "dequeue count 6 is above AGENT_MAX_DEQUEUE_COUNT=5" in poison
    assert "malformed message: body is not JSON" in poison and "{not json at all" in poison
    (poisoned_run,) = scenario.run_ids["poison_me"]
    assert f'<a href="/runs/{poisoned_run}">' in poison
    stuck = page(monitor, "/stuck")
    (stale,) = scenario.run_ids["stale_worker"]
    assert f'<a href="/runs/{stale}">' in stuck and "stale_worker" in stuck
    assert "running_long" not in stuck                       # its lease is still good
    assert "queued_job" not in stuck and "waiting_job" not in stuck
    assert monitor.handle("GET", "/stuck", "limit=0").status == 400


def test_every_database_value_is_escaped(scenario):
    """The hostile error message appears only escaped; no page holds a script element."""
    monitor, _ = monitor_on(scenario)
    (failed_run,) = scenario.run_ids["flaky_fail"]
    escaped = html.escape(monitor_scenario.HOSTILE)
    for path in ["/", "/jobs/flaky_fail", f"/runs/{failed_run}", "/poison", "/stuck", "/jobs/broken_job"]:
        text = page(monitor, path)
        assert monitor_scenario.HOSTILE not in text
        assert "<script" not in text.lower(), path
    assert page(monitor, "/jobs/flaky_fail").count(escaped) >= 3        # bar title, attempt, run error
    assert escaped in page(monitor, f"/runs/{failed_run}")


# ---------------------------------------------------------------- JSON twins


def cli_json(scenario, *args: str):
    result = subprocess.run([PYTHON, "-m", "shared.cli", "--db", scenario.db, *args, "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_each_json_twin_is_what_the_command_prints(scenario):
    monitor, _ = monitor_on(scenario)
    twin = lambda path, query="format=json": json.loads(page(monitor, path, query))  # noqa: E731
    assert twin("/") == cli_json(scenario, "jobs")
    job = twin("/jobs/nightly_ok")
    assert {"runs": job["runs"], "job_events": job["job_events"]} == cli_json(scenario, "history", "--job", "nightly_ok")
    assert twin("/poison") == cli_json(scenario, "poison", "list")
    assert twin("/stuck") == cli_json(scenario, "stuck")
    (stale,) = scenario.run_ids["stale_worker"]
    run = twin(f"/runs/{stale}")
    assert run["run"]["worker"] == "worker-gone" and run["attempts"][0]["outcome"] == "running"


def test_jobs_json_keeps_the_old_keys_and_adds_the_monitors(scenario):
    rows = cli_json(scenario, "jobs")
    old = {"job_name", "schedule", "timezone", "enabled", "valid", "config_error", "configured", "misfire", "overlap",
           "max_attempts", "next_due_at", "last_run_id", "last_status", "last_scheduled_for", "last_finished_at"}
    new = {"source", "needs_planning", "state", "schedule_words", "next_due_local", "status", "status_since",
           "status_worker", "retry_at", "runs_in_flight",
           "last_targets_total", "last_targets_failed",       # issue 16: the last run's fleet
           "paused", "paused_at", "paused_until", "paused_by", "pause_reason",     # issue 27: pause and resume
           "after_job", "after_outcome",                      # issue 27: whom the job follows
           "calendars", "calendar_words", "jitter_seconds",   # issue 33: the job's calendars, jitter
           "max_duration_seconds", "stop_after_seconds", "slower_than", "deadline_seconds",   # issue 32: alerts
           "params",                                          # issue 33 item 4: the parameters it declares
           "catchup_seconds"}                                 # issue 33 item 5: its catch-up window (0: none)
    for row in rows:
        assert set(row) == old | new
    by_name = {row["job_name"]: row for row in rows}
    assert by_name["running_long"]["status"] == "running" and by_name["running_long"]["status_worker"] == "worker-7"
    assert by_name["retrying"]["status"] == "retrying" and by_name["retrying"]["retry_at"]
    assert by_name["nightly_ok"]["next_due_local"].endswith(("+01:00", "+02:00"))


def test_json_or_html_chosen_by_format_or_accept(scenario):
    monitor, _ = monitor_on(scenario)
    as_json = monitor.handle("GET", "/", "", "application/json")
    assert as_json.content_type.startswith("application/json") and isinstance(json.loads(as_json.body), list)
    browser = monitor.handle("GET", "/", "", "text/html,application/xhtml+xml,application/json;q=0.9,*/*;q=0.8")
    assert browser.content_type.startswith("text/html")
    forced = monitor.handle("GET", "/", "format=html", "application/json")
    assert forced.content_type.startswith("text/html")
    assert monitor.handle("GET", "/poison", "format=json").content_type.startswith("application/json")
    bad = monitor.handle("GET", "/", "format=xml")
    assert bad.status == 400 and b"format=&#x27;xml&#x27;: expected json or html" in bad.body
    missing = monitor.handle("GET", "/jobs/ghost", "format=json")
    assert missing.status == 404 and json.loads(missing.body) == {"error": "no job named 'ghost'"}


# ---------------------------------------------------------------- read-only and safe


def test_security_headers_on_every_response(scenario):
    monitor, _ = monitor_on(scenario)
    responses = [monitor.handle("GET", p, q) for p, q in [("/", ""), ("/", "format=json"), ("/monitor.css", ""),
                                                          ("/nope", ""), ("/jobs/x", "window=2"), ("/stuck", "")]]
    responses += [monitor.handle("POST", "/"), monitor.handle("HEAD", "/poison")]
    for response in responses:
        headers = response.all_headers()
        for name, value in SECURITY_HEADERS.items():
            assert headers[name] == value
        assert "script-src" not in headers["Content-Security-Policy"]
        assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    css = monitor.handle("GET", "/monitor.css")
    assert css.content_type.startswith("text/css") and b"svg.timeline" in css.body


def test_only_get_and_head(scenario):
    monitor, recorder = monitor_on(scenario)
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        response = monitor.handle(method, "/")
        assert response.status == 405 and response.headers["Allow"] == "GET, HEAD"
        assert f"{method} is not allowed".encode() in response.body
    assert recorder.statements == []                        # refused before any query
    get = monitor.handle("GET", "/jobs/nightly_ok")
    head = monitor.handle("HEAD", "/jobs/nightly_ok")
    assert head.status == 200 and head.body == b""
    assert head.all_headers()["Content-Type"] == get.all_headers()["Content-Type"]
    assert abs(int(head.headers["Content-Length"]) - len(get.body)) < 40     # the "as of" time may tick
    assert monitor.handle("HEAD", "/nope").body == b""


def test_pages_run_only_selects(scenario):
    monitor, recorder = monitor_on(scenario)
    (run_id,) = scenario.run_ids["poison_me"]
    for path, query in [("/", ""), ("/jobs/nightly_ok", ""), ("/jobs/nightly_ok", "window=7d"),
                        (f"/runs/{run_id}", ""), ("/poison", ""), ("/stuck", ""), ("/", "format=json")]:
        page(monitor, path, query)
    assert recorder.statements
    for sql in recorder.statements:
        code = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--")).strip()
        assert code.upper().startswith("SELECT"), code[:200]
        assert ";" not in code.rstrip(";"), code[:200]


def test_fixed_number_of_selects_whatever_the_number_of_jobs(scenario, tmp_path):
    monitor, recorder = monitor_on(scenario)
    counts = {}
    for path in ("/", "/jobs/nightly_ok", "/poison", "/stuck"):
        recorder.statements.clear()
        page(monitor, path)
        counts[path] = len(recorder.statements)
    # Each page reads the agent's liveness once (agent.state's last_tick: shared/engine/liveness.py).
    assert counts["/"] == 3
    assert counts["/jobs/nightly_ok"] <= 8          # liveness, job, activity, timeline, runs, attempts, output, events
    assert counts["/poison"] == counts["/stuck"] == 2
    (run_id,) = scenario.run_ids["poison_me"]
    recorder.statements.clear()
    page(monitor, f"/runs/{run_id}")
    assert len(recorder.statements) == 4
    # the same pages over six times as many jobs (the scenario plus 50 idle jobs), same dialect
    pg_name = None
    if scenario.db.startswith("sqlite"):
        other = f"sqlite:///{tmp_path / 'bigger.db'}"
    else:
        pg_name, other = create_pg_database()
    bigger = monitor_scenario.build(other, extra_jobs=50)
    try:
        big_monitor, big_recorder = monitor_on(bigger)
        text = page(big_monitor, "/")
        assert text.count('<tr class="job"') == len(monitor_scenario.JOBS) + 50 == 60
        assert len(big_recorder.statements) == counts["/"]
        big_recorder.statements.clear()
        page(big_monitor, "/jobs/nightly_ok")
        assert len(big_recorder.statements) == counts["/jobs/nightly_ok"]
    finally:
        bigger.close()
        if pg_name:
            drop_pg_database(pg_name)


def test_where_a_job_is_defined_comes_from_the_row():
    """When list_jobs returns a `source` (the T-SQL interface), it shows through."""
    now = datetime.now(UTC)
    base = {"job_name": "j", "schedule": "0 0 1 * * *", "timezone": "UTC", "enabled": 1, "valid": 1,
            "config_error": None, "configured": 1, "next_due_at": None}
    (from_settings,) = views._with_activity([dict(base)], [], now)
    (from_tsql,) = views._with_activity([{**base, "source": "T-SQL (agent.add_job)"}], [], now)
    assert from_settings["source"] == views.DEFAULT_JOB_SOURCE == "settings"
    assert from_tsql["source"] == "T-SQL (agent.add_job)"


def test_settings_from_the_environment(scenario):
    assert monitor_settings({}) == MonitorSettings(refresh_seconds=30, allowed_group=None)
    assert monitor_settings({"AGENT_MONITOR_REFRESH_SECONDS": "0", "AGENT_MONITOR_ALLOWED_GROUP": " g1 "}) == \
        MonitorSettings(refresh_seconds=0, allowed_group="g1")
    none, _ = monitor_on(scenario, settings=MonitorSettings(refresh_seconds=0))
    assert 'http-equiv="refresh"' not in page(none, "/")
    fifteen, _ = monitor_on(scenario, settings=MonitorSettings(refresh_seconds=15))
    assert '<meta http-equiv="refresh" content="15">' in page(fifteen, "/")
    store = scenario.agent.new_store()
    broken = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: datetime.now(UTC),
                     settings=lambda: monitor_settings({"AGENT_MONITOR_REFRESH_SECONDS": "soon"}))
    response = broken.handle("GET", "/")
    assert response.status == 500
    assert b"AGENT_MONITOR_REFRESH_SECONDS=&#x27;soon&#x27;: expected a whole number from 0 to 86400" in response.body
    store.close()


def test_links_carry_the_base_path(scenario):
    monitor, _ = monitor_on(scenario, base_path="/api/monitor")
    (run_id,) = scenario.run_ids["flaky_fail"]
    for path in ["/", "/jobs/flaky_fail", f"/runs/{run_id}", "/poison", "/stuck"]:
        text = page(monitor, path)
        links = re.findall(r'href="([^"]*)"', text)
        assert links and all(link.startswith("/api/monitor/") for link in links), (path, links)
    assert 'href="/api/monitor/jobs/flaky_fail?window=7d"' in page(monitor, "/jobs/flaky_fail")
    assert 'href="/api/monitor/jobs/flaky_fail?format=json"' in page(monitor, "/jobs/flaky_fail")


# ---------------------------------------------------------------- the local server


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def monitor_process(db: str, port: int, **env: str):
    process = subprocess.Popen([PYTHON, "-m", "shared.cli", "--db", db, "monitor", "--port", str(port)], cwd=ROOT,
                               stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={"PATH": "/usr/bin:/bin", **env}, preexec_fn=as_from_a_terminal)
    try:
        line = process.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line + process.stderr.read()
        yield process, f"http://127.0.0.1:{match.group(1)}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET"):
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_monitor_command_serves_on_the_loopback_and_stops_on_ctrl_c(scenario):
    with monitor_process(scenario.db, 0) as (process, url):
        status, headers, body = fetch(url + "/", {"X-MS-CLIENT-PRINCIPAL-NAME": "mallory@example.com"})
        assert status == 200 and b"running_long" in body
        assert headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]
        assert b"mallory" not in body and b'<span class="user">local</span>' in body   # headers ignored
        port = int(url.rsplit(":", 1)[1])
        status, _, body = fetch(f"http://localhost:{port}/poison?format=json")
        assert status == 200 and json.loads(body)
        status, _, body = fetch(url + "/", {"Host": f"evil.example:{port}"})      # DNS rebinding
        assert status == 421 and b"evil.example" in body
        status, headers, _ = fetch(url + "/", method="POST")
        assert status == 405 and headers["Allow"] == "GET, HEAD"
        with pytest.raises(OSError):        # bound to 127.0.0.1 alone: another address of this host is refused
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        assert "monitor stopped" in process.stderr.read()


def _raw_exchange(port: int, data: bytes) -> list[bytes]:
    """What the monitor answers on one connection to ``data``, until it closes it (at most 5 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(data)
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except socket.timeout:
            pass
    return re.findall(rb"HTTP/1\.[01] (\d{3})", received)


def test_a_body_the_monitor_does_not_read_never_becomes_the_next_request(scenario):
    """An attack (request desync): the body of a request answered 421 (another Host, DNS
    rebinding), 405 (a method the monitor has not) or a GET with a body was read as the next
    request on the connection, with the Host, Origin and Cookie it wrote itself; a POST hidden so
    paused a job. The connection is closed after such an answer: one request, one answer."""
    with monitor_process(scenario.db, 0) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        hidden = (f"GET /nosuchpage-SMUGGLED HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").encode()
        for head in (f"GET / HTTP/1.1\r\nHost: evil.example:{port}",      # 421
                     f"PUT / HTTP/1.1\r\nHost: 127.0.0.1:{port}",            # 405
                     f"DELETE /jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}",
                     f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}"):           # 200, its body unread
            statuses = _raw_exchange(port, f"{head}\r\nContent-Length: {len(hidden)}\r\n\r\n".encode() + hidden)
            assert len(statuses) == 1 and statuses[0] != b"404", (head, statuses)
        chunked = (f"POST /actions/pause HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked\r\n\r\n"
                   f"{len(hidden):x}\r\n").encode() + hidden + b"\r\n0\r\n\r\n"
        assert _raw_exchange(port, chunked) == [b"411"]
        # Without a body, a connection stays open for the next request (keep-alive).
        two = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode() * 2
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(two)
            received, deadline = b"", time.monotonic() + 5
            while received.count(b"HTTP/1.1 200") < 2 and time.monotonic() < deadline:
                received += connection.recv(65536)
        assert received.count(b"HTTP/1.1 200") == 2


def test_port_in_use_is_one_line_and_exit_2(scenario):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run([PYTHON, "-m", "shared.cli", "--db", scenario.db, "monitor", "--port", str(port)],
                                cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --port {port}: cannot listen on 127.0.0.1:{port}")


def test_invalid_monitor_setting_is_one_line_and_exit_2(scenario):
    result = subprocess.run([PYTHON, "-m", "shared.cli", "--db", scenario.db, "monitor", "--port", "0"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "AGENT_MONITOR_REFRESH_SECONDS": "-1"})
    assert result.returncode == 2
    assert result.stderr.strip() == "error: AGENT_MONITOR_REFRESH_SECONDS='-1': expected a whole number from 0 to 86400"


def test_a_database_it_cannot_read_is_one_line_503(tmp_path):
    """No schema (or no server): the page says so in one line, with the security headers."""
    from shared.control.db import parse_database_url
    from shared.control.store import Store

    store = Store(parse_database_url(f"sqlite:///{tmp_path / 'empty.db'}"))
    monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: datetime.now(UTC),
                      settings=lambda: MonitorSettings())
    for query in ("", "format=json"):
        response = monitor.handle("GET", "/", query)
        assert response.status == 503
        assert b"the control database could not be read: OperationalError: no such table" in response.body
        assert response.all_headers()["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    store.close()


def test_a_step_jobs_pages_show_each_step_and_its_output(agent_factory, db_url):
    """A two-step job: the job page lists each attempt with its step, and the run page has the
    step, the database and what the server said (a PostgreSQL notice, SQLite's rows affected),
    escaped like everything else."""
    from tests.support.harness import Clock, at, sql_for, work

    notice = sql_for(db_url, "CREATE TABLE IF NOT EXISTS t (x INT); INSERT INTO t VALUES (1), (2)",
                     "DO $$BEGIN RAISE NOTICE 'cleaned <b>7</b> rows'; END$$", "PRINT 'cleaned <b>7</b> rows'")
    clock = Clock(at("2026-03-01T09:59:55"))
    agent = agent_factory({"two_steps": {"SCHEDULE": "0 0 10 * * *", "STEPS__1__COMMAND": "SELECT 1",
                                         "STEPS__2__COMMAND": notice}}, clock=clock)
    agent.tick()
    clock.advance(6)
    work(agent, concurrency=1)
    (run_id,) = [r["run_id"] for r in agent.store().execute("list_history", job_name="two_steps", limit=5).rows]
    store = agent.new_store()
    monitor = Monitor(lambda: contextlib.nullcontext(store), clock=clock, settings=lambda: MonitorSettings())
    job_page = page(monitor, "/jobs/two_steps")
    assert "#1 step 1 " in re.sub(r"<[^>]+>", "", job_page) and "#2 step 2 " in re.sub(r"<[^>]+>", "", job_page)
    run_page = page(monitor, f"/runs/{run_id}")
    expected = "cleaned &lt;b&gt;7&lt;/b&gt; rows" if db_url.startswith("Driver") else "2 row"
    assert expected in run_page and "<b>7</b>" not in run_page
    run_json = json.loads(page(monitor, f"/runs/{run_id}", "format=json"))
    assert [a["step"] for a in run_json["attempts"]] == [1, 2]
    assert ("cleaned <b>7</b> rows" if db_url.startswith("Driver") else "2 row") in run_json["attempts"][1]["output"]
