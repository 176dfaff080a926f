"""The local monitor's error paths (issue 23): every response, the standard library's own refusals
included, comes from the monitor's handler with its security headers; numbers beyond what the
database holds are 404/400, never a 500 with a traceback; a burst of 64 requests is served through
a bounded pool of database connections."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shared.web.app import SECURITY_HEADERS
from shared.web.local_server import make_server
from tests.support.harness import make_agent


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('monitor_errors') / 'agent.db'}"
    agent = make_agent(db, {"nightly": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}})
    agent.tick()
    server = make_server(agent, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        agent.close()


def raw_request(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request as bytes (methods and request lines no HTTP client library would send)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                lengths = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")]
                if lengths and len(body) >= int(lengths[0]):
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def get(port: int, target: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    return raw_request(port, f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                       .encode("latin-1"))


def assert_secured(headers: dict[str, str]) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name.lower()) == value, (name, headers)


@pytest.mark.parametrize("target, status, says", [
    ("/runs/9223372036854775807", 404, b"no run with id 9223372036854775807"),
    ("/runs/9223372036854775808", 404, b"run id="),
    ("/runs/" + "9" * 40, 404, b"run id="),
    ("/runs/+5", 404, b"run id="),
    ("/stuck?older_than=1e20", 400, b"older_than="),
    ("/stuck?older_than=100000000000000000000", 400, b"older_than="),
    ("/stuck?older_than=9999999999", 400, b"older_than="),
    ("/poison?limit=99999999999999999999999", 400, b"limit="),
])
def test_numbers_beyond_the_database_are_404_or_400_never_500(served, target, status, says):
    _, port = served
    got, headers, body = get(port, target)
    assert got == status and says in body, body[:300]
    assert_secured(headers)


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "PROPFIND", "FOO", "POST", "DELETE", "OPTIONS"])
def test_every_method_but_get_and_head_is_405_with_allow_and_the_headers(served, method):
    _, port = served
    status, headers, body = get(port, "/", method)
    assert status == 405 and headers["allow"] == "GET, HEAD", (status, headers)
    assert_secured(headers)
    assert b"read-only" in body


def test_the_standard_librarys_own_refusals_carry_the_monitors_page_and_headers(served):
    _, port = served
    status, headers, body = get(port, "/" + "a" * 100_000)         # 414: request line too long
    assert status == 414 and b"<h1>414</h1>" in body
    assert_secured(headers)
    status, headers, body = raw_request(port, b"GET / HTTP/9.9\r\n\r\n")   # 505: version
    assert status == 505
    assert_secured(headers)
    status, headers, body = raw_request(port, b"GARBAGE\r\n\r\n")            # 400: bad request line
    assert status == 400 and b"<h1>400</h1>" in body
    assert_secured(headers)


def test_a_burst_of_64_requests_is_served_through_a_bounded_pool(served):
    server, port = served
    pool = server.store_pool
    with ThreadPoolExecutor(max_workers=64) as workers:
        results = list(workers.map(lambda _: get(port, "/?format=json"), range(64)))
    assert [status for status, _, _ in results] == [200] * 64
    assert pool.opened <= pool.size and pool.idle_count() <= pool.size


def test_identical_requests_arriving_together_share_one_render_and_later_ones_render_anew(served):
    import contextlib
    from datetime import datetime, timezone

    from shared.web.app import Monitor, MonitorSettings

    server, _ = served
    lent = []
    started = threading.Event()

    @contextlib.contextmanager
    def slow_store():
        lent.append(1)
        started.set()
        time.sleep(0.3)                      # a render in flight while the others arrive
        with server.store_pool.lend() as store:
            yield store

    monitor = Monitor(slow_store, clock=lambda: datetime.now(timezone.utc), settings=lambda: MonitorSettings())
    with ThreadPoolExecutor(max_workers=8) as clients:
        first = clients.submit(monitor.handle, "GET", "/", "format=json")
        started.wait(5)
        rest = [clients.submit(monitor.handle, "GET", "/", "format=json") for _ in range(7)]
        bodies = {first.result().body} | {f.result().body for f in rest}
    assert len(lent) == 1 and len(bodies) == 1
    monitor.handle("GET", "/", "format=json")      # after the flight: a fresh render
    assert len(lent) == 2
    head = monitor.handle("HEAD", "/", "format=json")
    assert head.body == b"" and int(head.headers["Content-Length"]) > 0


# ---------------------------------------------------------------- the log stays in its format (issue 34, item 11)

TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.\-]+: \S")


def _hostile_clients(port: int) -> None:
    """Clients that reset the connection mid-answer, leave mid-request, send garbage, a request
    line past the library's limit, a header block past its limit, or stop reading a large answer."""
    def reset(request: bytes) -> None:
        connection = socket.create_connection(("127.0.0.1", port), timeout=10)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.sendall(request)
        connection.close()                  # RST: the server's write fails (reset or broken pipe)

    for _ in range(15):
        for target in ("/?format=json", "/monitor.css", "/jobs/nightly", "/runs/1", "/stuck", "/poison"):
            reset(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    for request in (b"GET / HT", b"\x00\xff\x1b[31m garbage\r\n\r\n", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
                    b"GET / HTTP/1.1\r\n" + b"X-Big: " + b"b" * 70_000 + b"\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X: y\r\n" * 200 + b"\r\n"):
        connection = socket.create_connection(("127.0.0.1", port), timeout=10)
        with contextlib.suppress(OSError):
            connection.sendall(request)
            time.sleep(0.05)
        connection.close()
    # A client that asks and never reads: the answer waits in the socket buffers, then it leaves.
    for _ in range(5):
        reset(f"GET /?format=json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode() * 50)


@pytest.mark.parametrize("form", ["--json", "text"])
def test_the_monitors_stderr_is_log_records_whatever_its_clients_do(tmp_path, form):
    """`monitor -v` (every record shown) under clients that disconnect, reset, stall and send
    garbage: each stderr line is a log record in the documented format (a JSON object under
    --json, `TIME LEVEL LOGGER: MESSAGE` otherwise), the library's traceback never; the monitor
    goes on serving."""
    from tests.support.harness import ROOT, as_from_a_terminal

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    subprocess.run([sys.executable, "-m", "shared.cli", "--db", db, "init-db"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    flags = ["--json"] if form == "--json" else []
    process = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", db, "-v", *flags, "monitor", "--port", "0"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=as_from_a_terminal)
    try:
        if form == "--json":
            port = json.loads(process.stdout.readline())["port"]
        else:
            announced = process.stderr.readline()
            port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", announced).group(1))
        _hostile_clients(port)
        assert get(port, "/?format=json")[0] == 200           # still serving
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, err[-2000:]
    lines = err.splitlines()
    assert "Traceback" not in err and "Exception occurred" not in err, err[-3000:]
    assert any("went away" in line for line in lines), err[-2000:]
    if form == "--json":
        assert out == ""
        for line in lines:
            record = json.loads(line)
            assert set(record) >= {"time", "level", "logger", "message"}, line
    else:
        records = [line for line in lines if line != "monitor stopped"]
        for line in records:
            assert TEXT_RECORD.match(line), line
        assert lines[-1] == "monitor stopped"


def test_a_client_that_stalls_is_let_go_after_the_timeout_and_logged_as_a_record(served, caplog, monkeypatch):
    server, port = served
    monkeypatch.setattr(server.RequestHandlerClass, "timeout", 0.5)
    with caplog.at_level(logging.INFO, logger="shared.web.local_server"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"GET / HTTP/1.1\r\n")            # and then nothing
            started = time.monotonic()
            assert connection.recv(1024) == b""                  # the server closed it
            assert time.monotonic() - started < 5
        deadline = time.monotonic() + 5
        while not any("timed out" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert any(r.name == "shared.web.local_server" and "timed out" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert get(port, "/?format=json")[0] == 200
