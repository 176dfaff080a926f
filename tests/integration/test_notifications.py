"""Notifications (issue 15) on SQLite and PostgreSQL, received by a loopback HTTP server:
exactly once per run outcome (not per attempt, not per instance) with the right body, per the
job's NOTIFY; a webhook that hangs or answers 500 never delays the next run, and its failed
attempts are recorded and bounded; the webhook URL is validated."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shared.engine.notify import DELIVERY_TIMEOUT_SECONDS, MAX_DELIVERY_ATTEMPTS, Notifier
from shared.errors import ConfigError
from shared.settings import load_settings
from tests.support.harness import Clock, query, sql_for, work

UTC = timezone.utc


class Receiver:
    """A webhook on 127.0.0.1: /ok answers 204, /fail 500, /hang answers after 8 s."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        self.arrived: list[tuple[str, float]] = []        # (path, time.monotonic() at arrival)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver._lock:
                    receiver.received.append((self.path, body))
                    receiver.arrived.append((self.path, time.monotonic()))
                if self.path == "/hang":
                    time.sleep(8)
                self.send_response(500 if self.path == "/fail" else 204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str = "/ok") -> list[dict]:
        with self._lock:
            return [body for where, body in self.received if where == path]

    def wait_for(self, count: int, path: str = "/ok", timeout: float = 20) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.bodies(path)) < count:
            time.sleep(0.05)
        return self.bodies(path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def once(**settings: str) -> dict[str, str]:
    return {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), **settings}


def notifications_table(agent) -> str:
    return "agent_notifications" if agent.target.dialect == "sqlite" else "agent.notifications"


class Silent:
    """Stands in for a process's notifier that has not delivered yet."""

    def wake(self) -> None:
        pass

    def stop(self, flush_seconds: float = 0.0) -> None:
        pass


def test_each_run_outcome_is_notified_once_with_the_right_body(agent_factory, db_url, receiver):
    jobs = {
        "broken": once(COMMAND="SELECT * FROM no_such_table", MAX_ATTEMPTS="2"),      # on_failure (default)
        "fine": once(COMMAND="SELECT 1", NOTIFY="on_success"),
        "quiet": once(COMMAND="SELECT 1"),                                             # succeeds: not notified
        "muted": once(COMMAND="SELECT * FROM no_such_table", MAX_ATTEMPTS="1", NOTIFY="never"),
        "nightly": once(STEPS__1__COMMAND="SELECT 1", STEPS__2__COMMAND="SELECT * FROM no_such_table",
                        STEPS__2__MAX_ATTEMPTS="1", NOTIFY="on_completion"),
    }
    agent = agent_factory(jobs, AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok", AGENT_RETRY_BACKOFF_SECONDS="0")
    agent.tick(datetime.now(UTC))
    work(agent, concurrency=2)
    bodies = receiver.wait_for(3)
    time.sleep(0.5)   # nothing more arrives
    bodies = receiver.bodies()
    by_job = {body["job"]: body for body in bodies}
    assert sorted(body["job"] for body in bodies) == ["broken", "fine", "nightly"], bodies
    runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=20).rows}
    broken = by_job["broken"]
    assert broken["run_id"] == runs["broken"]["run_id"] and broken["outcome"] == "failed"
    assert "no_such_table" in broken["error"] and broken["failing_step"] is None
    assert broken["operation_id"] == runs["broken"]["operation_id"]
    assert broken["slot"].startswith(runs["broken"]["scheduled_for"].strftime("%Y-%m-%dT%H:%M:%S"))
    assert isinstance(broken["duration_seconds"], float) and broken["duration_seconds"] >= 0
    assert runs["broken"]["attempt"] == 2          # two attempts, one notification
    assert by_job["fine"]["outcome"] == "succeeded" and by_job["fine"]["error"] is None
    assert by_job["nightly"]["outcome"] == "failed" and by_job["nightly"]["failing_step"] == 2
    rows = query(agent, f"SELECT status, attempts, last_error FROM {notifications_table(agent)}")
    assert sorted(rows) == [("sent", 1, None)] * 3


def test_two_instances_delivering_at_once_send_each_notification_once(agent_factory, db_url, receiver):
    jobs = {f"j{i}": once(COMMAND="SELECT * FROM no_such_table", MAX_ATTEMPTS="1") for i in range(12)}
    agent = agent_factory(jobs, AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok")
    agent._notifier = Silent()
    agent.executor().notifier = Silent()
    agent.tick(datetime.now(UTC))
    work(agent, concurrency=4)
    assert receiver.bodies() == []
    (pending,) = query(agent, f"SELECT COUNT(*) FROM {notifications_table(agent)} WHERE status = 'pending'")
    assert pending == (12,)
    instances = [Notifier(agent.new_store, agent.clock) for _ in range(2)]
    start = threading.Barrier(2)

    def drain(notifier):
        start.wait()
        while notifier.deliver_due():
            pass

    threads = [threading.Thread(target=drain, args=(n,)) for n in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    receiver.wait_for(12)
    time.sleep(0.3)
    assert sorted(b["job"] for b in receiver.bodies()) == sorted(jobs)
    for notifier in instances:
        notifier._close_store()


def test_a_hanging_or_failing_webhook_never_delays_the_next_run(agent_factory, db_url, receiver):
    clock = Clock(datetime.now(UTC))
    slot = "@once " + clock.now.isoformat()
    jobs = {
        "a_hangs": {"SCHEDULE": slot, "COMMAND": "SELECT * FROM no_such_table", "MAX_ATTEMPTS": "1",
                    "NOTIFY_WEBHOOK_URL": receiver.url + "/hang"},
        "b_fails": {"SCHEDULE": slot, "COMMAND": "SELECT * FROM no_such_table", "MAX_ATTEMPTS": "1",
                    "NOTIFY_WEBHOOK_URL": receiver.url + "/fail"},
        "c_next": {"SCHEDULE": slot, "COMMAND": sql_for(db_url, "SELECT 1", "SELECT 1", "SELECT 1")},
    }
    agent = agent_factory(jobs, clock=clock, AGENT_MAX_CONCURRENCY="1")
    agent.tick()
    work(agent, concurrency=1)
    done = time.monotonic()
    # Three runs one after the other, while a webhook hangs for 8 s: no run waited for it. A run
    # that waited for the delivery would end no sooner than the deliverer's timeout after the
    # hanging request arrived; the runs all ended before that (measured from the request, not
    # from the start of work: a run's own time is the engine's, 2-3 s on a cold Babelfish
    # connection, and says nothing about waiting).
    assert receiver.wait_for(1, "/hang")                   # delivered by the notifier, maybe after the runs
    with receiver._lock:
        (hang_arrived,) = [at for where, at in receiver.arrived if where == "/hang"]
    assert done < hang_arrived + DELIVERY_TIMEOUT_SECONDS, done - hang_arrived
    runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=20).rows}
    assert [runs[j]["status"] for j in ("a_hangs", "b_fails", "c_next")] == ["failed", "failed", "succeeded"]
    table = notifications_table(agent)

    def state(job):
        return query(agent, f"SELECT status, attempts, last_error FROM {table} WHERE job_name = '{job}'")[0]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (state("a_hangs")[2] is None or state("b_fails")[2] is None):
        time.sleep(0.1)
    assert state("b_fails")[:2] == ("pending", 1) and "HTTP 500" in state("b_fails")[2]
    assert state("a_hangs")[:2] == ("pending", 1) and "answer within 5 s" in state("a_hangs")[2]
    # Bounded retries: the 500 is tried MAX_DELIVERY_ATTEMPTS times in all, then failed for good;
    # the runs' outcomes never change.
    # Each step waits for the attempt to be recorded (claimed, then back from 'sending'), not only
    # received: the deliverer reads the clock after its POST, and a clock moved on in between
    # would put the next retry later still.
    for attempt, delay in ((2, 10), (3, 60)):
        clock.advance(delay)
        agent.notifier.wake()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (state("b_fails")[1] < attempt or state("b_fails")[0] == "sending"):
            time.sleep(0.1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and state("b_fails")[0] != "failed":
        time.sleep(0.1)
    assert state("b_fails")[:2] == ("failed", MAX_DELIVERY_ATTEMPTS)
    assert len(receiver.bodies("/fail")) == MAX_DELIVERY_ATTEMPTS
    runs = {r["job_name"]: r for r in agent.store().execute("list_history", job_name=None, limit=20).rows}
    assert runs["b_fails"]["status"] == "failed" and runs["c_next"]["status"] == "succeeded"


def test_webhook_urls_are_validated():
    with pytest.raises(ConfigError, match="AGENT_NOTIFY_WEBHOOK_URL='http://example.com/hook'"):
        load_settings(environ={"AGENT_NOTIFY_WEBHOOK_URL": "http://example.com/hook"})
    for url in ("https://example.com/hook", "http://127.0.0.1:8080/x", "http://localhost/x", "http://[::1]:9/x"):
        assert load_settings(environ={"AGENT_NOTIFY_WEBHOOK_URL": url}).agent.notify_webhook_url == url
    settings = load_settings(environ={
        "JOB__a__SCHEDULE": "0 0 3 * * *", "JOB__a__COMMAND": "SELECT 1", "JOB__a__NOTIFY": "sometimes",
        "JOB__b__SCHEDULE": "0 0 3 * * *", "JOB__b__COMMAND": "SELECT 1", "JOB__b__NOTIFY_WEBHOOK_URL": "ftp://x/y",
        "JOB__c__SCHEDULE": "0 0 3 * * *", "JOB__c__COMMAND": "SELECT 1", "JOB__c__NOTIFY": "ON_COMPLETION"})
    errors = {bad.name: bad.message for bad in settings.invalid_jobs}
    assert "JOB__a__NOTIFY='sometimes'" in errors["a"] and "on_failure or on_success" in errors["a"]
    assert "JOB__b__NOTIFY_WEBHOOK_URL='ftp://x/y'" in errors["b"] and "https://" in errors["b"]
    assert settings.job("c").notify == "on_completion" and settings.job("c").notify_webhook_url is None


def test_delivered_notifications_are_purged_with_the_history(agent_factory, db_url, receiver):
    clock = Clock(datetime.now(UTC))
    agent = agent_factory({"broken": {"SCHEDULE": "@once " + clock.now.isoformat(), "MAX_ATTEMPTS": "1",
                                      "COMMAND": "SELECT * FROM no_such_table"}},
                          clock=clock, AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok",
                          AGENT_HISTORY_RETENTION_DAYS="1")
    agent.tick()
    work(agent)
    assert len(receiver.wait_for(1)) == 1
    table = notifications_table(agent)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and query(agent, f"SELECT status FROM {table}") != [("sent",)]:
        time.sleep(0.05)
    clock.advance(2 * 86400)
    report = agent.tick()
    assert not report.errors, report.errors
    assert report.purged.get("notifications") == 1
    assert query(agent, f"SELECT COUNT(*) FROM {table}") == [(0,)]
