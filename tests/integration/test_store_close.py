"""A store closed from another thread while its statement runs (the process ends while a worker
is still in a statement): the close waits for the statement, which ends normally. Closing the
connection under it crashed the sqlite3 module (a segmentation fault, seen as `run` exiting -11
on Ctrl-C)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.harness import ROOT

SCRIPT = textwrap.dedent("""
    import sqlite3, sys, threading, time
    from shared.control.db import parse_database_url
    from shared.control.store import Store

    path = sys.argv[1]
    store = Store(parse_database_url("sqlite:///" + path),
                  connect=lambda: sqlite3.connect(path, check_same_thread=False))
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) "
            "SELECT count(*) FROM n")
    output, ended = [], []

    def work():
        try:
            with store.transaction(immediate=False):
                store.run_script(slow, output)
            ended.append("committed")
        except Exception as exc:    # the commit meets the closed connection: an error, no crash
            ended.append(type(exc).__name__)

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 10
    while store._active_cursor is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert store._active_cursor is not None, "the statement never started"
    store.close()                   # from the main thread, under the running statement
    assert store.connected, "closed under a running statement"
    worker.join(60)
    assert not worker.is_alive()
    assert not store.connected, "the deferred close did not happen when the statement ended"
    assert ended == ["ProgrammingError"], ended
    print("ok", output, ended)
""")


def test_a_close_from_another_thread_waits_for_the_running_statement(tmp_path):
    completed = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "x.db")], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, (completed.returncode, completed.stderr[-2000:])
    assert completed.stdout.startswith("ok"), completed.stdout
