"""The monitor on this machine (sql-agent monitor): a threading HTTP server on 127.0.0.1 and the
pool of stores its requests borrow."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Mapping
from urllib.parse import urlsplit

from shared.engine.audit import _os_user
from shared.errors import PageError
from shared.web.actions import MAX_BODY_BYTES, Actions, Caller, own_origin, session_from_cookies
from shared.web.app import Monitor, Response, monitor_settings

log = logging.getLogger(__name__)
# How long a client may stay silent while sending its request or reading the answer.
CLIENT_TIMEOUT_SECONDS = 30
# A client that closed, reset or stalled its connection while being answered.
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class StorePool:
    """Stores lent to the server's request threads, one request at a time, at most ``size`` at
    once: a burst of requests waits for a free one instead of opening a connection each. The
    connections themselves come from the process's pool (AGENT_MAX_CONNECTIONS, shared.control.pool),
    shared with the workers and the tick: each request's connection goes back to it when the
    request ends, and an idle one is closed after a minute, so a quiet monitor holds none."""

    def __init__(self, agent, size: int = 4, idle_seconds: float = 60.0, wait_seconds: float = 30.0) -> None:
        self.agent = agent
        self.size = size
        self.idle_seconds = idle_seconds
        self.wait_seconds = wait_seconds
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Any] = []      # Store objects without a connection, for the next request
        self._lock = threading.Lock()
        self.opened = 0                 # Store objects made (at most size)

    @contextlib.contextmanager
    def lend(self) -> Iterator[Any]:
        if not self._slots.acquire(timeout=self.wait_seconds):
            raise PageError(503, f"the monitor is busy: all {self.size} of its database connections stayed in use "
                                 f"for {self.wait_seconds:.0f} s; try again")
        try:
            with self._lock:
                store = self._idle.pop() if self._idle else None
            if store is None:
                store = self.agent.new_store()
                self.opened += 1
            try:
                yield store
            finally:
                store.close()       # the connection back to the process's pool
                with self._lock:
                    self._idle.append(store)
        finally:
            self._slots.release()

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def connections(self) -> int:
        """Connections the monitor's stores hold now (0 between requests)."""
        with self._lock:
            return sum(1 for store in self._idle if store.connected)

    def close(self) -> None:
        with self._lock:
            stores, self._idle = list(self._idle), []
        for store in stores:
            store.close()


def make_server(agent, port: int, environ: Mapping[str, str] | None = None, *, operator: bool = False):
    """A ThreadingHTTPServer on 127.0.0.1:port serving the monitor (port 0: any free port).
    ``operator`` (`monitor --operator`): the pages carry the operator's buttons and the actions
    are taken, as this host's user. Raises OSError when the port is taken."""

    pool = StorePool(agent)
    env = dict(os.environ if environ is None else environ)
    actions = Actions(lambda: agent) if operator else None
    monitor = Monitor(pool.lend, clock=agent.clock, settings=lambda: monitor_settings(env), base_path="",
                      actions=actions)
    user = _os_user()

    class Handler(BaseHTTPRequestHandler):
        server_version = "agent-monitor"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        # A request line the library cannot read leaves the version at its default; at HTTP/0.9 the
        # library writes an error body with no status line and no headers at all.
        default_request_version = "HTTP/1.0"
        # A client that sends or reads nothing for this long is let go (its socket times out):
        # a slow or stalled client holds a thread, never the server.
        timeout = CLIENT_TIMEOUT_SECONDS

        def _answer(self) -> None:
            port_now = self.server.server_address[1]
            allowed = {f"127.0.0.1:{port_now}", f"localhost:{port_now}"}
            host = (self.headers.get("Host") or "").strip().lower()
            split = urlsplit(self.path)
            # A body this handler does not read would be read as the next request on the
            # connection (an attack: a POST hidden in the body of a request answered 421 or 405
            # ran, with the Host and Origin it wrote itself). Such a connection is closed after
            # the answer; a body in chunks is never read.
            chunked = self.headers.get("Transfer-Encoding") is not None
            sent = (self.headers.get("Content-Length") or "").strip()
            unread = chunked or sent not in ("", "0")
            if chunked:
                response = monitor.error_response(411, "Transfer-Encoding is not taken: send Content-Length",
                                                  False, None, 0)
            elif host not in allowed:
                # DNS rebinding: a page of another site whose name now points here would reach
                # the monitor with its own name as Host. Only the loopback names are served.
                response = monitor.error_response(421, f"Host {host!r} is not served: open http://127.0.0.1:{port_now}/",
                                          False, None, 0)
                if self.command == "HEAD":
                    response.headers["Content-Length"] = str(len(response.body))
                    response.body = b""
            else:
                # X-MS-CLIENT-PRINCIPAL* are ignored here: locally nobody signs in, and a header
                # a client sets itself proves nothing. The session is the cookie this server set
                # (shared/web/actions.py); the one who acts is the user who started the server.
                body = b""
                if self.command == "POST":
                    length = self.headers.get("Content-Length") or "0"
                    if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
                        self.close_connection = True
                        response = monitor.error_response(413, f"Content-Length {length!r}: expected at most "
                                                               f"{MAX_BODY_BYTES} bytes", False, None, 0)
                        response.headers["Connection"] = "close"
                        self._send(response)
                        return
                    body = self.rfile.read(int(length))
                    unread = False
                caller = Caller(name=user if operator else None, operator=operator,
                                client=f"monitor on 127.0.0.1:{port_now} ({socket.gethostname()})",
                                session=session_from_cookies(self.headers.get("Cookie"), False),
                                origin=self.headers.get("Origin"), own_origin=own_origin("http", host),
                                owner=user if operator else None)
                response = monitor.handle(self.command, split.path, split.query, self.headers.get("Accept", ""),
                                          caller=caller, body=body, content_type=self.headers.get("Content-Type"))
            if unread or host not in allowed:
                self.close_connection = True
                response.headers["Connection"] = "close"
            self._send(response)

        def _send(self, response: Response) -> None:
            self.send_response(response.status)
            for name, value in response.all_headers().items():
                self.send_header(name, value)
            if "Content-Length" not in response.headers:
                self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if response.body:
                self.wfile.write(response.body)

        def __getattr__(self, name: str):
            # Every method, known to the standard library or not (TRACE, CONNECT, PROPFIND, FOO),
            # reaches the monitor's own handler: 405 with Allow and the security headers, never
            # the library's bare 501 page.
            if name.startswith("do_"):
                return self._answer
            raise AttributeError(name)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            # The library's own refusals (414 URI too long, 400 bad request line, 431 headers too
            # large, 505 version) answered as the monitor answers: its page and security headers.
            short, _ = self.responses.get(code, ("Error", ""))
            response = monitor.error_response(code, message or short, False, None, 0)
            self.close_connection = True
            response.headers["Connection"] = "close"
            if getattr(self, "command", None) == "HEAD" or code < 200 or code in (204, 304):
                response.headers["Content-Length"] = str(len(response.body))
                response.body = b""
            try:
                self._send(response)
            except OSError:
                pass  # the client is gone

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            pass  # no access log: the runner logs beside it

        def log_message(self, format: str, *args: Any) -> None:
            # The library's own notes (a malformed request, a request that timed out): a log
            # record like any other, never a line of the library's format on stderr.
            log.info("monitor: %s: %s", self.address_string(), format % args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # The standard library listens with a backlog of 5: a burst of 64 browsers' requests waited
        # in SYN retries for up to 28 s. A thread serves each connection; the store pool bounds
        # the database connections they share.
        request_queue_size = 128

        def server_close(self) -> None:
            super().server_close()
            pool.close()

        def handle_error(self, request: Any, client_address: Any) -> None:
            # The library prints a traceback to stderr here. A client that went away mid-answer
            # (it closed or reset the connection, or stalled past the timeout) is no error of the
            # monitor's: one INFO record. Anything else: one ERROR record, its traceback --json's.
            exc = sys.exc_info()[1]
            client = client_address[0] if isinstance(client_address, tuple) else client_address
            if isinstance(exc, CLIENT_GONE):
                log.info("monitor: client %s went away (%s)", client, type(exc).__name__)
            else:
                log.error("monitor: a request from %s failed", client, exc_info=True)

    server = Server(("127.0.0.1", port), Handler)
    server.store_pool = pool
    return server
