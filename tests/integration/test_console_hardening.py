"""The operator's console, hardened (issue 32, from the attack): what a client sends cannot put
another address in the audit (F7); a one-time job's moment survives an edit of the monitor's
form unchanged, and a local time that is ambiguous or does not exist is refused in words (F3);
an operator's action whose connection is lost at its COMMIT leaves one honest audit row (F5)."""

from __future__ import annotations

import contextlib
import select
import threading
from datetime import datetime, timezone
from urllib.parse import urlencode

import pyodbc
import pytest

from shared.engine import views
from shared.engine.audit import Audit, AuditAction, audited
from shared.engine.operations import pause_job
from shared.jobs.schedules import parse_schedule
from tests.support.faults import OutageProxy
from tests.support.harness import admin_execute, make_agent

from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import (AZURE_HOST, OPERATORS, READERS, Client,  # noqa: F401
                                                    audit_rows, azure, form_fields, servers)
from tests.integration.test_sqlagent_import import assert_engine_accepts, one, schedule, ssms, step
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
        # No procedures on SQLite: the save is refused in words and the time typed is kept.
        page = client.get("/define")[2]
        status, _, page = client.post("define", {**define_fields(page), **ONCE, "name": "once_sqlite",
                                                 "run_at": "2027-10-31 01:30+00:00", "intent": "save"})
        assert status == 409 and "needs a PostgreSQL or SQL Server control database" in page, page[:3000]
        assert typed(page, "run_at") == "2027-10-31 01:30+00:00" and job_row(scenario, "once_sqlite") is None
        return
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


# ------------------------------------------------------------------ F5: the connection lost at an action's COMMIT

class CommitCutProxy(OutageProxy):
    """The outage proxy in front of PostgreSQL that, once armed, lets the next COMMIT through to
    the server, waits for the server's answer (the transaction has committed by then) and cuts
    the connection instead of passing the answer on: the client sees its connection lost at the
    COMMIT of a transaction that committed. ``then_outage``: and refuses connections from then on."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.then_outage = False
        super().__init__()

    def _pump(self, client, upstream) -> None:  # type: ignore[override]
        sockets, committing = [client, upstream], False
        try:
            for _ in range(100000):                 # bounded: a test's connection says far less
                readable, _, _ = select.select(sockets, [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is upstream and committing:
                        self.cut.set()              # the server answered the COMMIT: never passed on
                        if self.then_outage:
                            self.outage()
                        return
                    if sock is client and self.armed.is_set() and b"COMMIT" in data:
                        self.armed.clear()
                        committing = True
                    (upstream if sock is client else client).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.close()


def pause_rows(agent, job: str) -> list[dict]:
    rows = agent.new_store().execute("list_audit", job_name=job, since=None, limit=100).rows
    return [row for row in rows if row["action"] == "pause"]


def paused(agent, job: str) -> bool:
    (row,) = [r for r in views.jobs_view(agent.new_store(), agent.clock()) if r["job_name"] == job]
    return bool(row["paused"])


JOB = {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}


def test_a_commit_that_happened_but_whose_answer_was_lost_is_one_row_done(pg_url, caplog):
    make_agent(pg_url, {"cut": JOB}).close()
    proxy = CommitCutProxy()
    database = pg_url.split("Database=")[1].rstrip(";")
    try:
        agent = make_agent(proxy.connection_string(database), {"cut": JOB}, AGENT_CONNECT_RETRY_SECONDS="2")
        agent.tick(agent.clock())
        proxy.armed.set()
        pause = pause_job(agent.store(), "cut", now=agent.clock(), reason="at the commit")
        assert proxy.cut.is_set(), "the COMMIT's answer was not cut"
        assert pause.job_name == "cut"                       # it committed: the operator is told it is done
        rows = pause_rows(agent, "cut")
        assert [(r["outcome"], r["detail"]) for r in rows] == [("done", "0 claimed slot(s) skipped")], rows
        assert paused(agent, "cut")
        assert "checked afterwards: it committed" in caplog.text
        agent.close()
    finally:
        proxy.close()


def test_a_commit_that_did_not_happen_when_the_connection_died_is_one_row_refused_saying_so(pg_url):
    """The server process is terminated at the COMMIT (a deferred trigger calls
    pg_terminate_backend on its own backend while the COMMIT runs it): the transaction never
    committed; the client sees the connection lost at the COMMIT."""
    agent = make_agent(pg_url, {"doomed": JOB, "fine": JOB})
    agent.tick(agent.clock())
    admin_execute(pg_url, """
        CREATE FUNCTION public.die_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.job_name = 'doomed' AND NEW.outcome = 'done' THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER die_at_commit AFTER INSERT ON agent.audit DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW EXECUTE FUNCTION public.die_at_commit();""")
    with pytest.raises(pyodbc.Error) as raised:
        pause_job(agent.store(), "doomed", now=agent.clock(), reason="dies at the commit")
    assert "terminat" in str(raised.value).lower() or "connection" in str(raised.value).lower(), raised.value
    (row,) = pause_rows(agent, "doomed")
    assert row["outcome"] == "refused", row
    assert "the connection was lost at its commit" in row["detail"] and "it did not commit" in row["detail"]
    assert not paused(agent, "doomed")
    # the next action on the same agent is as usual
    pause_job(agent.store(), "fine", now=agent.clock())
    assert [r["outcome"] for r in pause_rows(agent, "fine")] == ["done"] and paused(agent, "fine")


def test_a_commit_refused_by_the_server_is_one_row_refused_with_its_error(pg_url):
    """A COMMIT the server refuses (a deferred check fails while it commits) rolled back for
    certain: one row 'refused' with the server's error, nothing asked afterwards."""
    agent = make_agent(pg_url, {"checked": JOB})
    agent.tick(agent.clock())
    admin_execute(pg_url, """
        CREATE FUNCTION public.refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.job_name = 'checked' AND NEW.outcome = 'done' THEN
                RAISE EXCEPTION 'deferred check: no pause today';
            END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON agent.audit DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW EXECUTE FUNCTION public.refuse_at_commit();""")
    with pytest.raises(pyodbc.Error, match="no pause today"):
        pause_job(agent.store(), "checked", now=agent.clock())
    (row,) = pause_rows(agent, "checked")
    assert row["outcome"] == "refused" and "no pause today" in row["detail"]
    assert "connection was lost" not in row["detail"] and not paused(agent, "checked")


def test_when_nobody_can_tell_whether_it_committed_no_contradicting_row_is_written(pg_url, caplog):
    make_agent(pg_url, {"dark": JOB}).close()
    proxy = CommitCutProxy()
    proxy.then_outage = True
    database = pg_url.split("Database=")[1].rstrip(";")
    try:
        agent = make_agent(proxy.connection_string(database), {"dark": JOB}, AGENT_CONNECT_RETRY_SECONDS="1")
        agent.tick(agent.clock())
        proxy.armed.set()
        with pytest.raises(pyodbc.Error):
            pause_job(agent.store(), "dark", now=agent.clock())
        assert proxy.cut.is_set()
        assert "whether it committed could not be checked" in caplog.text and "outcome unknown" in caplog.text
        proxy.restore()
        # the action did commit (the proxy passed the COMMIT on): its one row is 'done', no 'refused'
        rows = pause_rows(make_agent(pg_url), "dark")
        assert [r["outcome"] for r in rows] == ["done"], rows
        agent.close()
    finally:
        proxy.close()


def test_an_action_done_on_another_connection_is_never_recorded_refused_when_its_row_fails(db_url, monkeypatch):
    """Audit.done: the action committed on its own (a procedure call on another connection); its
    row 'done' cannot be written (the connection lost): no row 'refused' contradicts what was done."""
    agent = make_agent(db_url)
    store = agent.store()

    def lost(self) -> None:
        raise ConnectionError("the connection was lost writing the row")

    monkeypatch.setattr(Audit, "write", lost)
    with pytest.raises(ConnectionError):
        with audited(store, None, AuditAction.GRANT, now=agent.clock(), arguments={"login": "x"}) as audit:
            audit.done()
    monkeypatch.undo()
    rows = store.execute("list_audit", job_name=None, since=None, limit=100).rows
    assert [r for r in rows if r["action"] == "grant"] == []
    # without the failure: its one row 'done'
    with audited(store, None, AuditAction.GRANT, now=agent.clock(), arguments={"login": "x"}) as audit:
        audit.done()
    rows = store.execute("list_audit", job_name=None, since=None, limit=100).rows
    assert [r["outcome"] for r in rows if r["action"] == "grant"] == ["done"]


# ------------------------------------------------------------------ F3: a one-time SQL Agent schedule at a change

@pytest.mark.parametrize("start_time, carried, instant", [
    # 01:30 on 2027-10-31 happens twice in London: the first, as SQL Agent on a London server runs it
    (13000, "@once 2027-10-31T01:30:00+01:00", datetime(2027, 10, 31, 0, 30, tzinfo=timezone.utc)),
    (23000, "@once 2027-10-31T02:30:00", datetime(2027, 10, 31, 2, 30, tzinfo=timezone.utc)),
])
def test_import_sqlagent_pins_a_one_time_schedule_at_a_clock_change_to_one_instant(start_time, carried, instant):
    converted = one(ssms("j", step(1, "SELECT 1"), schedule("once", freq_type=1, start_date=20271031,
                                                            start_time=start_time)), "Europe/London")
    settings = converted[0].settings
    assert settings["JOB__j__SCHEDULE"] == carried
    assert_engine_accepts(settings)
    assert parse_schedule(carried, "Europe/London").at == instant
    pinned = [note for note in converted[0].notes if "happens twice or never in Europe/London" in note]
    assert len(pinned) == (1 if "+" in carried else 0), converted[0].notes
