"""The whole engine end to end on Azurite (Azure Storage queues) and PostgreSQL (through pyodbc).

timer trigger → tick → Azure Storage queue → queue trigger → job → host deletes the message.

Where the Functions host's delivery rules are the point, the tests play the host by hand
(`host_deliver`): receive, invoke the real queue trigger with a real
`azure.functions.queue.QueueMessage` built from the received message, then delete the message
when the function returned, make it visible again when it raised, or move it to
"<queue>-poison" when it raised on delivery host.json maxDequeueCount. Elsewhere the local
runner (shared/engine/runner.py, the same rules) or the CLI in a subprocess works the queue.

Both services are required: without them these tests skip on a developer machine and fail in
CI (CI=true), like every service test.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import pytest
from azure.functions.queue import QueueMessage
from azure.functions.timer import TimerRequest

from shared.cli.commands import main as cli
from shared.engine.agent import reset_default_agent
from shared.errors import AgentError, QueueError, TransientJobError
from shared.messaging.azure_storage import AzureStorageQueue
from shared.messaging.messages import parse_message
from shared.messaging.port import host_queue_options
from tests.support.azurite import (  # noqa: F401  (azurite, azurite_server: pytest fixtures)
    ACCOUNT,
    ACCOUNT_KEY,
    Azurite,
    azurite,
    azurite_server,
)
from tests.support.harness import ROOT, execute, job_env, make_agent, query, work

UTC = timezone.utc
HOST = host_queue_options()
# The host hides a message while its function runs (and renews that); a test never needs longer.
PROCESSING_VISIBILITY_SECONDS = 600
MARKER = "CREATE TABLE marker (job VARCHAR(64))"
# Kills its own connection (SQLSTATE 57P01, transient) while its run is below attempt 3.
FLAKY = ("SELECT CASE WHEN (SELECT MAX(attempt) FROM agent.runs WHERE job_name = 'flaky') < 3 "
         "THEN pg_terminate_backend(pg_backend_pid()) END")
DOOMED = "SELECT pg_terminate_backend(pg_backend_pid())"
# Settings the tests set themselves; anything inherited from the shell is removed first.
OWN_PREFIXES = ("JOB__", "AGENT_", "AzureWebJobsStorage", "APPLICATIONINSIGHTS_")


def due_now(command: str, **extra: str) -> dict[str, str]:
    """A one-time job due now: the next tick claims and dispatches it."""
    return {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": command, **extra}


def marker_insert(job: str) -> str:
    return f"INSERT INTO marker (job) VALUES ('{job}')"


# ---------------------------------------------------------------- the app under test


class App:
    """One function app's settings on the test's PostgreSQL database and a fresh Azurite queue:
    set as process environment (what the triggers' process-wide agent reads) and as an Agent of
    the test's own (ticks and queries)."""

    def __init__(self, db: str, azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db = db
        self.azurite = azurite
        self.monkeypatch = monkeypatch
        self.queue_name = azurite.unique_name("e2e")
        self.env: dict[str, str] = {}
        self._agents: list[Any] = []

    def settings(self, jobs: dict[str, dict[str, str]], storage: str | None = None,
                 **agent_settings: str) -> dict[str, str]:
        # A poll interval longer than the tick period: no doorbell chain, so the queue holds only
        # run messages (the doorbell tests set it themselves).
        agent_settings.setdefault("AGENT_POLL_SECONDS", "300")
        # Some tests jump their tick past a dispatch lease (300 s): allow that much clock skew.
        agent_settings.setdefault("AGENT_MAX_CLOCK_SKEW_SECONDS", "3600")
        return job_env(jobs, AGENT_DB=self.db, AGENT_QUEUE_NAME=self.queue_name,
                       AzureWebJobsStorage=storage or self.azurite.connection_string, **agent_settings)

    def configure(self, jobs: dict[str, dict[str, str]], *, storage: str | None = None, **agent_settings: str):
        """Set the app settings, run init-db (schema and queue), return the test's agent."""
        for key in [k for k in os.environ if k.startswith(OWN_PREFIXES)]:
            self.monkeypatch.delenv(key)
        self.env = self.settings(jobs, storage, **agent_settings)
        for key, value in self.env.items():
            self.monkeypatch.setenv(key, value)
        reset_default_agent()
        settings = {k: v for k, v in self.env.items() if not k.startswith("JOB__")}
        settings.pop("AGENT_DB")
        agent = make_agent(self.db, jobs, **settings)
        self._agents.append(agent)
        return agent

    def queue(self, encoding: str = "base64", name: str | None = None) -> AzureStorageQueue:
        """The host's own client on the app's queue (straight to Azurite)."""
        return self.azurite.queue(name or self.queue_name, encoding=encoding, create=False)

    def host_poison_exists(self) -> bool:
        try:
            self.queue(name=self.queue_name + "-poison").depth()
        except QueueError as error:
            assert "does not exist" in str(error)
            return False
        return True

    def close(self) -> None:
        reset_default_agent()
        for agent in self._agents:
            agent.close()


@pytest.fixture
def app(pg_url: str, azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    instance = App(pg_url, azurite, monkeypatch)
    try:
        yield instance
    finally:
        instance.close()


def user_function(module_name: str, name: str) -> Callable[..., Any]:
    """The decorated trigger function, as the host calls it."""
    module = __import__(f"functions.{module_name}", fromlist=[name])
    built = getattr(module, name).build()
    assert built.get_function_name() == name
    return built.get_user_function()


def timer_tick() -> None:
    user_function("timer_trigger", "agent_tick")(TimerRequest(past_due=False))


@dataclass(frozen=True)
class Delivery:
    message_id: str
    dequeue_count: int
    outcome: str                       # deleted | released | host-poison
    error: BaseException | None = None


def host_deliver(queue: AzureStorageQueue, *, redeliver_after: float = 0) -> Delivery | None:
    """One delivery as the Functions host makes it, through the real queue trigger.
    `redeliver_after` stands in for host.json visibilityTimeout (30 s) to keep tests fast."""
    messages = queue.receive(1, PROCESSING_VISIBILITY_SECONDS)
    if not messages:
        return None
    (message,) = messages
    trigger = user_function("queue_trigger", "agent_execute")
    try:
        trigger(QueueMessage(id=message.id, body=message.body.encode("utf-8"),
                             dequeue_count=message.dequeue_count, pop_receipt=message.pop_receipt))
    except Exception as error:
        if message.dequeue_count >= HOST.max_dequeue_count:
            queue.move_to_poison(message)
            return Delivery(message.id, message.dequeue_count, "host-poison", error)
        queue.release(message, redeliver_after)
        return Delivery(message.id, message.dequeue_count, "released", error)
    queue.delete(message)
    return Delivery(message.id, message.dequeue_count, "deleted")


def host_deliver_all(queue: AzureStorageQueue, limit: int = 20) -> list[Delivery]:
    deliveries: list[Delivery] = []
    while len(deliveries) < limit:
        delivery = host_deliver(queue)
        if delivery is None:
            return deliveries
        deliveries.append(delivery)
    raise AssertionError(f"still delivering after {limit} deliveries: {deliveries}")


def runs_of(agent, job: str | None = None) -> list[dict[str, Any]]:
    return sorted(agent.store().execute("list_history", job_name=job, limit=1000).rows, key=lambda r: r["run_id"])


def attempts_of(agent, run_id: int) -> list[dict[str, Any]]:
    return agent.store().execute("list_attempts", run_ids=[run_id]).rows


def poison_rows(agent) -> list[dict[str, Any]]:
    return agent.store().execute("list_poison", limit=100).rows


def peek(azurite: Azurite, queue_name: str) -> list[tuple[str, str]]:
    """(id, text as stored on the service) of the visible messages: what the host will decode.
    A peek does not count as a delivery (the dequeue count stays)."""
    from azure.storage.queue import QueueClient

    with QueueClient.from_connection_string(azurite.connection_string, queue_name) as client:
        return [(message.id, message.content) for message in client.peek_messages(max_messages=32)]


# ---------------------------------------------------------------- trigger path


def test_timer_dispatches_to_azurite_and_the_queue_trigger_runs_the_job(app: App, azurite: Azurite) -> None:
    agent = app.configure({"stamp": due_now(marker_insert("stamp"))})
    execute(agent, MARKER)
    assert app.queue().depth() == 0                       # init-db created the queue

    timer_tick()                                          # the timer trigger, on the process-wide agent

    (run,) = runs_of(agent, "stamp")
    assert run["status"] == "queued"
    ((_, raw),) = peek(azurite, app.queue_name)           # base64 on the wire, as host.json expects
    (message,) = app.queue().receive(1, PROCESSING_VISIBILITY_SECONDS)
    assert base64.b64decode(raw).decode("utf-8") == message.body
    doorbell = parse_message(message.body)
    assert (doorbell.run_id, doorbell.token) == (run["run_id"], run["token"])
    assert doorbell.operation_id == run["operation_id"]   # one correlation id, timer to queue to SQL
    assert message.dequeue_count == 1

    trigger = user_function("queue_trigger", "agent_execute")
    assert trigger(QueueMessage(id=message.id, body=message.body.encode("utf-8"),
                                dequeue_count=message.dequeue_count, pop_receipt=message.pop_receipt)) is None
    app.queue().delete(message)                           # the host deletes on a normal return

    (run,) = runs_of(agent, "stamp")
    assert run["status"] == "succeeded"
    (attempt,) = attempts_of(agent, run["run_id"])
    assert attempt["outcome"] == "succeeded" and attempt["dequeue_count"] == 1
    assert query(agent, "SELECT job FROM marker") == [("stamp",)]
    assert app.queue().depth() == 0
    assert poison_rows(agent) == []


def test_a_transient_failure_is_redelivered_with_growing_dequeue_count_and_succeeds(app: App) -> None:
    agent = app.configure({"flaky": due_now(FLAKY, MAX_ATTEMPTS="1")})
    agent.tick()

    deliveries = host_deliver_all(app.queue())

    assert [(d.dequeue_count, d.outcome) for d in deliveries] == [(1, "released"), (2, "released"), (3, "deleted")]
    assert len({d.message_id for d in deliveries}) == 1   # one message, redelivered
    assert all(isinstance(d.error, TransientJobError) for d in deliveries[:2])
    (run,) = runs_of(agent, "flaky")
    assert run["status"] == "succeeded"                   # no job retry spent (MAX_ATTEMPTS=1)
    attempts = attempts_of(agent, run["run_id"])
    assert [(a["outcome"], a["dequeue_count"]) for a in attempts] == [
        ("transient", 1), ("transient", 2), ("succeeded", 3)]
    assert app.queue().depth() == 0
    assert poison_rows(agent) == [] and not app.host_poison_exists()


@pytest.mark.parametrize("threshold", [HOST.max_dequeue_count, 3])
def test_an_always_transient_job_is_poisoned_by_the_app_at_its_threshold(app: App, azurite: Azurite,
                                                                          threshold: int) -> None:
    """At AGENT_MAX_DEQUEUE_COUNT the trigger returns normally: the host deletes the message and
    never reaches its own move to <queue>-poison (host.json maxDequeueCount)."""
    assert threshold <= HOST.max_dequeue_count
    agent = app.configure({"doomed": due_now(DOOMED)}, AGENT_MAX_DEQUEUE_COUNT=str(threshold))
    agent.tick()
    ((message_id, raw),) = peek(azurite, app.queue_name)
    sent_body = base64.b64decode(raw).decode("utf-8")

    deliveries = host_deliver_all(app.queue())

    expected = [(n, "released") for n in range(1, threshold)] + [(threshold, "deleted")]
    assert [(d.dequeue_count, d.outcome) for d in deliveries] == expected
    assert all(isinstance(d.error, TransientJobError) for d in deliveries[:-1])
    assert deliveries[-1].error is None                   # returned normally at the threshold
    (run,) = runs_of(agent, "doomed")
    assert run["status"] == "poisoned"
    (poison,) = poison_rows(agent)
    assert poison["run_id"] == run["run_id"] and poison["dequeue_count"] == threshold
    assert poison["body"] == sent_body                    # body intact
    assert poison["message_id"] == message_id
    assert f"AGENT_MAX_DEQUEUE_COUNT={threshold}" in poison["reason"]
    errors = json.loads(poison["errors"])                 # every delivery's error, then the verdict
    assert [e["outcome"] for e in errors] == ["transient"] * (threshold - 1) + ["poisoned", "poisoned"]
    assert app.queue().depth() == 0                       # gone from the queue
    assert not app.host_poison_exists()                   # nothing for the host to poison


def test_the_first_delivery_counts_toward_the_threshold(app: App) -> None:
    """Deliveries are counted by the service: a message already received once (e.g. by an
    instance that crashed) arrives with dequeue count 2 and is poisoned one delivery earlier."""
    agent = app.configure({"doomed": due_now(DOOMED)}, AGENT_MAX_DEQUEUE_COUNT="2")
    agent.tick()
    (first,) = app.queue().receive(1, 1)
    app.queue().release(first, 0)                         # the crashed instance's delivery
    deliveries = host_deliver_all(app.queue())
    assert [(d.dequeue_count, d.outcome) for d in deliveries] == [(2, "deleted")]
    assert runs_of(agent, "doomed")[0]["status"] == "poisoned"


def test_wrong_encoding_and_garbage_go_to_poison_on_the_first_delivery(app: App, azurite: Azurite) -> None:
    """Raw text on a base64 queue never reaches the app (the host moves it to <queue>-poison at
    once, and so does the local runner), even when the text is a valid doorbell; well-encoded
    garbage reaches the executor, which poisons it at once and keeps the body. The run whose
    doorbell was sent with the wrong encoding is not lost: its dispatch lease expires and a
    later tick dispatches it again."""
    agent = app.configure({"real": due_now(marker_insert("real"))})
    execute(agent, MARKER)
    agent.tick()
    (run,) = runs_of(agent, "real")
    (dispatched,) = app.queue().receive(1, 60)
    app.queue().delete(dispatched)
    raw_writer = app.queue(encoding="none")               # a sender with the wrong encoding
    raw_writer.send_many([dispatched.body, "hello, from another tool!"])
    app.queue().send_many(["this is not json"])           # right encoding, garbage content

    work(agent)                                           # the local runner, host rules

    (poison,) = poison_rows(agent)                        # the app's poison table: the garbage only
    assert poison["body"] == "this is not json" and poison["dequeue_count"] == 1
    assert poison["run_id"] is None and "not JSON" in poison["reason"]
    host_poison = app.queue(name=app.queue_name + "-poison")
    assert sorted(m.body for m in host_poison.receive(32, 60)) == sorted(
        [dispatched.body, "hello, from another tool!"])    # intact, as the host moves them
    assert app.queue().depth() == 0
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(0,)]
    assert runs_of(agent, "real")[0]["status"] == "queued"

    lease = int(agent.settings.agent.dispatch_lease_seconds)
    report = agent.tick(datetime.now(UTC) + timedelta(seconds=lease + 1))
    assert [r["run_id"] for r in report.dispatched] == [run["run_id"]]
    assert report.dispatched[0]["token"] > run["token"]   # a new doorbell; the poisoned one is stale
    work(agent)
    assert runs_of(agent, "real")[0]["status"] == "succeeded"
    assert query(agent, "SELECT job FROM marker") == [("real",)]


def test_the_same_message_delivered_twice_runs_the_job_once(app: App) -> None:
    agent = app.configure({"once": due_now("SELECT pg_sleep(1); " + marker_insert("once"))})
    execute(agent, MARKER)
    agent.tick()
    (message,) = app.queue().receive(1, 60)
    app.queue().send_many([message.body])                 # at-least-once delivery: a duplicate
    app.queue().release(message, 0)

    assert work(agent, concurrency=2) == 2               # both copies, in parallel

    assert query(agent, "SELECT COUNT(*) FROM marker") == [(1,)]
    (run,) = runs_of(agent, "once")
    assert run["status"] == "succeeded"
    assert len(attempts_of(agent, run["run_id"])) == 1
    assert app.queue().depth() == 0                       # the duplicate was acknowledged, not retried
    assert poison_rows(agent) == []


# ---------------------------------------------------------------- storage failures


def test_azurite_down_during_a_tick_loses_nothing(app: App, azurite: Azurite,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    jobs = {name: due_now(marker_insert(name)) for name in ("a", "b", "c")}
    agent = app.configure(jobs)
    execute(agent, MARKER)
    azurite.stop()

    with pytest.raises(AgentError) as error:              # the timer invocation fails visibly
        timer_tick()
    assert "tick finished with errors" in str(error.value) and "unreachable" in str(error.value)
    assert "3 run(s) left pending" in str(error.value)
    assert {r["status"] for r in runs_of(agent)} == {"pending"}   # claimed, and claimable again
    assert len(runs_of(agent)) == 3

    assert cli(["--db", app.db, "tick"]) == 1             # the CLI: exit 1, the error on stderr
    assert "unreachable" in capsys.readouterr().err
    report = agent.tick()
    assert report.dispatched == [] and any("unreachable" in e for e in report.errors)
    assert {r["status"] for r in runs_of(agent)} == {"pending"}

    azurite.start()
    report = agent.tick()
    assert report.errors == []
    assert sorted(r["job_name"] for r in report.dispatched) == ["a", "b", "c"]
    assert work(agent) == 3
    assert [r["status"] for r in runs_of(agent)] == ["succeeded"] * 3
    assert sorted(query(agent, "SELECT job FROM marker")) == [("a",), ("b",), ("c",)]
    assert app.queue().depth() == 0


class FaultyStorageProxy:
    """An HTTP hop in front of Azurite. It forwards every request, except that once its
    allowance of Put Message requests (POST .../messages) is spent it answers them with 503
    ServerBusy, as a throttled storage front end does: real HTTP, the SDK's real retries."""

    HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}
    REQUEST_DROP = HOP_BY_HOP | {"host"}             # http.client sets the upstream's
    RESPONSE_DROP = HOP_BY_HOP | {"content-length"}  # answer() sets it
    BUSY = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
            b"<Message>The server is busy (fault injected by the test proxy).</Message></Error>")

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.sends_allowed: int | None = None   # None: forward everything
        self.refused = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def relay(self) -> None:
                # Forward the body exactly as sent (Content-Length is part of the Shared Key signature).
                length = self.headers.get("Content-Length")
                body = self.rfile.read(int(length)) if length is not None else None
                if self.command == "POST" and urlsplit(self.path).path.endswith("/messages") and proxy.refuse_send():
                    self.answer(503, [("Content-Type", "application/xml"), ("x-ms-error-code", "ServerBusy")],
                                proxy.BUSY)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy.REQUEST_DROP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    kept = [(k, v) for k, v in response.getheaders() if k.lower() not in proxy.RESPONSE_DROP]
                    status = response.status
                finally:
                    upstream.close()
                self.answer(status, kept, data)

            def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = relay

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"QueueEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT};")

    def refuse_send(self) -> bool:
        with self._lock:
            if self.sends_allowed is None:
                return False
            if self.sends_allowed > 0:
                self.sends_allowed -= 1
                return False
            self.refused += 1
            return True

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[FaultyStorageProxy]:
    instance = FaultyStorageProxy(azurite.port)
    try:
        yield instance
    finally:
        instance.close()


def _dispatch_part_way(app: App, proxy: FaultyStorageProxy):
    jobs = {name: due_now(marker_insert(name)) for name in ("a", "b", "c")}
    agent = app.configure(jobs, storage=proxy.connection_string())
    execute(agent, MARKER)
    proxy.sends_allowed = 1
    return agent, agent.tick()


def test_a_dispatch_that_fails_part_way_puts_back_exactly_the_unsent_runs(app: App,
                                                                         proxy: FaultyStorageProxy) -> None:
    agent, report = _dispatch_part_way(app, proxy)

    assert proxy.refused >= 1
    (error,) = report.errors
    assert "503" in error and "(1 of 3 messages were sent)" in error and "2 run(s) left pending" in error
    first, *rest = runs_of(agent)
    assert first["status"] == "queued"                    # sent: it stays queued under its lease
    assert [r["status"] for r in rest] == ["pending", "pending"]
    (message,) = app.queue().receive(32, 60)              # exactly one message reached the queue
    assert parse_message(message.body).run_id == first["run_id"]
    assert parse_message(message.body).token == first["token"]
    app.queue().release(message, 0)

    proxy.sends_allowed = None                            # storage recovers
    report = agent.tick()
    assert report.errors == []
    assert [r["run_id"] for r in report.dispatched] == [r["run_id"] for r in rest]  # not the sent one again
    assert work(agent) == 3
    assert [r["status"] for r in runs_of(agent)] == ["succeeded"] * 3
    assert sorted(query(agent, "SELECT job FROM marker")) == [("a",), ("b",), ("c",)]
    assert app.queue().depth() == 0


def test_a_dispatch_that_fails_part_way_reports_the_runs_it_did_send(app: App, proxy: FaultyStorageProxy) -> None:
    agent, report = _dispatch_part_way(app, proxy)
    first = runs_of(agent)[0]
    assert [r["run_id"] for r in report.dispatched] == [first["run_id"]]
    assert report.summary()["runs_dispatched"] == 1


# ---------------------------------------------------------------- the CLI on Azurite


def cli_process(app: App, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shared.cli", "--db", app.db, *args], cwd=ROOT,
                          env=_process_env(app), capture_output=True, text=True, timeout=timeout)


def _process_env(app: App) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN_PREFIXES)}
    env.update(app.env)
    return env


def test_init_db_creates_the_queue_on_azurite(app: App, azurite: Azurite) -> None:
    app.env = app.settings({})
    with pytest.raises(QueueError, match="does not exist"):
        app.queue().depth()

    first = cli_process(app, "init-db")
    assert first.returncode == 0, first.stderr
    assert "schema upgraded" in first.stdout
    assert app.queue().depth() == 0                       # the queue exists now
    app.queue().send_many(["keep me"])
    again = cli_process(app, "init-db")                   # idempotent: nothing recreated or lost
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    assert [m.body for m in app.queue().receive(1, 60)] == ["keep me"]

    azurite.stop()
    down = cli_process(app, "init-db")
    assert down.returncode == 1
    assert "unreachable" in down.stderr and app.queue_name in down.stderr
    assert "Traceback" not in down.stderr


def test_cli_work_until_idle_consumes_the_azurite_queue_with_the_host_rules(app: App) -> None:
    flaky_once = FLAKY.replace("'flaky') < 3", "'flaky') < 2")
    jobs = {"good": due_now(marker_insert("good")), "flaky": due_now(flaky_once + "; " + marker_insert("flaky"),
                                                                    MAX_ATTEMPTS="1")}
    agent = app.configure(jobs)
    execute(agent, MARKER)
    ticked = cli_process(app, "tick")
    assert ticked.returncode == 0 and "2 dispatched" in ticked.stdout, ticked.stdout + ticked.stderr
    app.queue().send_many(["this is not json"])           # garbage: the app's poison table
    app.queue(encoding="none").send_many(["raw text!"])   # wrong encoding: the host's poison queue
    assert app.queue().depth() == 4

    worked = cli_process(app, "work", "--until-idle", "--visibility-timeout", "0")

    assert worked.returncode == 0, worked.stderr
    assert "processed 4 message(s)" in worked.stdout      # good, flaky twice, garbage; raw never delivered
    assert sorted(query(agent, "SELECT job FROM marker")) == [("flaky",), ("good",)]
    assert [r["status"] for r in runs_of(agent)] == ["succeeded", "succeeded"]
    (flaky,) = runs_of(agent, "flaky")
    assert [(a["outcome"], a["dequeue_count"]) for a in attempts_of(agent, flaky["run_id"])] == [
        ("transient", 1), ("succeeded", 2)]
    (poison,) = poison_rows(agent)
    assert poison["body"] == "this is not json" and poison["dequeue_count"] == 1
    assert [m.body for m in app.queue(name=app.queue_name + "-poison").receive(32, 60)] == ["raw text!"]
    assert app.queue().depth() == 0


def test_cli_run_ticks_and_works_the_azurite_queue_until_stopped(app: App, tmp_path) -> None:
    agent = app.configure({"stamp": due_now(marker_insert("stamp"))})
    execute(agent, MARKER)
    # The runner logs at INFO (the storage SDK's request lines included): a file, not a pipe that
    # nobody reads while it runs, which would block it once full.
    log_path = tmp_path / "run.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", app.db, "run", "--concurrency", "2"],
                                   cwd=ROOT, env=_process_env(app), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if query(agent, "SELECT job FROM marker"):
                break
            time.sleep(0.2)
        assert process.poll() is None, "the runner exited early: " + log_path.read_text()
        process.send_signal(signal.SIGTERM)               # what a service manager does to stop it
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log_path.read_text()
    assert process.returncode == 0, output
    assert f"queue {app.queue_name}" in output and "agent stopped" in output
    assert query(agent, "SELECT job FROM marker") == [("stamp",)]
    assert runs_of(agent, "stamp")[0]["status"] == "succeeded"
    assert app.queue().depth() == 0
