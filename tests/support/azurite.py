"""Azurite (the official Azure Storage emulator, queue service only) for the tests.

Use it by importing both fixtures into a test module:

    from tests.support.azurite import azurite, azurite_server  # noqa: F401  (pytest fixtures)

    def test_something(azurite):
        queue = azurite.queue("runs")              # an AzureStorageQueue on a fresh queue name
        env = azurite.settings()                   # {"AzureWebJobsStorage": <connection string>}
        azurite.stop(); ...; azurite.start()       # same port, same data folder

One Azurite process serves the whole session (`azurite_server`); the function-scoped `azurite`
fixture makes sure it is running when a test starts (a test may have stopped it). Tests isolate
themselves by queue name (`azurite.unique_name()`), not by restarting Azurite.

Azurite comes from npm (package.json pins it; `npm ci` installs node_modules/.bin/azurite-queue).
When it cannot start, the tests skip on a developer machine and fail in CI (env CI=true).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pytest

if TYPE_CHECKING:  # pragma: no cover - typing only
    from shared.messaging.azure_storage import AzureStorageQueue

REPO = Path(__file__).resolve().parents[2]
AZURITE_QUEUE_BIN = REPO / "node_modules" / ".bin" / "azurite-queue"
ENABLE_HINT = "run `npm ci` (needs Node.js 18+) to enable the Azurite tests"
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0


class AzuriteUnavailable(Exception):
    """Azurite could not be started; the message says why."""


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved in the parent: the child only makes one plain call
_PR_SET_PDEATHSIG = 1


def _terminate_with_parent() -> None:
    """Runs in the child between fork and exec: ask Linux for SIGTERM when pytest exits."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Azurite:
    """A running azurite-queue on 127.0.0.1:`port`, persisting to `location`."""

    port: int
    location: Path
    log_path: Path
    # HTTPS with OAuth (bearer tokens), for identity-based connections: PEM paths of a
    # certificate for 127.0.0.1 and its key. Azurite only accepts bearer tokens over HTTPS.
    cert_path: Path | None = None
    key_path: Path | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _queues: list["AzureStorageQueue"] = field(default_factory=list, repr=False)

    @property
    def queue_endpoint(self) -> str:
        scheme = "https" if self.cert_path else "http"
        return f"{scheme}://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        scheme = "https" if self.cert_path else "http"
        return (
            f"DefaultEndpointsProtocol={scheme};AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"QueueEndpoint={self.queue_endpoint};"
        )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def settings(self) -> dict[str, str]:
        """App settings that point the app at this Azurite (merge into the test's environment)."""
        return {"AzureWebJobsStorage": self.connection_string}

    @staticmethod
    def unique_name(prefix: str = "q") -> str:
        """A queue name no other test uses (short enough for the "-poison" companion)."""
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    def queue(self, name: str | None = None, encoding: str = "base64",
              create: bool = True) -> "AzureStorageQueue":
        """An AzureStorageQueue on this Azurite, built from settings as the engine builds it."""
        from shared.messaging.azure_storage import AzureStorageQueue

        adapter = AzureStorageQueue.from_settings(
            self.connection_string, None, None, name or self.unique_name(), encoding
        )
        if create:
            adapter.ensure_exists()
        self._queues.append(adapter)
        return adapter

    def start(self) -> None:
        """Start Azurite (again) on the same port and data folder; wait until it accepts connections."""
        if self.running:
            return
        if not AZURITE_QUEUE_BIN.exists():
            raise AzuriteUnavailable(f"{AZURITE_QUEUE_BIN.relative_to(REPO)} is missing")
        if shutil.which("node") is None:
            raise AzuriteUnavailable("`node` is not on PATH")
        self.location.mkdir(parents=True, exist_ok=True)
        command = [
            str(AZURITE_QUEUE_BIN),
            "--queueHost", "127.0.0.1",
            "--queuePort", str(self.port),
            "--location", str(self.location),
            "--silent",
            # The SDK may speak a newer REST API version than this Azurite knows.
            "--skipApiVersionCheck",
            # Ignore headers Azurite does not implement instead of failing the request.
            "--loose",
            "--disableTelemetry",
        ]
        if self.cert_path and self.key_path:
            command += ["--cert", str(self.cert_path), "--key", str(self.key_path), "--oauth", "basic"]
        log = self.log_path.open("ab")
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.location),
                # Same process group as pytest (a Ctrl-C or `timeout` reaches Azurite too), and on
                # Linux a SIGTERM when pytest dies without teardown: no orphaned emulators.
                preexec_fn=_terminate_with_parent,
            )
        except OSError as error:
            raise AzuriteUnavailable(f"cannot run {AZURITE_QUEUE_BIN.name}: {error}") from error
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise AzuriteUnavailable(f"azurite-queue exited with code {code}: {self._log_tail()}")
            if _accepts_connections(self.port):
                return
            time.sleep(0.1)
        self.stop()
        raise AzuriteUnavailable(
            f"azurite-queue did not listen on 127.0.0.1:{self.port} within "
            f"{START_TIMEOUT_SECONDS:.0f} s: {self._log_tail()}"
        )

    def stop(self) -> None:
        """Stop Azurite gracefully (SIGTERM lets it write its metadata); its data folder stays."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        # Wait until the port is really closed, so a test sees "service down" right away.
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while _accepts_connections(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        for adapter in self._queues:
            adapter.close()
        self._queues.clear()
        self.stop()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return "(no log)"
        return " | ".join(text.splitlines()[-lines:]) or "(empty log)"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Azurite is required in CI but could not be started: {reason}", pytrace=False)
    pytest.skip(f"{ENABLE_HINT} ({reason})")


@contextlib.contextmanager
def launched_azurite(cert_path: Path | None = None, key_path: Path | None = None) -> Iterator[Azurite]:
    """Start an Azurite of our own (free port, temporary data folder) for a fixture; stop and
    remove it afterwards. Skips (developer machine) or fails (CI) when it cannot start."""
    workdir = Path(tempfile.mkdtemp(prefix="azurite-"))
    server = Azurite(port=free_loopback_port(), location=workdir / "data",
                     log_path=workdir / "azurite.log", cert_path=cert_path, key_path=key_path)
    try:
        try:
            server.start()
        except AzuriteUnavailable as error:
            _unavailable(str(error))
        yield server
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Azurite]:
    """One Azurite for the session, on a free loopback port with a temporary data folder."""
    with launched_azurite() as server:
        yield server


@pytest.fixture
def azurite(azurite_server: Azurite) -> Iterator[Azurite]:
    """The session's Azurite, running when the test starts (restarted if a test stopped it)."""
    try:
        azurite_server.start()
    except AzuriteUnavailable as error:
        _unavailable(str(error))
    yield azurite_server
