"""The monitor in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium; nothing is downloaded at test time) against the local server on PostgreSQL,
over jobs in every state (tests/support/monitor_scenario.py). The tests assert what a person sees: the
text, the number of bars, the colour of a failed run, a hostile error message shown as text with
no script run; and they compare each JSON twin, as the browser receives it, with the CLI's
`--json`. Screenshots go to .scratch/monitor-screenshots/ (docs/images/ holds copies).

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
    """The whole page, as tall as it is (Chromium's own capture beyond the viewport)."""
    import base64

    width, height = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    capture = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 4000), "scale": 1}})
    (SCREENSHOTS / f"{name}.png").write_bytes(base64.b64decode(capture["data"]))


def text_of(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


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
        browser.find_element(By.CSS_SELECTOR, "button.act-start").click()
        assert browser.find_element(By.TAG_NAME, "h1").text == "Done"
        assert "job 'nightly_ok' started: run" in text_of(browser)
        browser.get(base + "/jobs/running_long")
        browser.find_element(By.CSS_SELECTOR, "button.act-stop").click()
        assert browser.find_element(By.TAG_NAME, "h1").text == "Confirm"
        browser.find_element(By.CSS_SELECTOR, "button.act-stop").click()
        assert "job 'running_long' stopped: run(s)" in text_of(browser)
        shot(browser, "action-done")
    finally:
        operator.shutdown()
        operator.server_close()
    browser.get(url + "/jobs/nightly_ok")
    assert not browser.find_elements(By.TAG_NAME, "form")
