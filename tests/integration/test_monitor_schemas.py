"""The published JSON Schemas of the monitor's JSON twins (docs/schemas/monitor-*.schema.json),
checked against the live responses.

The monitor answers the jobs in every state of tests/support/monitor_scenario.py (built by the engine on
SQLite and on PostgreSQL) plus a two-step job that ran: every page's JSON twin (the jobs, each
job's page in both windows, each run, poison, stuck) and the JSON errors (404, 400) validate
against their schema. The schemas forbid keys they do not describe, so a field added to a page
fails here until the schema (and its description) has it. Every page the monitor routes has a
schema, every schema is a valid 2020-12 schema, and a response missing a field or carrying a
wrong type is refused (the check can fail).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from datetime import datetime, timedelta, timezone

import pytest
from jsonschema import Draft202012Validator

from shared.engine.operations import pause_job
from shared.web.app import Monitor, MonitorSettings
from tests.support import monitor_scenario
from tests.support.harness import ROOT, Clock, create_pg_database, drop_pg_database, make_agent, work

UTC = timezone.utc
SCHEMAS = ROOT / "docs" / "schemas"
PAGES = ("jobs", "job", "run", "poison", "stuck", "audit", "alerts", "error")


def schema(page: str) -> dict:
    return json.loads((SCHEMAS / f"monitor-{page}.schema.json").read_text(encoding="utf-8"))


def validate(page: str, document) -> None:
    errors = sorted(Draft202012Validator(schema(page)).iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"monitor-{page}: at {list(e.absolute_path)}: {e.message[:300]}" for e in errors[:10])


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def monitor(request, tmp_path_factory):
    """The scenario's control database, plus a two-step job that ran, and a monitor over it."""
    if request.param == "sqlite":
        name, url = None, f"sqlite:///{tmp_path_factory.mktemp('schemas') / 'agent.db'}"
    else:
        name, url = create_pg_database()
    # First the two-step job's run (the scenario's tick then finds the job gone from the settings:
    # state removed, one more state covered), then the scenario.
    clock = Clock(datetime.now(UTC).replace(microsecond=0))
    stepper = make_agent(url, {"two_steps": {"SCHEDULE": "0 0 10 * * *", "STEPS__1__COMMAND": "SELECT 1",
                                             "STEPS__2__COMMAND": "SELECT 2"}}, clock=clock)
    stepper.tick()
    step_run = stepper.store().execute("insert_manual_run", job_name="two_steps", now=clock(),
                                       operation_id="op", params=None).one()["run_id"]
    work(stepper, concurrency=1)
    stepper.close()
    built = monitor_scenario.build(url)
    # One job paused (state paused, its pause's fields filled).
    pause_job(built.agent.store(), "waiting_job", now=datetime.now(UTC), until=datetime.now(UTC) + timedelta(days=1),
              paused_by="schemas", reason="schema check")
    try:
        store = built.agent.new_store()
        yield Monitor(lambda: contextlib.nullcontext(store), clock=lambda: datetime.now(UTC),
                      settings=lambda: MonitorSettings()), built, step_run
    finally:
        built.close()
        if name:
            drop_pg_database(name)


def get(monitor: Monitor, path: str, query: str = "format=json", status: int = 200):
    response = monitor.handle("GET", path, query, "")
    assert response.status == status, (path, response.status, response.body[:300])
    assert response.content_type.startswith("application/json"), response.content_type
    return json.loads(response.body)


def test_every_schema_is_a_valid_2020_12_schema_and_every_page_has_one():
    published = sorted(path.name for path in SCHEMAS.glob("monitor-*.schema.json"))
    assert published == sorted(f"monitor-{page}.schema.json" for page in PAGES)
    for page in PAGES:
        document = schema(page)
        Draft202012Validator.check_schema(document)
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert document["$id"].endswith(f"monitor-{page}.schema.json") and document["description"]
    # The pages the monitor routes (its 404 names them): each has its schema.
    source = (ROOT / "shared" / "web" / "app.py").read_text(encoding="utf-8")
    (routed,) = re.findall(r"\(pages: ([^)]*)\)", source)
    names = {"jobs": "jobs", "jobs/<name>": "job", "runs/<id>": "run", "poison": "poison", "stuck": "stuck",
             "audit": "audit", "alerts": "alerts"}
    assert {names[page.strip()] for page in routed.split(",")} == set(PAGES) - {"error"}
    # The monitor's page documents them.
    assert all(f"schemas/monitor-{page}.schema.json" in (ROOT / "docs" / "monitor.md").read_text(encoding="utf-8")
               for page in PAGES)


def test_every_json_twin_validates_against_its_schema(monitor):
    monitor, built, step_run = monitor
    jobs = get(monitor, "/jobs")
    validate("jobs", jobs)
    validate("jobs", get(monitor, "/"))
    assert {job["state"] for job in jobs} >= {"enabled", "disabled", "invalid", "paused"}
    for job in jobs:
        for window in ("24h", "7d"):
            validate("job", get(monitor, f"/jobs/{job['job_name']}", f"format=json&window={window}"))
    run_ids = [run_id for ids in built.run_ids.values() for run_id in ids] + [step_run]
    assert len(run_ids) >= 12
    for run_id in run_ids:
        validate("run", get(monitor, f"/runs/{run_id}"))
    steps = get(monitor, f"/runs/{step_run}")
    assert [attempt["step"] for attempt in steps["attempts"]] == [1, 2]
    poison = get(monitor, "/poison")
    assert any(p["run_id"] is None for p in poison) and any(p["run_id"] for p in poison)
    validate("poison", poison)
    stuck = get(monitor, "/stuck", "format=json&older_than=60")
    assert stuck, "the scenario has a stuck run"
    validate("stuck", stuck)
    audit = get(monitor, "/audit")
    assert any(row["action"] == "pause" and row["outcome"] == "done" for row in audit), audit
    validate("audit", audit)
    validate("alerts", get(monitor, "/alerts"))


def test_json_errors_validate_against_the_error_schema(monitor):
    monitor, _, _ = monitor
    for path, query, status in (("/runs/999999", "format=json", 404), ("/jobs/ghost", "format=json", 404),
                                ("/nowhere", "format=json", 404), ("/jobs/nightly_ok", "format=json&window=1y", 400),
                                ("/stuck", "format=json&limit=zero", 400)):
        validate("error", get(monitor, path, query, status))


def test_the_schemas_refuse_a_missing_field_a_wrong_type_and_an_unknown_key(monitor):
    monitor, built, _ = monitor
    jobs = get(monitor, "/jobs")
    run = get(monitor, f"/runs/{built.run_ids['nightly_ok'][0]}")
    broken = []
    missing = copy.deepcopy(jobs)
    del missing[0]["status"]
    broken.append(("jobs", missing))
    wrong = copy.deepcopy(run)
    wrong["run"]["run_id"] = "one"
    broken.append(("run", wrong))
    extra = copy.deepcopy(run)
    extra["attempts"][0]["surprise"] = 1
    broken.append(("run", extra))
    state = copy.deepcopy(jobs)
    state[0]["state"] = "sleeping"
    broken.append(("jobs", state))
    for page, document in broken:
        with pytest.raises(AssertionError):
            validate(page, document)
