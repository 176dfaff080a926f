"""The monitor's job form (issue 32 item 6) over HTTP, on the monitor scenario (SQLite and
PostgreSQL): an operator defines a job (agent.add_scheduled_job's body), previews its next five
slots in its time zone, edits it (the same call for the same name: redefined) and removes it after
a confirmation; each define, edit and remove is one audit row (source monitor, the principal), in
the action's own transaction. Bad fields come back naming the field, the value and what is
expected, with everything typed kept; the procedure's own refusals come back in its words. Jobs of
the app settings are listed read-only with where they are defined, and a POST that would change
one is refused with that reason. Readers get 403 (audited), other origins and forged tokens are
refused. On SQLite (no procedures) a save is refused in words; the preview works.

Each test acts as a browser: GET the form, take its hidden fields, POST them back with the
session cookie and the page's Origin."""

from __future__ import annotations

import html
import re
from urllib.parse import urlencode

import pytest

from shared.engine.audit import Actor, AuditSource
from shared.engine.operations import remove_job
from shared.errors import UsageError
from shared.web.actions import Actions, Caller
from shared.web.app import Monitor, MonitorSettings
from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import (OPERATORS, READERS, Client, audit_rows, azure,  # noqa: F401
                                                    form_fields, servers)


def define_fields(page: str) -> dict[str, str]:
    """The job form's hidden fields (its target and token)."""
    match = re.search(r'<form class="action action-define job-form"[^>]*>(.*?)</form>', page, re.S)
    assert match, "no job form on the page"
    return {html.unescape(n): html.unescape(v)
            for n, v in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', match.group(1))}


def typed(page: str, field: str) -> str:
    """What the form shows in a text field (or the command's textarea)."""
    if field == "sql":
        # A browser drops the one newline right after <textarea>, which the page writes so that a
        # command's own leading newline survives.
        match = re.search(r'<textarea name="sql"[^>]*>\n?(.*?)</textarea>', page, re.S)
    else:
        match = re.search(r'<input type="text" name="' + field + r'" [^>]*value="([^"]*)"', page)
    assert match, (field, page[:500])
    return html.unescape(match.group(1))


def job_row(scenario, name: str):  # noqa: F811
    store = scenario.agent.new_store()
    try:
        return store.execute("get_job_definition", job_name=name).one()
    finally:
        store.close()


NIGHTLY = {"sql": "SELECT 1", "schedule": "0 30 2 * * *", "timezone": "Europe/Paris", "enabled": "1",
           "max_attempts": "3", "timeout_seconds": "1800", "overlap": "skip", "misfire": "run-once",
           "grace_seconds": "86400", "catchup_seconds": "0", "lease_seconds": "60", "after_outcome": "succeeded",
           "target_parallelism": "8", "target_stagger_seconds": "0"}


def is_sqlite(scenario) -> bool:  # noqa: F811
    return scenario.db.startswith("sqlite")


def test_define_preview_save_edit_and_remove_each_audited_once(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    status, headers, page = client.get("/define")
    assert status == 200 and "<h1>Define a job</h1>" in page and 'http-equiv="refresh"' not in page
    assert "defined in app settings (JOB__nightly_ok__*)" in page       # settings jobs: read-only, where
    assert 'href="/define"' in client.get("/")[2]                        # the operator's nav links it
    before = len(audit_rows(scenario, "define"))

    # preview: five slots in Europe/Paris and UTC; nothing saved, nothing audited
    fields = {**define_fields(page), **NIGHTLY, "name": "web_job", "intent": "preview"}
    status, _, page = client.post("define", fields)
    assert status == 200, page
    table = re.search(r'<table class="next">(.*?)</table>', page, re.S).group(1)
    assert "<th>Europe/Paris</th>" in table and "<th>UTC</th>" in table
    rows = re.findall(r"<tr><td>(\d)</td><td>([^<]*)</td><td>([^<]*)</td>", table)
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"]
    assert all(" 02:30:00+0" in local for _, _, local in rows)
    assert all(utc.endswith(("01:30:00", "00:30:00")) for _, utc, _ in rows)
    assert typed(page, "name") == "web_job" and typed(page, "schedule") == "0 30 2 * * *"
    assert len(audit_rows(scenario, "define")) == before and job_row(scenario, "web_job") is None

    # save (the preview's page carries a fresh token)
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "web_job", "intent": "save"})
    defines = [r for r in audit_rows(scenario, "define") if r["job_name"] == "web_job"]
    if is_sqlite(scenario):
        assert status == 409 and "needs a PostgreSQL or SQL Server control database" in page, page
        assert typed(page, "name") == "web_job"                       # nothing typed is lost
        assert [(r["outcome"], r["source"]) for r in defines] == [("refused", "monitor")]
        assert job_row(scenario, "web_job") is None
        return
    assert status == 200 and "job &#x27;web_job&#x27; defined; it runs as" in page, page
    (row,) = defines
    assert row["outcome"] == "done" and row["source"] == "monitor" and row["principal"]
    assert row["client"].startswith(f"monitor on 127.0.0.1:{servers['operator']}")
    job = job_row(scenario, "web_job")
    assert job["defined_in_database"] == 1 and job["configured"] == 1 and job["timezone"] == "Europe/Paris"
    assert job["owner"] == row["principal"]                 # the signed-in principal, as the audit names it
    assert "<h1>Edit job web_job</h1>" in page               # the form now edits the job it saved
    job_page = client.get("/jobs/web_job")[2]               # its page says where it is defined, and links the form
    assert "<dt>Defined in</dt><dd>database</dd>" in job_page and 'href="/define?job=web_job"' in job_page

    # edit: the same procedure call for the same name (redefined), one row more
    page = client.get("/define?job=web_job")[2]
    assert typed(page, "schedule") == "0 30 2 * * *" and 'name="name" id="field-name" value="web_job" size="60" readonly' in page
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "web_job",
                                             "schedule": "0 0 4 * * *", "intent": "save"})
    assert status == 200 and "job &#x27;web_job&#x27; redefined" in page, page
    assert job_row(scenario, "web_job")["schedule"] == "0 0 4 * * *"
    # an edit form cannot rename (its token is for web_job; the name it carries must be web_job)
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "other_name", "intent": "save"})
    assert status == 409 and "a job is renamed by defining the new name" in page
    assert [r["outcome"] for r in audit_rows(scenario, "define") if r["job_name"] in ("web_job", "other_name")] \
        == ["refused", "done", "done"]

    # remove: asks first, then does it; one row
    page = client.get("/define")[2]
    status, _, page = client.post("remove", form_fields(page, "remove", "web_job"))
    assert status == 200 and "<h1>Confirm</h1>" in page and "Remove job &#x27;web_job&#x27;?" in page
    assert job_row(scenario, "web_job")["configured"] == 1
    status, _, page = client.post("remove", form_fields(page, "remove"))
    assert status == 200 and "job &#x27;web_job&#x27; removed" in page, page
    assert job_row(scenario, "web_job")["configured"] == 0
    (row,) = audit_rows(scenario, "remove")
    assert row["outcome"] == "done" and row["source"] == "monitor" and row["job_name"] == "web_job"


def test_bad_fields_name_the_field_the_value_and_what_is_expected_and_lose_nothing(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    before = len(audit_rows(scenario, "define"))
    bad = {**NIGHTLY, "name": "bad name!", "timezone": "Mars/Olympus", "max_attempts": "0", "overlap": "sometimes",
           "grace_seconds": "1e3", "sql": "SELECT 'kept' -- typed", "lease_seconds": "-5", "database": "a;b"}
    status, _, page = client.post("define", {**define_fields(page), **bad, "intent": "preview"})
    assert status == 400 and len(audit_rows(scenario, "define")) == before       # a preview records nothing
    for says in ("Name (@name) = &#x27;bad name!&#x27;: expected a job name of 1 to 64 letters",
                 "Time zone (@timezone) = &#x27;Mars/Olympus&#x27;: expected an IANA time zone name",
                 "Max attempts (@max_attempts) = &#x27;0&#x27;: expected a whole number from 1 to 100",
                 "Overlap (@overlap) = &#x27;sometimes&#x27;: expected skip, queue, allow, buffer-one or cancel-previous",
                 "Grace (s) (@grace_seconds) = &#x27;1e3&#x27;: expected a whole number from 0 to 31622400",
                 "Lease (s) (@lease_seconds) = &#x27;-5&#x27;: expected a whole number from 6 to 3600",
                 "Database (@database) = &#x27;a;b&#x27;"):
        assert says in page, (says, page[:3000])
    assert typed(page, "name") == "bad name!" and typed(page, "timezone") == "Mars/Olympus"
    assert typed(page, "sql") == "SELECT 'kept' -- typed" and '<option value="sometimes" selected>' in page
    # saved: the same errors, one 'refused' row, nothing defined
    status, _, page = client.post("define", {**define_fields(page), **bad, "intent": "save"})
    assert status == 400 and "The job was not saved; nothing was lost" in page
    (row,) = audit_rows(scenario, "define")[: len(audit_rows(scenario, "define")) - before]
    assert row["outcome"] == "refused" and "@timezone" in row["detail"] and row["source"] == "monitor"
    # a schedule that is not NCRONTAB, one that never fires, a one-time job in the past is fine, both at once is not
    cases = (({"schedule": "61 * * * * *"}, "Schedule (NCRONTAB, seconds first) (@schedule) = &#x27;61 * * * * *&#x27;"),
             ({"schedule": "0 0 0 30 2 *"}, "a schedule with a slot within"),
             ({"schedule": "0 0 2 * * *", "run_at": "2030-01-01 00:00"},
              "(@run_at) = &#x27;2030-01-01 00:00&#x27;: expected nothing when a schedule is given"),
             ({"schedule": "", "run_at": "tomorrow"}, "(@run_at) = &#x27;tomorrow&#x27;"),
             ({"name": "loop", "after": "LOOP"}, "a cycle of jobs that follow each other (loop -&gt; loop"),
             ({"catchup_seconds": "60"}, "(@catchup_seconds) = &#x27;60&#x27;: expected 0 with overlap skip"),
             ({"sql": "   "}, "Command (SQL) (@sql)"),
             # longer than a field of the other forms: back on this one, named, with the rest
             ({"targets": "db:" + "t" * 4998}, "Fleet targets (@targets) = &#x27;db:ttt"),
             ({"schedule": "0 " * 300}, "of at most 400 characters"))
    for fields, says in cases:
        status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "x", **fields,
                                                 "intent": "preview"})
        assert status == 400 and says in page, (fields, page[:3000])


def test_the_procedures_own_refusals_come_back_in_words(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "follower",
                                             "after": "no_such_job", "intent": "save"})
    assert status == 409, page
    if is_sqlite(scenario):     # no procedures: refused before them, in words
        assert "needs a PostgreSQL or SQL Server control database" in page
        return
    assert ("agent.add_scheduled_job: @after = &#x27;no_such_job&#x27;: expected the name of a job defined in the app "
            "settings or with agent.add_scheduled_job") in page
    assert typed(page, "after") == "no_such_job"
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "NIGHTLY_OK", "intent": "save"})
    assert status == 409 and "differs only by case from job &#x27;nightly_ok&#x27;" in page, page
    refused = [r for r in audit_rows(scenario, "define") if r["job_name"] in ("follower", "NIGHTLY_OK")]
    assert [r["outcome"] for r in refused] == ["refused", "refused"]
    assert job_row(scenario, "follower") is None


def test_a_settings_job_is_read_only_and_a_post_that_would_change_it_is_refused(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    status, _, page = client.get("/define?job=nightly_ok")
    assert status == 200 and "defined in app settings (JOB__nightly_ok__*)" in page
    assert "job-form" not in page and "action-remove" not in page.split("<h2>Jobs</h2>")[0]
    assert not re.search(r'action-remove"[^>]*>(?:(?!</form>).)*value="nightly_ok"', page, re.S)
    status, _, page = client.post("define", {**define_fields(client.get("/define")[2]), **NIGHTLY, "name": "nightly_ok",
                                             "intent": "save"})
    assert status == 409 and "is defined in app settings (JOB__nightly_ok__*): change it there" in page, page
    (row,) = [r for r in audit_rows(scenario, "define") if r["job_name"] == "nightly_ok"]
    assert row["outcome"] == "refused"
    # a remove POST for it (the pages never offer one: the token is made here, as a forger with the
    # session's key would): refused with the reason, one row
    actions = Actions(lambda: scenario.agent)
    monitor = Monitor(lambda: _lend(scenario), clock=scenario.agent.clock, settings=lambda: MonitorSettings(),
                      actions=actions)
    session = "s" * 43
    caller = Caller(name="op", operator=True, session=session, origin="http://x", own_origin="http://x")
    token = actions.form_token(caller, session, "remove", "nightly_ok")
    response = monitor.handle("POST", "/actions/remove", caller=caller,
                              body=f"job=nightly_ok&confirm=yes&token={token}".encode(),
                              content_type="application/x-www-form-urlencoded")
    assert response.status == 409 and b"is defined in app settings (JOB__nightly_ok__*): remove it there" in response.body
    (row,) = [r for r in audit_rows(scenario, "remove") if r["job_name"] == "nightly_ok"]
    assert row["outcome"] == "refused" and row["principal"] == "op"
    assert job_row(scenario, "nightly_ok")["configured"] == 1
    with pytest.raises(UsageError, match="no job|no such job|needs a PostgreSQL"):
        remove_job(scenario.agent.store(), "never_defined", now=scenario.agent.clock(),
                   actor=Actor(source=AuditSource.MONITOR, client="test", os_user="op", principal="op"))


class _lend:
    def __init__(self, scenario) -> None:  # noqa: F811
        self.scenario = scenario

    def __enter__(self):
        self.store = self.scenario.agent.new_store()
        return self.store

    def __exit__(self, *exc) -> None:
        self.store.close()


def test_readers_see_no_form_and_every_post_is_403_audited(scenario, azure):  # noqa: F811
    operator = azure(OPERATORS, "grace@example.com")
    page = operator.call("GET", "/define").get_body().decode()
    assert "job-form" in page and 'action="/api/monitor/actions/define"' in page
    reader = azure(READERS, "ada@example.com")
    response = reader.call("GET", "/define")
    assert response.status_code == 403 and b"the job form is for the operators" in response.get_body()
    assert b"Define jobs" not in reader.call("GET", "/").get_body()
    reader.cookie = operator.cookie
    fields = {**define_fields(page), **NIGHTLY, "name": "readers_job", "intent": "save"}
    for action in ("define", "remove"):
        response = reader.post(action, fields if action == "define" else {"job": "readers_job", "token": "x"})
        assert response.status_code == 403 and b"may read the monitor but not act" in response.get_body()
        (row,) = [r for r in audit_rows(scenario, action) if r["principal"] == "ada@example.com"]
        assert row["outcome"] == "refused" and row["source"] == "monitor"
    assert job_row(scenario, "readers_job") is None
    # the operator's own form, from another origin: 403, nothing recorded
    before = len(audit_rows(scenario))
    response = operator.post("define", fields, origin="https://evil.example")
    assert response.status_code == 403 and b"cross-origin request refused" in response.get_body()
    assert len(audit_rows(scenario)) == before
    # the form in Azure: the job's owner is the Entra name (PostgreSQL); on SQLite refused in words
    response = operator.post("define", {**fields, "name": "entra_job"})
    if is_sqlite(scenario):
        assert response.status_code == 409
    else:
        assert response.status_code == 200, response.get_body()[:2000]
        assert job_row(scenario, "entra_job")["owner"] == "grace@example.com"
        (row,) = [r for r in audit_rows(scenario, "define") if r["job_name"] == "entra_job"]
        assert row["principal"] == "grace@example.com" and row["client"].startswith("monitor at ")
    # no name from the platform (only a claim): the job would run as a name nobody vouched for, refused
    anonymous = azure(OPERATORS, "claim-only@example.com")
    page = anonymous.call("GET", "/define").get_body().decode()
    response = anonymous.call("POST", "/actions/define",
                              urlencode({**define_fields(page), **NIGHTLY, "name": "nameless_job", "intent": "save"}).encode(),
                              {"Origin": "https://sqlagent-app.azurewebsites.net",
                               "Content-Type": "application/x-www-form-urlencoded", "X-MS-CLIENT-PRINCIPAL-NAME": ""})
    body = response.get_body().decode()
    assert response.status_code == 409 and "passed no name for the signed-in principal" in body, body[:3000]
    assert job_row(scenario, "nameless_job") is None


def test_forged_tokens_replays_and_missing_origins_are_refused(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    fields = {**define_fields(page), **NIGHTLY, "name": "csrf_job", "intent": "preview"}
    before = len(audit_rows(scenario))
    for origin, says in (("http://evil.example", "cross-origin request refused"), (None, "needs an Origin header")):
        status, _, text = client.post("define", fields, origin=origin)
        assert status == 403 and says in text
    status, _, text = client.post("define", {**fields, "job": "nightly_ok"})      # the new-job token, another target
    assert status == 403 and "another session, user, action or target" in text
    other = Client(servers["operator"])
    other.get("/")
    status, _, text = other.post("define", fields)                               # another session
    assert status == 403
    status, _, previewed = client.post("define", fields)
    assert status == 200
    status, _, text = client.post("define", fields)                               # the same token again
    assert status == 409 and "submitted already" in text
    status, _, text = client.post("define", {**define_fields(previewed), "intent": "drop"})
    assert status == 400 and "expected preview or save" in text
    assert len(audit_rows(scenario)) == before


HOSTILE = "<script>alert(1)</script>\"'&amp;\u202e"


def test_hostile_values_are_escaped_everywhere(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    fields = {**define_fields(page), **NIGHTLY, "name": HOSTILE, "sql": f"SELECT '{HOSTILE}' -- </textarea><b>x</b>",
              "schedule": HOSTILE, "timezone": HOSTILE, "after": HOSTILE, "intent": "save"}
    status, _, page = client.post("define", fields)
    assert status == 400
    assert "<script>alert(1)" not in page and "</textarea><b>" not in page and "<b>x</b>" not in page
    assert typed(page, "sql") == fields["sql"] and typed(page, "name") == HOSTILE
    assert "\\u202e" in page         # the errors show the right-to-left override by its code point
    if is_sqlite(scenario):
        return
    # a job whose command holds markup and quotes: saved, and shown as text on every page
    fields = {**define_fields(page), **NIGHTLY, "name": "hostile_cmd", "sql": f"SELECT '{HOSTILE}'", "intent": "save"}
    status, _, page = client.post("define", fields)
    assert status == 200, page
    assert job_row(scenario, "hostile_cmd")["command"] == f"SELECT '{HOSTILE}'"
    for path in ("/define?job=hostile_cmd", "/define", "/jobs/hostile_cmd", "/audit"):
        text = client.get(path)[2]
        assert "<script>alert(1)" not in text, path
    assert typed(client.get("/define?job=hostile_cmd")[2], "sql") == f"SELECT '{HOSTILE}'"


def test_a_job_defined_from_the_monitor_runs_as_the_signed_in_name_or_fails_never_as_the_agent(pg_url):
    """The owner is the signed-in principal's name as the monitor records it (no mapping to a
    database principal is made): a run of the job runs as the database role of that name, and when
    there is none it fails saying so, never with the agent's rights."""
    from datetime import timedelta

    from shared.engine.operations import define_job, run_now
    from shared.jobs.definition import parse_definition
    from tests.support.harness import make_agent, work

    agent = make_agent(pg_url)
    definition, errors = parse_definition({**NIGHTLY, "name": "entra_owned", "sql": "SELECT 1", "max_attempts": "1"})
    assert not errors
    actor = Actor(source=AuditSource.MONITOR, client="monitor at test", os_user="grace@example.com",
                  principal="grace@example.com")
    defined = define_job(agent.store(), definition, owner="grace@example.com", now=agent.clock(), actor=actor)
    assert (defined.action, defined.owner) == ("defined", "grace@example.com")
    agent.tick(agent.clock() + timedelta(seconds=1))      # plans it (the procedure left needs_planning)
    started = run_now(agent, "entra_owned", actor=actor)
    work(agent, concurrency=1)
    store = agent.new_store()
    try:
        run = store.execute("get_run", run_id=started.run_id).one()
        audit = [r for r in store.execute("list_audit", job_name="entra_owned", since=None, limit=10).rows]
    finally:
        store.close()
    assert run["status"] == "failed", run
    assert "the job's owner 'grace@example.com' cannot run this job" in run["last_error"], run
    assert [(r["action"], r["principal"], r["source"]) for r in audit if r["action"] == "define"] == \
        [("define", "grace@example.com", "monitor")]


# One bad value per argument, and good ones near the bounds: whatever agent.add_scheduled_job's body
# refuses, the form refuses too, naming the same field (it may refuse more: what the engine would
# find invalid when it plans the job, such as a time zone that is no IANA zone). An @after naming no
# job is the database's to decide (test_the_procedures_own_refusals_come_back_in_words).
PARITY = [
    ("name", ""), ("name", "a" * 65), ("name", "x y"), ("name", "x'y"), ("name", "a" * 64),
    ("sql", ""), ("sql", "   "),
    ("schedule", "x" * 401), ("timezone", ""), ("timezone", "Europe/Paris;"), ("timezone", "Mars/Olympus"),
    ("max_attempts", "0"), ("max_attempts", "101"), ("max_attempts", "100"),
    ("timeout_seconds", "0"), ("timeout_seconds", "604801"), ("timeout_seconds", "604800"),
    ("overlap", "never"), ("overlap", "buffer-one"), ("misfire", "later"),
    ("grace_seconds", "31622401"), ("grace_seconds", "0"), ("lease_seconds", "5"), ("lease_seconds", "3601"),
    ("lease_seconds", "6"), ("database", "a b"), ("database", "d" * 129), ("database", "tenant_1"),
    ("targets", "x" * 4001), ("target_parallelism", "0"), ("target_parallelism", "1001"),
    ("target_stagger_seconds", "3601"), ("after", "x y"), ("after", ""), ("after_outcome", "maybe"),
    ("catchup_seconds", "-1"), ("catchup_seconds", "31622401"),
]


def test_the_form_refuses_whatever_the_procedure_refuses(pg_url):
    from shared.jobs.definition import FieldError, parse_definition
    from tests.support.harness import make_agent

    agent = make_agent(pg_url)
    store = agent.new_store()

    class Rollback(Exception):
        pass

    base = {**NIGHTLY, "name": "parity", "sql": "SELECT 1"}
    try:
        for field, value in PARITY:
            form = {**base, field: value}
            definition, errors = parse_definition(form)
            refused_here = {error.field for error in errors}
            arguments = definition.arguments() if definition else {
                "job_name": form["name"], "sql": form["sql"], "schedule": form["schedule"] or None, "run_at": None,
                "timezone": form["timezone"], "enabled": 1, "max_attempts": _int(form["max_attempts"]),
                "timeout_seconds": _int(form["timeout_seconds"]), "overlap": form["overlap"],
                "database": form.get("database") or None, "misfire": form["misfire"],
                "grace_seconds": _int(form["grace_seconds"]), "lease_seconds": _int(form["lease_seconds"]),
                "targets": form.get("targets") or None, "target_parallelism": _int(form["target_parallelism"]),
                "after": form.get("after") or None, "after_outcome": form["after_outcome"],
                "target_stagger_seconds": _int(form["target_stagger_seconds"]),
                "catchup_seconds": _int(form["catchup_seconds"])}
            refused_there = None
            try:
                with store.transaction():
                    store.execute("define_job", **arguments)
                    raise Rollback()
            except Rollback:
                pass
            except Exception as exc:
                refused_there = str(exc)
            if refused_there is not None:
                assert field in refused_here, (field, value, refused_there, errors)
                assert "agent.add_scheduled_job: @" in refused_there
            if not errors:
                assert refused_there is None, (field, value, refused_there)
            assert all(isinstance(error, FieldError) for error in errors)
    finally:
        store.close()


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def test_define_edit_and_remove_through_the_procedures_body_on_every_dialect_with_procedures(db_url):
    """What the form's save and remove call (operations.define_job / remove_job: the body of
    agent.add_scheduled_job and of agent.remove_scheduled_job, in the action's own transaction with
    its one audit row) on PostgreSQL, and on SQL Server or Babelfish when AGENT_TEST_MSSQL is set;
    SQLite has no procedures and refuses in words (as the page does)."""
    from shared.engine.operations import define_job
    from shared.jobs.definition import parse_definition
    from tests.support.harness import make_agent

    agent = make_agent(db_url)
    actor = Actor(source=AuditSource.MONITOR, client="monitor at test", os_user="grace", principal="grace")
    definition, errors = parse_definition({**NIGHTLY, "name": "formed", "sql": "SELECT N'it''s'"})
    assert not errors
    if agent.target.dialect == "sqlite":
        with pytest.raises(UsageError):
            define_job(agent.store(), definition, owner="grace", now=agent.clock(), actor=actor)
        return
    defined = define_job(agent.store(), definition, owner="grace", now=agent.clock(), actor=actor)
    assert (defined.action, defined.owner) == ("defined", "grace")
    row = job_row_of(agent, "formed")
    assert (row["schedule"], row["timezone"], row["owner"], row["defined_in_database"]) == \
        ("0 30 2 * * *", "Europe/Paris", "grace", 1)
    edited, errors = parse_definition({**NIGHTLY, "name": "formed", "sql": "SELECT 2", "schedule": "0 0 3 * * *"})
    assert not errors
    again = define_job(agent.store(), edited, owner="grace", now=agent.clock(), actor=actor, edit="formed")
    assert again.action == "redefined"
    assert (job_row_of(agent, "formed")["schedule"], job_row_of(agent, "formed")["command"]) == ("0 0 3 * * *", "SELECT 2")
    with pytest.raises(UsageError):       # a new job of a name already defined: refused, nothing changed
        define_job(agent.store(), definition, owner="grace", now=agent.clock(), actor=actor)
    removed = remove_job(agent.store(), "formed", now=agent.clock(), actor=actor)
    assert removed.job_name == "formed"
    assert job_row_of(agent, "formed") is None or not job_row_of(agent, "formed")["configured"]
    store = agent.new_store()
    try:
        audit = [(r["action"], r["outcome"]) for r in store.execute("list_audit", job_name="formed", since=None,
                                                                    limit=10).rows]
    finally:
        store.close()
    assert sorted(audit) == sorted([("define", "done"), ("define", "done"), ("define", "refused"), ("remove", "done")])


def job_row_of(agent, name: str):
    store = agent.new_store()
    try:
        return store.execute("get_job_definition", job_name=name).one()
    finally:
        store.close()


def test_a_save_that_raced_another_action_keeps_nothing(pg_url):
    """The form's look at the job runs before the procedure takes the job-definitions lock: a
    new job's save that finds the name taken by the time the procedure runs (it answers
    'redefined'), or an edit of a job removed meanwhile ('defined'), keeps nothing and says so;
    the job another operator saved, or the removal, stands. The race is made by hiding the job
    from that first look, as a concurrent action committing between the two would."""
    from shared.engine.operations import define_job
    from shared.errors import NotFoundError
    from shared.jobs.definition import parse_definition
    from tests.support.harness import make_agent

    agent = make_agent(pg_url)
    actor = Actor(source=AuditSource.MONITOR, client="monitor at test", os_user="alice", principal="alice")
    theirs, _ = parse_definition({**NIGHTLY, "name": "raced", "sql": "SELECT 'alice'"})
    define_job(agent.store(), theirs, owner="alice", now=agent.clock(), actor=actor)
    store = agent.new_store()
    original = store.execute

    def hidden(name, **params):
        result = original(name, **params)
        if name == "get_job_definition":
            result.rows.clear()
        return result

    store.execute = hidden
    mine, _ = parse_definition({**NIGHTLY, "name": "raced", "sql": "SELECT 'bob'"})
    try:
        with pytest.raises(UsageError, match="defined by someone else meanwhile"):
            define_job(store, mine, owner="bob", now=agent.clock(), actor=actor)
    finally:
        store.close()
    assert (job_row_of(agent, "raced")["command"], job_row_of(agent, "raced")["owner"]) == ("SELECT 'alice'", "alice")
    remove_job(agent.store(), "raced", now=agent.clock(), actor=actor)
    store = agent.new_store()
    original_after = store.execute

    def shown(name, **params):       # the edit's look still sees the job the removal took away
        result = original_after(name, **params)
        if name == "get_job_definition" and params.get("job_name") == "raced" and result.rows:
            result.rows[0] = {**result.rows[0], "configured": 1, "defined_in_database": 1}
        return result

    store.execute = shown
    try:
        with pytest.raises(NotFoundError, match="removed meanwhile"):
            define_job(store, mine, owner="bob", now=agent.clock(), actor=actor, edit="raced")
    finally:
        store.close()
    row = job_row_of(agent, "raced")
    assert row is None or not row["configured"]
