"""The operator's console, hardened (issue 32, from the attack): what a client sends cannot put
another address in the audit (F7); a one-time job's moment survives an edit of the monitor's
form unchanged, and a local time that is ambiguous or does not exist is refused in words (F3);
an operator's action whose connection is lost at its COMMIT leaves one honest audit row (F5)."""

from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import urlencode

import pytest

from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import (AZURE_HOST, OPERATORS, READERS, Client,  # noqa: F401
                                                    audit_rows, azure, form_fields, servers)
from tests.integration.test_monitor_jobform import NIGHTLY, define_fields, is_sqlite, job_row, typed


# ------------------------------------------------------------------ F7: X-Forwarded-For

@pytest.mark.parametrize("forwarded, expected", [
    # a client's own header first, the platform's entry appended last: the last one counts
    ("6.6.6.6, 203.0.113.7:51234", "203.0.113.7:51234"),
    ("6.6.6.6,10.1.2.3, 2001:db8::7", "2001:db8::7"),
    ("203.0.113.8", "203.0.113.8"),
    # an entry that is not an address (text forged into the audit) is left out, not recorded
    ("203.0.113.9, admin@evil (trusted)", None),
    ("", None),
])
def test_the_audit_records_the_last_hop_of_x_forwarded_for_not_the_clients_first_entry(
        scenario, azure, forwarded, expected):  # noqa: F811
    operator = azure(OPERATORS, "grace@example.com")
    fields = form_fields(operator.call("GET", "/jobs/nightly_ok").get_body().decode(), "start")
    reader = azure(READERS, f"xff-{len(forwarded)}-{abs(hash(forwarded)) % 10**8}@example.com")
    reader.cookie = operator.cookie
    headers = {"Origin": f"https://{AZURE_HOST}",
               "Content-Type": "application/x-www-form-urlencoded",
               # a forged scheme first, the platform's last: the session stays https (Secure)
               "X-Forwarded-Proto": "http, https"}
    if forwarded:
        headers["X-Forwarded-For"] = forwarded
    response = reader.call("POST", "/actions/start", urlencode(fields).encode(), headers)
    assert response.status_code == 403, response.get_body()
    (row,) = [r for r in audit_rows(scenario, "run-now") if r["principal"] == reader.name]
    assert row["client"] == f"monitor at {AZURE_HOST}" + (f" from {expected}" if expected else "")
    assert "6.6.6.6" not in row["client"] and "evil" not in row["client"]


# ------------------------------------------------------------------ F3: a one-time job across the clocks going back

def at(schedule: str) -> datetime:
    """The instant of a job row's '@once <UTC>'."""
    assert schedule.startswith("@once "), schedule
    return datetime.fromisoformat(schedule[len("@once "):])


ONCE = {**NIGHTLY, "schedule": "", "timezone": "Europe/London"}


def test_a_one_time_job_in_the_repeated_hour_survives_an_unchanged_save_of_the_form(scenario, servers):  # noqa: F811
    """2027-10-31 01:30 happens twice in Europe/London (BST +01:00, then GMT +00:00): the form
    shows the offset of the one the job holds, and saving it unchanged keeps that instant."""
    client = Client(servers["operator"])
    if is_sqlite(scenario):
        pytest.skip("the form defines jobs through the procedure: PostgreSQL or SQL Server")
    for name, typed_at, instant in (("once_second", "2027-10-31 01:30+00:00", "2027-10-31T01:30:00+00:00"),
                                    ("once_first", "2027-10-31 01:30:00+01:00", "2027-10-31T00:30:00+00:00"),
                                    ("once_utc", "2027-10-31T01:30Z", "2027-10-31T01:30:00+00:00")):
        page = client.get("/define")[2]
        status, _, page = client.post("define", {**define_fields(page), **ONCE, "name": name, "run_at": typed_at,
                                                 "intent": "save"})
        assert status == 200 and f"job &#x27;{name}&#x27; defined" in page, page[:3000]
        saved = job_row(scenario, name)["schedule"]
        assert at(saved) == datetime.fromisoformat(instant), saved
        # the edit form shows the offset of the pass the job holds...
        page = client.get(f"/define?job={name}")[2]
        shown = typed(page, "run_at")
        assert shown == ("2027-10-31 01:30:00+00:00" if instant.startswith("2027-10-31T01") else
                         "2027-10-31 01:30:00+01:00"), shown
        # ...and saving the form as shown (every field as the page has it) keeps the instant
        unchanged = {field: typed(page, field) for field in ("name", "schedule", "run_at", "timezone", "max_attempts",
                                                             "timeout_seconds", "grace_seconds", "catchup_seconds",
                                                             "lease_seconds", "target_parallelism",
                                                             "target_stagger_seconds")}
        status, _, page = client.post("define", {**define_fields(page), **ONCE, **unchanged, "sql": typed(page, "sql"),
                                                 "intent": "save"})
        assert status == 200 and f"job &#x27;{name}&#x27; redefined" in page, page[:3000]
        assert at(job_row(scenario, name)["schedule"]) == at(saved)
    # a time outside the changes keeps its plain look (no offset to misread when the date is edited)
    page = client.get("/define")[2]
    status, _, page = client.post("define", {**define_fields(page), **ONCE, "name": "once_summer",
                                             "run_at": "2027-07-01 01:30", "intent": "save"})
    assert status == 200, page[:3000]
    assert typed(client.get("/define?job=once_summer")[2], "run_at") == "2027-07-01 01:30:00"
    assert at(job_row(scenario, "once_summer")["schedule"]) == datetime(2027, 7, 1, 0, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize("run_at, says", [
    # typed without an offset in the repeated hour: both instants named, nothing saved
    ("2027-10-31 01:30", ["(@run_at) = &#x27;2027-10-31 01:30&#x27;",
                          "2027-10-31 01:30:00 happens twice in Europe/London",
                          "2027-10-31 01:30:00+01:00 (2027-10-31 00:30:00 UTC, the first time)",
                          "2027-10-31 01:30:00+00:00 (2027-10-31 01:30:00 UTC, the second)"]),
    # in the hour the clocks jump over: it never happens
    ("2027-03-28 01:30", ["(@run_at) = &#x27;2027-03-28 01:30&#x27;",
                          "2027-03-28 01:30:00 does not exist in Europe/London",
                          "e.g. 2027-03-28 02:30:00"]),
    # an offset the zone does not have then (a summer date with the winter offset kept)
    ("2027-07-01 01:30+00:00", ["(@run_at) = &#x27;2027-07-01 01:30+00:00&#x27;",
                                "+00:00 is not the offset of Europe/London at 2027-07-01 01:30:00"]),
])
def test_an_ambiguous_or_missing_local_time_is_refused_naming_field_value_and_instants(
        scenario, servers, run_at, says):  # noqa: F811
    client = Client(servers["operator"])
    name = f"once_bad_{abs(hash(run_at)) % 10**6}"
    before = [r for r in audit_rows(scenario, "define") if r["job_name"] == name]
    page = client.get("/define")[2]
    status, _, page = client.post("define", {**define_fields(page), **ONCE, "name": name, "run_at": run_at,
                                             "intent": "save"})
    assert status == 400 and "The job was not saved; nothing was lost" in page, page[:3000]
    for text in says:
        assert text in page, (text, page[:4000])
    assert typed(page, "run_at") == run_at                 # what was typed is kept
    assert job_row(scenario, name) is None
    rows = [r for r in audit_rows(scenario, "define") if r["job_name"] == name][len(before):]
    assert [r["outcome"] for r in rows] == ["refused"] and "@run_at" in rows[0]["detail"]


# ------------------------------------------------------------------ F4: host-dependent time zone names

@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory", "posix/Europe/Paris", "right/UTC"])
def test_the_form_refuses_a_host_time_zone_file_naming_field_value_and_an_example(scenario, servers, zone):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "tz_host", "timezone": zone,
                                             "intent": "preview"})
    assert status == 400, page[:3000]
    assert f"Time zone (@timezone) = &#x27;{zone}&#x27;: expected an IANA time zone name such as UTC or " \
           "Europe/Paris" in page, page[:3000]
