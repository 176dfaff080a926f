"""Faults for the chaos scenarios: a TCP hop in front of PostgreSQL that can refuse new
connections and cut the open ones (a database outage, as the agent sees it), worker processes
to kill with SIGKILL, and the reconciliation every scenario ends with."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.harness import ROOT, query

UPSTREAM = ("127.0.0.1", 5432)


class OutageProxy:
    """Forwards 127.0.0.1:<port> to PostgreSQL. ``outage()`` stops accepting (connections are
    refused) and terminates every open connection; ``restore()`` accepts again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener: socket.socket | None = None
        self.port = _free_port()
        self._stopping = False
        self.restore()

    def connection_string(self, database: str) -> str:
        return (f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={self.port};Uid=root;"
                f"Database={database};")

    def restore(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def outage(self) -> None:
        """Connections refused from now on, and the open ones terminated."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, []
        if listener is not None:
            listener.close()
        for client, upstream in pairs:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self._stopping = True
        self.outage()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(UPSTREAM, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pump(client: socket.socket, upstream: socket.socket) -> None:
        sockets = [client, upstream]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (upstream if sock is client else client).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in sockets:
                try:
                    sock.close()
                except OSError:
                    pass


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_", "AzureWebJobsStorage"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def start_cli(db: str, *args: str, env: dict[str, str] | None = None, log=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", db, *args], cwd=ROOT,
                            env=env or clean_env(), stdout=log or subprocess.DEVNULL,
                            stderr=log or subprocess.DEVNULL)


def kill9(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s")


@dataclass
class Reconciliation:
    runs_by_status: dict[str, int]
    doubled_slots: list[tuple]
    stuck: list[dict[str, Any]]
    lost: list[str] = field(default_factory=list)        # labels whose work never happened
    doubled: list[str] = field(default_factory=list)     # labels whose work happened twice
    unfinished: list[str] = field(default_factory=list)  # labels whose run is not succeeded

    def assert_clean(self) -> None:
        assert not self.doubled_slots, f"two runs for one slot: {self.doubled_slots}"
        assert not self.doubled, f"work done twice: {self.doubled}"
        assert not self.lost, f"work lost: {self.lost}"
        assert not self.unfinished, f"runs not succeeded: {self.unfinished} ({self.runs_by_status})"
        assert not self.stuck, f"stuck runs: {self.stuck}"


def effect_sql(label: str, before: str = "") -> str:
    """A job's SQL that records its one effect, in the control database (exactly once per
    succeeded run: the effect commits with the completion, or not at all)."""
    return f"{before}INSERT INTO effects (label, at) VALUES ('{label}', clock_timestamp())"


def reconcile(agent, labels: dict[str, int]) -> Reconciliation:
    """For each label (a task's work) and its run id: runs per slot, effects per run, stuck runs,
    straight from the tables."""
    from datetime import datetime, timezone

    from shared.engine.views import stuck_view

    statuses = dict(query(agent, "SELECT status, COUNT(*) FROM agent.runs GROUP BY status"))
    doubled_slots = query(agent, "SELECT job_name, scheduled_for, COUNT(*) FROM agent.runs WHERE job_name IS NOT NULL "
                                 "GROUP BY job_name, scheduled_for HAVING COUNT(*) > 1")
    effects = dict(query(agent, "SELECT label, COUNT(*) FROM effects GROUP BY label"))
    status_of = dict(query(agent, "SELECT run_id, status FROM agent.runs"))
    now = datetime.now(timezone.utc)
    stuck = stuck_view(agent.store(), now, older_than=120)
    return Reconciliation(
        runs_by_status=statuses, doubled_slots=doubled_slots, stuck=stuck,
        lost=[label for label in labels if effects.get(label, 0) == 0],
        doubled=[label for label in labels if effects.get(label, 0) > 1],
        unfinished=[label for label, run_id in labels.items() if status_of.get(run_id) != "succeeded"])
