"""The monitor's error paths (issue 23), on SQLite and PostgreSQL: every response, errors
included, comes from the engine's own handler with the security headers, on the local server
(errors of the standard library's HTTP parser too) and on the Azure trigger; every method but
GET and HEAD gets 405 with Allow; numbers beyond what the database holds are 404/400, never a
500; 64 clients at once are all answered (statuses and headers here; the latency is measured by
bench/bench_monitor.py)."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from shared.monitor import (BIGINT_MAX, LISTEN_BACKLOG, SECURITY_HEADERS, SharedRenders, Response, make_server)
from tests.test_monitor import monitor_on, scenario  # noqa: F401  (module-scoped fixture)
from tests.test_monitor_trigger import call, principal, GROUP  # noqa: F401  (fixtures and helpers)

ODD_METHODS = ("TRACE", "CONNECT", "PROPFIND", "FOO", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "MKCOL")


def _secure(headers) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (name, dict(headers))


@pytest.mark.parametrize("path, query, status", [
    ("/runs/9223372036854775808", "", 404),                  # bigint + 1
    (f"/runs/{BIGINT_MAX}", "", 404),                        # the largest id there could be: no such run
    ("/runs/" + "9" * 400, "", 404),
    ("/runs/-1", "", 404),
    ("/runs/1e20", "", 404),
    ("/runs/\u0663", "", 404),                               # an Arabic-Indic digit: not an id
    ("/stuck", "older_than=1e20", 400),
    ("/stuck", "older_than=100000000000000000000", 400),
    ("/stuck", "older_than=999999999999", 400),
    ("/stuck", "limit=99999999999999999999999", 400),
    ("/poison", "limit=-5", 400),
])
def test_numbers_out_of_range_are_404_or_400_never_500(scenario, path, query, status):  # noqa: F811
    monitor, _ = monitor_on(scenario)
    for wanted in ("", "&format=json"):
        response = monitor.handle("GET", path, query + wanted if query else wanted.lstrip("&"))
        assert response.status == status, (path, query, response.body[:300])
        _secure(response.all_headers())
        assert b"Traceback" not in response.body and len(response.body) < 20000


@pytest.fixture
def server(scenario):  # noqa: F811
    httpd = make_server(scenario.agent, 0, environ={})
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; the status, the headers and the body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return status, headers, body


def test_every_method_but_get_and_head_is_405_with_allow_and_the_headers(server):
    for method in ODD_METHODS:
        target = f"127.0.0.1:{server}" if method == "CONNECT" else "/"
        status, headers, body = _raw(server, f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
                                             "Content-Length: 5\r\n\r\nhello".encode())
        assert status == 405 and headers["Allow"] == "GET, HEAD", (method, status)
        _secure(headers)
        assert headers["Connection"] == "close"
        assert f"{method} is not allowed".encode() in body
    status, headers, _ = _raw(server, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n\r\n".encode())
    assert status == 200
    _secure(headers)


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),       # a 100 KB URL
    (b"garbage\r\n\r\n", 400),
    (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", 431),
    (b"GET /\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 421),            # not a served Host
])
def test_what_the_http_parser_refuses_is_the_engines_page_with_the_headers(server, request_bytes, status):
    got, headers, body = _raw(server, request_bytes)
    assert got == status, body[:300]
    _secure(headers)
    assert headers["Content-Type"].startswith("text/html") and b"<h1>" + str(status).encode() in body


def test_a_client_trickling_its_request_is_cut_at_the_deadline(server, monkeypatch):
    import select

    from shared import monitor as module

    # The deadline is set when a connection is taken: 1 s for this test's connections.
    monkeypatch.setattr(module, "REQUEST_TIMEOUT_SECONDS", 1)
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\n")
        closed_after = None
        while time.monotonic() - started < 8:
            # A header byte every 0.3 s: each read of the server's comes well within any per-read timeout.
            readable, _, _ = select.select([sock], [], [], 0.3)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionError:
                    data = b""
                if not data:
                    closed_after = time.monotonic() - started
                    break
            try:
                sock.sendall(b"X")
            except OSError:
                closed_after = time.monotonic() - started
                break
        assert closed_after is not None and closed_after < 3, closed_after


def test_sixty_four_clients_at_once_are_all_answered_with_the_headers(server):
    assert LISTEN_BACKLOG >= 64
    paths = ["/", "/poison", "/stuck", "/jobs/nightly_ok", "/?format=json", "/monitor.css", "/nope"]
    results: list[tuple[int, dict[str, str]]] = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def client(index: int) -> None:
        start.wait()
        connection = http.client.HTTPConnection("127.0.0.1", server, timeout=60)
        connection.request("GET", paths[index % len(paths)], headers={"Host": f"127.0.0.1:{server}"})
        response = connection.getresponse()
        response.read()
        connection.close()
        with lock:
            results.append((response.status, dict(response.getheaders())))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert len(results) == 64
    assert sorted({status for status, _ in results}) == [200, 404]
    for _, headers in results:
        _secure(headers)


def test_identical_requests_in_flight_share_one_render_and_nothing_is_kept():
    shared = SharedRenders()
    renders = []
    gate = threading.Event()

    def produce() -> Response:
        renders.append(1)
        gate.wait(5)
        return Response(200, f"render {len(renders)}".encode(), "text/plain", {"X": "1"})

    answers = []
    threads = [threading.Thread(target=lambda: answers.append(shared.render("k", produce))) for _ in range(10)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    gate.set()
    for thread in threads:
        thread.join()
    assert len(renders) == 1 and {a.body for a in answers} == {b"render 1"}
    assert len({id(a.headers) for a in answers}) == 10           # each request its own headers to change
    assert shared.render("k", produce).body == b"render 2"      # nothing outlives the render


def test_the_azure_trigger_answers_every_method_and_bad_number_with_the_headers(call):  # noqa: F811
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"):
        response = call("/", method=method)         # `call` checks the security headers of each
        assert response.status_code == 405 and response.headers["Allow"] == "GET, HEAD", method
    assert call("/runs/9223372036854775808").status_code == 404
    assert call("/stuck", query="older_than=1e20").status_code == 400
    assert call("/runs/1", user=None).status_code == 401


def test_an_unexpected_failure_in_the_azure_path_is_a_500_page_with_the_headers(monkeypatch):
    from shared import monitor as module

    def broken(method, url, headers):
        raise RuntimeError("boom")

    monkeypatch.setattr(module, "_azure_request", broken)
    for method in ("GET", "HEAD"):
        response = module.handle_azure_request(method, "https://app.azurewebsites.net/api/monitor/", {})
        assert response.status == 500
        _secure(response.all_headers())
        assert (response.body == b"") == (method == "HEAD")
        assert b"boom" not in response.body
