"""The monitor in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium; nothing is downloaded at test time) against the local server on PostgreSQL,
over jobs in every state (tests/support/monitor_scenario.py). The tests assert what a person sees: the
text, the number of bars, the colour of a failed run, a hostile error message shown as text with
no script run; and they compare each JSON twin, as the browser receives it, with the CLI's
`--json`. Screenshots go to .scratch/monitor-screenshots/; docs/images/ holds copies: monitor-jobs,
-job, -confirm and -stuck (with the late-agent banner) are an operator's pages through the Azure
adapter (azure-*.png), monitor-run, -poison and -audit a reader's in the local server, monitor-job-form an
operator's preview on the job form in the local server (job-form-preview.png).

With CI=true a missing Chromium fails these tests; elsewhere they are skipped."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from shared.engine.agent import Agent
from shared.settings import load_settings
from shared.web.local_server import make_server
from tests.support import monitor_scenario
from tests.support.harness import ROOT, create_pg_database, drop_pg_database, service_missing

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = ROOT / ".scratch" / "monitor-screenshots"
PYTHON = str(ROOT / ".venv" / "bin" / "python")


@pytest.fixture(scope="module")
def browser():
    chromium = CHROMIUM if CHROMIUM.exists() else None
    driver_path = CHROMEDRIVER if CHROMEDRIVER.exists() else None
    if chromium is None or driver_path is None:
        service_missing("Chromium", "apt-get install chromium chromium-driver (.ci/run does)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        service_missing("selenium", f"pip install -r requirements-dev.txt ({exc})")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1500,1000", "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(driver_path)), options=options)
    driver.set_page_load_timeout(60)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def site():
    """The scenario on a PostgreSQL database of its own, served by the local server (the one
    `monitor --port` runs) on a free port of 127.0.0.1."""
    name, url = create_pg_database()
    scenario = monitor_scenario.build(url)
    agent = Agent(load_settings(environ={}), db=url)
    server = make_server(agent, 0, environ={})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield scenario, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        agent.close()
        scenario.close()
        drop_pg_database(name)


def shot(driver, name: str) -> None:
    """The whole page, as tall as its content (Chromium's own capture beyond the viewport; a
    short page is not padded to the window's height)."""
    import base64

    width, height = driver.execute_script(
        "return [document.documentElement.scrollWidth, Math.ceil(document.body.getBoundingClientRect().bottom) + 8]")
    capture = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 4000), "scale": 1}})
    (SCREENSHOTS / f"{name}.png").write_bytes(base64.b64decode(capture["data"]))


def text_of(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def click_through(driver, selector: str) -> None:
    """Click the button and wait until the page it posts to has replaced this one (reading the
    next page's heading at once could read this page's, or a node the navigation removed).
    The old document is marked with a script variable, which a new document does not have; an
    element reference is not used for this, since Chromium answers a question about a node of a
    document being replaced with an "unknown error" ("Node with given id does not belong to the
    document") rather than a stale element."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    driver.execute_script("window.__agentOldPage = true;")
    driver.find_element(By.CSS_SELECTOR, selector).click()

    def replaced(d) -> bool:
        try:
            return bool(d.execute_script(
                "return window.__agentOldPage !== true && document.readyState === 'complete'"
                " && document.getElementsByTagName('h1').length > 0;"))
        except WebDriverException:   # asked while the navigation swapped documents: ask again
            return False

    WebDriverWait(driver, 30, poll_frequency=0.1).until(replaced)


def test_the_jobs_page_as_a_person_sees_it(browser, site):
    from selenium.webdriver.common.by import By

    scenario, url = site
    browser.get(url + "/")
    assert browser.title == "Jobs · SQL Agent monitor"
    rows = {row.get_attribute("id")[len("job-"):]: row.text
            for row in browser.find_elements(By.CSS_SELECTOR, "tr.job")}
    assert set(rows) == set(monitor_scenario.JOBS)
    assert "running since" in rows["running_long"] and "on worker-7" in rows["running_long"]
    assert "queued since its slot" in rows["queued_job"]
    assert "retrying at" in rows["retrying"]
    assert "waiting since its slot" in rows["waiting_job"]
    assert "idle" in rows["nightly_ok"] and "at 02:30 every day" in rows["nightly_ok"]
    assert "Europe/Paris" in rows["nightly_ok"]
    assert "invalid" in rows["broken_job"] and "JOB__broken_job__SCHEDULE" in rows["broken_job"]
    assert "disabled" in rows["disabled_job"]
    # the stylesheet came from the app and the CSP let it apply
    header = browser.find_element(By.TAG_NAME, "header")
    assert header.value_of_css_property("background-color") == "rgba(38, 50, 56, 1)"
    shot(browser, "jobs")


def test_timeline_bars_and_the_colour_of_a_failed_run(browser, site):
    from selenium.webdriver.common.by import By

    scenario, url = site
    browser.get(url + "/jobs/nightly_ok")
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.bar")
    assert len(bars) == monitor_scenario.SUCCEEDED_RUNS
    assert {bar.value_of_css_property("fill") for bar in bars} == {"rgb(46, 125, 50)"}
    shot(browser, "job")
    browser.get(url + "/jobs/flaky_fail")
    (failed,) = browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.bar")
    assert failed.value_of_css_property("fill") == "rgb(198, 40, 40)"
    assert failed.find_element(By.TAG_NAME, "title").get_attribute("textContent").startswith(
        f"run {scenario.run_ids['flaky_fail'][0]} · failed")
    # a bar links to its run
    href = browser.execute_script("return arguments[0].closest('a').getAttribute('href')", failed)
    browser.get(url + href)
    assert browser.title == f"Run {scenario.run_ids['flaky_fail'][0]} · SQL Agent monitor"


def test_a_hostile_error_message_is_shown_as_text_and_runs_no_script(browser, site):
    from selenium.webdriver.common.by import By

    scenario, url = site
    (run_id,) = scenario.run_ids["flaky_fail"]
    for path in ("/jobs/flaky_fail", f"/runs/{run_id}"):
        browser.get(url + path)
        assert "pwned" not in browser.title
        assert browser.execute_script("return document.scripts.length") == 0
        errors = [element.text for element in browser.find_elements(By.CSS_SELECTOR, ".error")]
        assert any(monitor_scenario.HOSTILE in text for text in errors), errors   # the characters, as typed
        assert not browser.find_elements(By.CSS_SELECTOR, ".error b")             # no markup made of them
    shot(browser, "run")


def test_poison_and_stuck_pages(browser, site):
    scenario, url = site
    browser.get(url + "/poison")
    text = text_of(browser)
    assert "dequeue count 6 is above AGENT_MAX_DEQUEUE_COUNT=5" in text and "{not json at all" in text
    shot(browser, "poison")
    browser.get(url + "/stuck")
    text = text_of(browser)
    assert "stale_worker" in text and "running_long" not in text
    shot(browser, "stuck")


def cli_json(db: str, *args: str):
    result = subprocess.run([PYTHON, "-m", "shared.cli", "--db", db, *args, "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_json_twins_the_browser_gets_equal_the_command_output(browser, site):
    from selenium.webdriver.common.by import By

    scenario, url = site

    def twin(path: str):
        browser.get(url + path)
        return json.loads(browser.find_element(By.TAG_NAME, "body").text)

    assert twin("/?format=json") == cli_json(scenario.db, "jobs")
    assert twin("/poison?format=json") == cli_json(scenario.db, "poison", "list")
    assert twin("/stuck?format=json") == cli_json(scenario.db, "stuck")
    job = twin("/jobs/retrying?format=json")
    assert {"runs": job["runs"], "job_events": job["job_events"]} == cli_json(scenario.db, "history", "--job", "retrying")


AUDIT_HOSTILE = ["O'Brien \"ops\"", "<script>document.title='pwned'</script>", "\u202eexe.lmth", "</td><td>x"]


def test_the_audit_page_shows_hostile_principals_and_names_as_text(browser, site):
    """Rows of the audit trail whose principal, origin, job and arguments are hostile (quotes,
    markup, a right-to-left override) beside one the CLI wrote: each cell shows the characters as
    typed, no script runs, no markup is made of them; the JSON twin is `audit --json`."""
    from datetime import datetime, timezone

    from selenium.webdriver.common.by import By

    scenario, url = site
    store = scenario.agent.new_store()
    try:
        for n, text in enumerate(AUDIT_HOSTILE):
            store.execute("insert_audit", now=datetime.now(timezone.utc), principal=text, fallback_principal="x",
                          client=text, source="monitor", action="pause", job_name=text, run_id=None,
                          arguments=json.dumps({"reason": text}), audit_outcome="refused" if n % 2 else "done",
                          detail=text)
    finally:
        store.close()
    cli_json(scenario.db, "stop", "nightly_ok")
    browser.get(url + "/audit")
    assert browser.title == "Audit trail · SQL Agent monitor"
    assert browser.execute_script("return document.scripts.length") == 0
    rows = browser.find_elements(By.CSS_SELECTOR, "table.audit tbody tr")
    assert len(rows) == len(AUDIT_HOSTILE) + 1
    cells = [[cell.get_attribute("textContent") for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert cells[0][5] == "stop" and cells[0][6] == "job nightly_ok" and cells[0][8] == "done"
    for text, row in zip(reversed(AUDIT_HOSTILE), cells[1:]):
        # Principal, from, detail: as typed, an invisible control character shown by its code
        # point ("\u202eexe.lmth" cannot read "html.exe").
        shown = text.replace("\u202e", "<U+202E>")
        assert (row[2], row[3], row[9]) == (shown, shown, shown), row
        assert row[6] == f"job {shown}" and json.loads(row[7].replace("<U+202E>", "\\u202e")) == {"reason": text}
    assert not browser.find_elements(By.CSS_SELECTOR, "table.audit td script, table.audit td td")
    refused = browser.find_elements(By.CSS_SELECTOR, "span.audit-refused")
    assert len(refused) == 2 and refused[0].value_of_css_property("color") == "rgba(198, 40, 40, 1)"
    shot(browser, "audit")
    browser.get(url + "/audit?format=json")
    assert json.loads(browser.find_element(By.TAG_NAME, "body").text) == cli_json(scenario.db, "audit")


def test_screenshots_were_saved(browser, site):
    for name in ("jobs", "job", "run", "poison", "stuck"):
        path = SCREENSHOTS / f"{name}.png"
        assert path.exists() and path.stat().st_size > 5000, path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_operator_clicks_start_and_stop_and_a_reader_sees_no_button(browser, site):
    """Issue 32 items 5 and 8, in the local server: the operator's buttons clicked in Chromium
    (stop asks first), the result shown in words; the read-only server shows no form."""
    from selenium.webdriver.common.by import By

    scenario, url = site
    operator = make_server(scenario.agent, 0, environ={}, operator=True)
    thread = threading.Thread(target=operator.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{operator.server_address[1]}"
        browser.get(base + "/jobs/nightly_ok")
        click_through(browser, "button.act-start")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Done"
        assert "job 'nightly_ok' started: run" in text_of(browser)
        browser.get(base + "/jobs/running_long")
        click_through(browser, "button.act-stop")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Confirm"
        click_through(browser, "button.act-stop")
        assert "job 'running_long' stopped: run(s)" in text_of(browser)
        shot(browser, "action-done")
    finally:
        operator.shutdown()
        operator.server_close()
    browser.get(url + "/jobs/nightly_ok")
    assert not browser.find_elements(By.TAG_NAME, "form")


def test_an_operator_defines_previews_saves_edits_and_removes_a_job(browser, site):
    """Issue 32 item 6, in the local server (--operator): the job form typed into and clicked in
    Chromium — define, preview (five slots in the job's time zone and UTC), save, edit, remove (it
    asks first); each result shown in words; a settings job listed read-only."""
    from selenium.webdriver.common.by import By

    scenario, url = site
    operator = make_server(scenario.agent, 0, environ={}, operator=True)
    thread = threading.Thread(target=operator.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()

    def type_into(field: str, value: str) -> None:
        element = browser.find_element(By.ID, f"field-{field}")
        element.clear()
        element.send_keys(value)

    try:
        base = f"http://127.0.0.1:{operator.server_address[1]}"
        browser.get(base + "/")
        browser.find_element(By.LINK_TEXT, "Define jobs").click()
        assert browser.find_element(By.TAG_NAME, "h1").text == "Define a job"
        assert "defined in app settings (JOB__nightly_ok__*)" in text_of(browser)
        type_into("name", "browser_job")
        type_into("sql", "SELECT 'from the browser' AS said -- <b>not markup</b>")
        type_into("schedule", "0 30 2 * * *")
        type_into("timezone", "Europe/Paris")
        click_through(browser, "button.act-preview")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Define a job"
        rows = browser.find_elements(By.CSS_SELECTOR, "section.preview table.next tbody tr")
        assert len(rows) == 5 and all(" 02:30:00+01:00" in row.text or " 02:30:00+02:00" in row.text for row in rows)
        headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "section.preview table.next th")]
        assert headers[1:3] == ["UTC", "Europe/Paris"]
        assert browser.find_element(By.ID, "field-name").get_attribute("value") == "browser_job"   # kept
        shot(browser, "job-form-preview")
        click_through(browser, "button.act-define")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Edit job browser_job"
        assert "job 'browser_job' defined; it runs as" in text_of(browser)
        type_into("schedule", "0 0 4 * * *")
        click_through(browser, "button.act-define")
        assert "job 'browser_job' redefined" in text_of(browser)
        shot(browser, "job-form-saved")
        click_through(browser, "button.act-remove")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Confirm"
        assert "Remove job 'browser_job'?" in text_of(browser)
        click_through(browser, "button.act-remove")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Done"
        assert "job 'browser_job' removed" in text_of(browser)
    finally:
        operator.shutdown()
        operator.server_close()
    actions = [(r["action"], r["outcome"]) for r in monitor_audit(scenario) if r["job_name"] == "browser_job"]
    assert sorted(actions) == [("define", "done"), ("define", "done"), ("remove", "done")]


# ---------------------------------------------------------------- through the Azure adapter

READERS = "6f1c3a52-0d7e-4a8e-9b61-3c2f0e9a7d41"
OPERATORS = "0b7e2f44-8c1d-4f3a-a2e9-5d6c7b8a9f10"
STRIP_PREFIX = "x-ms-client-principal"


def principal_header(group: str, name: str) -> str:
    """X-MS-CLIENT-PRINCIPAL as App Service Authentication sets it: base64 JSON of the claims."""
    import base64

    claims = [{"typ": "groups", "val": group}, {"typ": "name", "val": name}]
    return base64.b64encode(json.dumps({"auth_typ": "aad", "claims": claims, "name_typ": "name"}).encode()).decode()


class AppServiceFront:
    """What stands in front of the function in Azure, on a loopback port: App Service
    Authentication (it strips any X-MS-CLIENT-PRINCIPAL* header a client sends and sets its own
    for the signed-in user, here ``signed_in``) and the Functions host (it makes each request a
    real azure.functions.HttpRequest for the HTTP trigger functions/monitor_trigger.py and sends
    its HttpResponse back). The browser speaks plain HTTP to it, so the front says so
    (X-Forwarded-Proto: http): the adapter then sees the origin the browser really uses."""

    def __init__(self, function) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qsl, urlsplit

        import azure.functions as func

        front = self
        self.signed_in: tuple[str, str] | None = None
        self.requests: list[tuple[str, str, int]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def relay(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if not (split.path == "/api/monitor" or split.path.startswith("/api/monitor/")):
                    self.send_error(404)
                    return
                headers = {k: v for k, v in self.headers.items() if not k.lower().startswith(STRIP_PREFIX)}
                headers["X-Forwarded-Proto"] = "http"
                if front.signed_in is not None:
                    group, name = front.signed_in
                    headers["X-MS-CLIENT-PRINCIPAL"] = principal_header(group, name)
                    headers["X-MS-CLIENT-PRINCIPAL-NAME"] = name
                    headers["X-MS-CLIENT-PRINCIPAL-IDP"] = "aad"
                request = func.HttpRequest(self.command, f"http://{self.headers['Host']}{self.path}", headers=headers,
                                           params=dict(parse_qsl(split.query)),
                                           route_params={"path": split.path[len("/api/monitor/"):]}, body=body)
                response = function(request)
                payload = response.get_body()
                front.requests.append((self.command, self.path, response.status_code))
                self.send_response(response.status_code)
                sent = {k.lower() for k in response.headers.keys()}
                for name, value in response.headers.items():
                    if name.lower() not in ("content-length", "connection"):
                        self.send_header(name, value)
                if "content-type" not in sent:
                    self.send_header("Content-Type", f"{response.mimetype}; charset={response.charset}")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_HEAD = do_POST = relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def posts(self) -> list[tuple[str, str, int]]:
        return [request for request in self.requests if request[0] == "POST"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def azure_site():
    """A scenario of its own, served by the HTTP trigger itself (the Functions app's settings in
    the environment: AGENT_DB and both groups) behind an AppServiceFront."""
    import os

    from shared.engine.agent import reset_default_agent

    name, url = create_pg_database()
    scenario = monitor_scenario.build(url)
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith(("JOB__", "AGENT_", "ALERT__"))]:
            patch.delenv(key)
        patch.setenv("AGENT_DB", url)
        patch.setenv("AGENT_MONITOR_ALLOWED_GROUP", READERS)
        patch.setenv("AGENT_MONITOR_OPERATOR_GROUP", OPERATORS)
        reset_default_agent()
        from functions import monitor_trigger

        front = AppServiceFront(monitor_trigger.agent_monitor.build().get_user_function())
        try:
            yield scenario, front
        finally:
            front.close()
            reset_default_agent()
            scenario.close()
            drop_pg_database(name)


def monitor_audit(scenario) -> list[dict]:
    store = scenario.agent.new_store()
    try:
        rows = store.execute("list_audit", job_name=None, since=None, limit=1000).rows
    finally:
        store.close()
    return [dict(row) for row in rows if row["source"] == "monitor"]


def test_azure_a_reader_sees_no_button_and_a_forged_post_is_403_audited(browser, azure_site):
    """Issue 32 item 8 through the Azure adapter: a reader signed in by App Service
    Authentication reads every page and sees no form; a POST forged in the reader's own page
    (same origin, so only the role stops it) gets 403 in words, does nothing, and is audited as
    refused with the reader's name; a form posted from another origin gets 403 and writes nothing."""
    from selenium.webdriver.common.by import By

    scenario, front = azure_site
    scenario.ticked()
    front.signed_in = (READERS, "ada@example.com")
    base = front.url + "/api/monitor"
    for path in ("/", "/jobs/nightly_ok", "/jobs/running_long", "/poison", "/stuck", "/audit", "/alerts"):
        browser.get(base + path)
        assert "Signed in as ada@example.com" in text_of(browser), path
        assert not browser.find_elements(By.TAG_NAME, "form"), path
        assert not browser.find_elements(By.TAG_NAME, "button"), path
        assert not browser.find_elements(By.CSS_SELECTOR, ".liveness"), path
    runs_before = len(cli_json(scenario.db, "history", "--job", "nightly_ok")["runs"])
    browser.get(base + "/jobs/nightly_ok")
    # The reader builds the operator's form by hand in the monitor's own page and submits it.
    browser.execute_script(
        "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
        "for (const [k, v] of [['job', 'nightly_ok'], ['token', 'forged']]) {"
        "  const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i); }"
        "const b = document.createElement('button'); b.type = 'submit'; b.id = 'forged'; b.textContent = 'Start';"
        "f.appendChild(b); document.body.appendChild(f);", "/api/monitor/actions/start")
    click_through(browser, "#forged")
    assert browser.current_url.endswith("/api/monitor/actions/start")
    assert browser.find_element(By.TAG_NAME, "h1").text == "403"
    assert "ada@example.com may read the monitor but not act" in text_of(browser)
    assert front.posts()[-1] == ("POST", "/api/monitor/actions/start", 403)
    (row,) = [r for r in monitor_audit(scenario) if r["principal"] == "ada@example.com"]
    # refused on the role, before the form is read: the row names the action, not the target
    assert (row["action"], row["outcome"], row["job_name"]) == ("run-now", "refused", None), row
    assert "ada@example.com is a reader, not an operator" in str(row), row
    assert row["client"] == f"monitor at {front.url[len('http://'):]}", row
    assert len(cli_json(scenario.db, "history", "--job", "nightly_ok")["runs"]) == runs_before
    # A page of another origin (another port of 127.0.0.1: the same site, so the cookie goes)
    # posts to the monitor: refused before anything is recorded.
    evil = AppServiceFront(lambda request: __import__("azure.functions").functions.HttpResponse(
        f'<form method="post" action="{base}/actions/start"><input type="hidden" name="job" value="nightly_ok">'
        '<button type="submit" id="go">win</button></form>', mimetype="text/html"))
    try:
        audited, posted = len(monitor_audit(scenario)), len(front.posts())
        browser.get(evil.url + "/api/monitor/")
        click_through(browser, "#go")
        assert browser.current_url.startswith(base)
        assert "cross-origin request refused" in text_of(browser)
        assert len(front.posts()) == posted + 1
        assert front.posts()[-1] == ("POST", "/api/monitor/actions/start", 403)
        assert len(monitor_audit(scenario)) == audited
    finally:
        evil.close()


def test_azure_an_operator_clicks_start_and_stop_and_both_are_audited(browser, azure_site):
    """Issue 32 item 8 through the Azure adapter: an operator signed in by App Service
    Authentication clicks Start (the result says which run), and Stop, which asks first; each is
    one audit row naming the Entra user and the host. The pages for the docs are taken here:
    what an operator sees in Azure (docs/images/monitor-*.png, copied from .scratch)."""
    from datetime import datetime, timedelta, timezone

    from selenium.webdriver.common.by import By

    scenario, front = azure_site
    scenario.ticked()
    front.signed_in = (OPERATORS, "grace@example.com")
    base = front.url + "/api/monitor"
    host = front.url[len("http://"):]
    browser.get(base + "/")
    assert "Signed in as grace@example.com" in text_of(browser)
    assert browser.find_elements(By.CSS_SELECTOR, "#job-nightly_ok button.act-start")
    assert browser.find_element(By.LINK_TEXT, "Alerts").get_attribute("href") == base + "/alerts"
    assert not browser.find_elements(By.CSS_SELECTOR, ".liveness")
    shot(browser, "azure-jobs")
    browser.get(base + "/jobs/nightly_ok")
    shot(browser, "azure-job")
    runs_before = {run["run_id"] for run in cli_json(scenario.db, "history", "--job", "nightly_ok")["runs"]}
    click_through(browser, "button.act-start")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Done"
    assert "job 'nightly_ok' started: run" in text_of(browser)
    (new_run,) = [run for run in cli_json(scenario.db, "history", "--job", "nightly_ok")["runs"]
                  if run["run_id"] not in runs_before]
    assert f"run {new_run['run_id']}" in text_of(browser)
    browser.get(base + "/jobs/running_long")
    click_through(browser, "button.act-stop")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Confirm"
    assert not [r for r in monitor_audit(scenario) if r["action"] == "stop"]   # asked, not done
    shot(browser, "azure-confirm")
    click_through(browser, "button.act-stop")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Done"
    assert "job 'running_long' stopped: run(s)" in text_of(browser)
    shot(browser, "azure-action-done")
    rows = [r for r in monitor_audit(scenario) if r["principal"] == "grace@example.com"]
    assert sorted((r["action"], r["outcome"], r["job_name"], r["client"]) for r in rows) == [
        ("run-now", "done", "nightly_ok", f"monitor at {host}"),
        ("stop", "done", "running_long", f"monitor at {host}")], rows
    browser.get(base + "/audit")
    cells = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
             for row in browser.find_elements(By.CSS_SELECTOR, "table.audit tbody tr")]
    assert cells[0][2] == "grace@example.com" and cells[0][5] == "stop" and cells[0][8] == "done", cells[0]
    shot(browser, "azure-audit")
    # The agent stops ticking: every page says so at its top.
    scenario.ticked(at=datetime.now(timezone.utc) - timedelta(hours=1))
    browser.get(base + "/stuck")
    banner = browser.find_element(By.CSS_SELECTOR, ".liveness.late")
    assert banner.text.startswith("Agent late:") and "has not ticked since" in banner.text
    assert banner.value_of_css_property("background-color") == "rgba(255, 235, 238, 1)"   # styled, not plain text
    shot(browser, "azure-stuck-late")
