"""Webhook delivery (issue 23): one POST is bounded in total, however slowly the receiver answers;
a claim outlasts the longest batch; a run its flow failed is notified with the failing step's
error; bodies match docs/schemas/notification.schema.json and carry Standard Webhooks signatures
that the scheme's reference library verifies."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from shared.engine.notify import BATCH, DELIVERY_TIMEOUT_SECONDS, NotificationError, claim_seconds, post_json, signature_headers
from shared.errors import ConfigError
from shared.settings import load_settings
from tests.integration.test_notifications import Receiver, once
from tests.support.harness import work

UTC = timezone.utc
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/notification.schema.json").read_text())
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


class Trickler:
    """A receiver on 127.0.0.1 that reads the request, then answers one byte every 0.3 s (for at
    most 60 s): every socket read gets its byte in time, the answer never completes."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000
        deadline = time.monotonic() + 60
        with connection:
            try:
                connection.recv(65536)
                for byte in answer:
                    if self.stopped.is_set() or time.monotonic() > deadline:
                        return
                    connection.sendall(bytes([byte]))
                    time.sleep(0.3)
            except OSError:
                return

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


def test_one_post_is_bounded_in_total_however_slowly_the_receiver_answers():
    trickler = Trickler()
    try:
        started = time.monotonic()
        with pytest.raises(NotificationError, match="no complete answer within 1.5 s"):
            post_json(trickler.url, {"job": "x"}, 1.5)
        assert time.monotonic() - started < 3.0
    finally:
        trickler.close()


def test_a_claim_outlasts_the_longest_batch_of_posts():
    for timeout in (0.5, DELIVERY_TIMEOUT_SECONDS, 30):
        assert claim_seconds(timeout) > BATCH * timeout


def test_the_signature_is_the_standard_webhooks_one():
    payload = b'{"job": "nightly", "run_id": 7}'
    key = base64.b64decode(SECRET[len("whsec_"):])
    headers = signature_headers(key, "msg_42", int(time.time()), payload)
    Webhook(SECRET).verify(payload, headers)           # raises when it does not verify
    tampered = dict(headers, **{"webhook-id": "msg_43"})
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(payload, tampered)


def test_the_secret_setting_is_validated_and_never_echoed():
    assert load_settings(environ={"AGENT_NOTIFY_WEBHOOK_SECRET": SECRET}).agent.notify_webhook_secret == \
        b"0123456789abcdef0123456789abcdef"
    unpadded = "whsec_" + base64.b64encode(b"x" * 25).decode().rstrip("=")
    assert load_settings(environ={"AGENT_NOTIFY_WEBHOOK_SECRET": unpadded}).agent.notify_webhook_secret == b"x" * 25
    for bad, says in [("plainsecretvalue", "'whsec_' followed by"), ("whsec_***not-base64***", "not base64"),
                      ("whsec_" + base64.b64encode(b"short").decode(), "decodes to 5 bytes")]:
        with pytest.raises(ConfigError) as caught:
            load_settings(environ={"AGENT_NOTIFY_WEBHOOK_SECRET": bad})
        message = str(caught.value)
        assert "AGENT_NOTIFY_WEBHOOK_SECRET" in message and says in message and bad not in message


class SigningReceiver(Receiver):
    """The test_notifications receiver, keeping each request's headers and raw body too."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                data = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.received.append((self.path, json.loads(data)))
                    receiver.raw.append(({k.lower(): v for k, v in self.headers.items()}, data))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_flow_failures_carry_the_failing_steps_error_and_every_body_is_signed_and_valid(agent_factory):
    receiver = SigningReceiver()
    try:
        jobs = {
            # Step 1 fails and is handled (goto 2); step 2 succeeds and the flow says quit_failure.
            "handled": once(STEPS__1__COMMAND="SELECT * FROM no_such_table", STEPS__1__MAX_ATTEMPTS="1",
                            STEPS__1__ON_FAILURE="goto:2", STEPS__2__COMMAND="SELECT 1",
                            STEPS__2__ON_SUCCESS="quit_failure"),
            "plain": once(COMMAND="SELECT * FROM missing_too", MAX_ATTEMPTS="1"),
            "fine": once(COMMAND="SELECT 1", NOTIFY="on_success"),
        }
        agent = agent_factory(jobs, AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok", AGENT_RETRY_BACKOFF_SECONDS="0",
                              AGENT_NOTIFY_WEBHOOK_SECRET=SECRET)
        agent.tick(datetime.now(UTC))
        work(agent, concurrency=2)
        receiver.wait_for(3)
        by_job = {body["job"]: body for body in receiver.bodies()}
        assert sorted(by_job) == ["fine", "handled", "plain"], by_job
        handled = by_job["handled"]
        assert handled["outcome"] == "failed" and "no_such_table" in (handled["error"] or ""), handled
        assert handled["failing_step"] == 1
        assert "missing_too" in by_job["plain"]["error"] and by_job["fine"]["error"] is None
        for body in by_job.values():
            jsonschema.validate(body, SCHEMA, format_checker=jsonschema.FormatChecker())
        for headers, data in receiver.raw:
            assert headers["webhook-id"].startswith("msg_")
            Webhook(SECRET).verify(data, headers)
        assert len({headers["webhook-id"] for headers, _ in receiver.raw}) == 3
    finally:
        receiver.close()
