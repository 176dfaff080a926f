"""A loopback stand-in for the Application Insights ingestion endpoint.

The real exporter (opencensus-ext-azure's transport, through shared.telemetry.client) posts to
``<IngestionEndpoint>/v2.1/track``; pointing the connection string's IngestionEndpoint at this
server lets tests assert on exactly what was sent. The server decodes bodies the way ingestion
accepts them (a JSON array, one JSON object, or JSON lines; optionally gzip), checks each
envelope's required fields, answers like ingestion (``itemsReceived``/``itemsAccepted``/
``errors``) and records everything *before* answering, so after ``telemetry.flush()`` returns
the envelopes are already here.

Usage in a test module::

    from tests.support.appinsights_endpoint import appinsights_endpoint  # noqa: F401 (fixture)

    def test_x(appinsights_endpoint):
        telemetry = appinsights_endpoint.telemetry()       # per-test local storage
        telemetry.event("RunStarted", {"job": "nightly"})
        telemetry.flush()
        assert appinsights_endpoint.events("RunStarted")

For engine code that reads APPLICATIONINSIGHTS_CONNECTION_STRING, set it to
``appinsights_endpoint.connection_string``: each endpoint has its own random instrumentation
key, so the exporter's default local-storage folder (keyed by it) is never shared between tests;
it is removed when the endpoint closes.
"""

from __future__ import annotations

import dataclasses
import gzip
import http.server
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_DURATION = re.compile(r"^\d+\.\d{2}:\d{2}:\d{2}\.\d{3,7}$")
TRACK_PATHS = ("/v2.1/track", "/v2/track")


@dataclasses.dataclass(frozen=True)
class ReceivedPost:
    path: str
    headers: dict[str, str]
    envelopes: tuple[dict, ...]
    status: int


def envelope_problems(envelope: Any) -> list[str]:
    """What ingestion would reject in one envelope (the fields the Breeze schema requires)."""
    if not isinstance(envelope, dict):
        return ["envelope is not a JSON object"]
    problems = []
    for field in ("name", "time", "iKey"):
        if not isinstance(envelope.get(field), str) or not envelope.get(field):
            problems.append(f"missing {field}")
    data = envelope.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("baseData"), dict) \
            or not isinstance(data.get("baseType"), str):
        return problems + ["missing data.baseType/baseData"]
    base, kind = data["baseData"], data["baseType"]
    if not isinstance(base.get("ver"), int):
        problems.append("missing baseData.ver")
    if kind == "EventData":
        if not base.get("name"):
            problems.append("EventData without name")
    elif kind == "MetricData":
        metrics = base.get("metrics")
        if not metrics or not all(isinstance(m.get("name"), str) and isinstance(m.get("value"), (int, float))
                                  for m in metrics):
            problems.append("MetricData without metrics[].name/value")
    elif kind == "RemoteDependencyData":
        if not base.get("name"):
            problems.append("RemoteDependencyData without name")
        if not isinstance(base.get("duration"), str) or not _DURATION.match(base["duration"]):
            problems.append(f"RemoteDependencyData duration {base.get('duration')!r} is not d.hh:mm:ss.fff")
    tags = envelope.get("tags") or {}
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        problems.append("tags must map to strings")
    for section in ("properties",):
        props = base.get(section)
        if props is not None and (not isinstance(props, dict)
                                  or not all(isinstance(v, str) for v in props.values())):
            problems.append(f"baseData.{section} values must be strings")
    return problems


def decode_body(body: bytes, content_encoding: str | None) -> list[Any]:
    """A track request body as a list of items: gzip or not; JSON array, object or lines."""
    if (content_encoding or "").lower() == "gzip" or body[:2] == b"\x1f\x8b":
        body = gzip.decompress(body)
    text = body.decode("utf-8").strip()
    if not text:
        return []
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return parsed if isinstance(parsed, list) else [parsed]


class AppInsightsEndpoint:
    """An HTTP server on 127.0.0.1:<free port> that records what the exporter posts."""

    def __init__(self, *, tls: bool = False) -> None:
        self.instrumentation_key = str(uuid.uuid4())
        self.tls = tls
        self.ca_file: str | None = None  # with tls: the self-signed certificate to trust
        self.posts: list[ReceivedPost] = []
        self.rejected: list[tuple[str, list[str]]] = []
        self._lock = threading.Lock()
        self._statuses: list[int] = []  # answers queued by respond_with()
        self._telemetries: list[Any] = []
        # The exporter telemetry() creates ("opentelemetry" or "opencensus"); None: the
        # default (AGENT_TELEMETRY_EXPORTER, else OpenTelemetry).
        self.exporter: str | None = None
        self._tmp = tempfile.mkdtemp(prefix="appinsights-endpoint-")
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                endpoint._handle(self, raw)

            def log_message(self, *args: object) -> None:
                pass  # keep test output clean

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            import ssl

            cert, key = self_signed_certificate(self._tmp)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.ca_file = cert
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        # A short poll interval keeps close() (shutdown waits for one poll) quick.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="appinsights-endpoint", daemon=True)
        self._thread.start()

    # -- what the exporter is given ------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/"

    @property
    def connection_string(self) -> str:
        return f"InstrumentationKey={self.instrumentation_key};IngestionEndpoint={self.url}"

    def telemetry(self, **options: Any) -> Any:
        """``create_telemetry`` for this endpoint, with local storage in a folder of this
        endpoint's own (closed with the endpoint)."""
        from shared.telemetry.factory import create_telemetry

        options.setdefault("storage_path", os.path.join(self._tmp, f"storage-{len(self._telemetries)}"))
        if self.exporter is not None:
            options.setdefault("exporter", self.exporter)
        telemetry = create_telemetry(self.connection_string, **options)
        self._telemetries.append(telemetry)
        return telemetry

    # -- what it sent --------------------------------------------------------------

    @property
    def envelopes(self) -> list[dict]:
        with self._lock:
            return [e for post in self.posts if post.status == 200 for e in post.envelopes]

    def of_type(self, base_type: str, name: str | None = None) -> list[dict]:
        found = [e for e in self.envelopes if e["data"]["baseType"] == base_type]
        if name is None:
            return found
        if base_type == "MetricData":
            return [e for e in found if e["data"]["baseData"]["metrics"][0]["name"] == name]
        return [e for e in found if e["data"]["baseData"].get("name") == name]

    def events(self, name: str | None = None) -> list[dict]:
        return self.of_type("EventData", name)

    def metrics(self, name: str | None = None) -> list[dict]:
        return self.of_type("MetricData", name)

    def dependencies(self, name: str | None = None) -> list[dict]:
        return self.of_type("RemoteDependencyData", name)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    def clear(self) -> None:
        with self._lock:
            self.posts.clear()
            self.rejected.clear()

    # -- how it answers ------------------------------------------------------------

    def respond_with(self, *statuses: int) -> None:
        """Answer the next POSTs with these status codes (then 200 again), e.g. 503 to make
        the exporter keep the envelopes for a retry. The envelopes of a non-200 POST are
        recorded in ``posts`` but not counted in ``envelopes``."""
        with self._lock:
            self._statuses.extend(statuses)

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, raw: bytes) -> None:
        path = handler.path
        headers = {k.lower(): v for k, v in handler.headers.items()}
        if path not in TRACK_PATHS:
            self._answer(handler, 404, {"error": f"no such path {path}; expected one of {TRACK_PATHS}"})
            with self._lock:
                self.rejected.append((path, ["unexpected path"]))
            return
        try:
            items = decode_body(raw, headers.get("content-encoding"))
        except (ValueError, OSError) as exc:
            with self._lock:
                self.rejected.append((path, [f"undecodable body: {exc}"]))
            self._answer(handler, 400, {"error": "undecodable body"})
            return
        errors = []
        for index, item in enumerate(items):
            problems = envelope_problems(item)
            if not problems and item["iKey"] != self.instrumentation_key:
                problems = [f"iKey {item['iKey']} is not {self.instrumentation_key}"]
            if problems:
                errors.append({"index": index, "statusCode": 400, "message": "; ".join(problems)})
        with self._lock:
            status = self._statuses.pop(0) if self._statuses else 200
            if errors and status == 200:
                status = 206  # ingestion's answer when some items are invalid
                self.rejected.extend((path, [e["message"]]) for e in errors)
            self.posts.append(ReceivedPost(path=path, headers=headers, envelopes=tuple(items),
                                           status=status))
        accepted = len(items) - len(errors) if status in (200, 206) else 0
        self._answer(handler, status, {"itemsReceived": len(items), "itemsAccepted": accepted,
                                       "errors": errors})

    @staticmethod
    def _answer(handler: http.server.BaseHTTPRequestHandler, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def close(self) -> None:
        for telemetry in self._telemetries:
            telemetry.close()
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._tmp, ignore_errors=True)
        # The exporter's default storage folder for this endpoint's key (engine code that
        # takes the connection string from the environment uses it).
        from shared.telemetry.client import DEFAULT_STORAGE_DIR_NAME

        shutil.rmtree(os.path.join(tempfile.gettempdir(), DEFAULT_STORAGE_DIR_NAME,
                                   self.instrumentation_key), ignore_errors=True)


class SilentEndpoint:
    """Accepts TCP connections and never answers: ingestion that hangs. Tests that flush
    against it prove a flush is bounded by the exporter's timeout."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self.connections = 0
        self.instrumentation_key = str(uuid.uuid4())
        self._thread = threading.Thread(target=self._accept, name="silent-endpoint", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self._held.append(conn)

    @property
    def connection_string(self) -> str:
        return (f"InstrumentationKey={self.instrumentation_key};"
                f"IngestionEndpoint=http://127.0.0.1:{self.port}/")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self._held:
            conn.close()
        self._sock.close()


def self_signed_certificate(directory: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (and its key), valid for a day, as PEM files in directory."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cert_path, key_path


def unused_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def appinsights_endpoint() -> Iterator[AppInsightsEndpoint]:
    endpoint = AppInsightsEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.close()


@pytest.fixture
def silent_endpoint() -> Iterator[SilentEndpoint]:
    endpoint = SilentEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.close()
