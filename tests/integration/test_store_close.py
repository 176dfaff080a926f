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



def test_at_interpreter_exit_a_dropped_store_never_waits_for_the_pool(tmp_path, monkeypatch):
    """A store still holding a pooled connection when the process ends gives it back in __del__.
    At interpreter exit the daemon threads are frozen where they stand: the pool's reaper, woken
    by a first discard, froze holding the pool's lock, and the next store's discard waited for it
    forever (`init-db` hung at exit: one process in six of test_concurrent_first_init_db_runs_all_
    succeed, stack "Garbage-collecting / Store.__del__ / pool.discard"). While the interpreter
    exits, the store leaves its connection to the process's end instead."""
    import threading

    from tests.support.harness import make_agent

    agent = make_agent(f"sqlite:///{tmp_path / 'agent.db'}")
    store = agent.new_store()
    store.connection                                     # holds a pooled connection
    frozen, release = threading.Event(), threading.Event()

    def frozen_reaper() -> None:
        with agent.pool._cond:                           # the lock, held as the frozen reaper held it
            frozen.set()
            release.wait(30)

    holder = threading.Thread(target=frozen_reaper, daemon=True)
    holder.start()
    assert frozen.wait(10)
    monkeypatch.setattr("shared.control.store.sys.is_finalizing", lambda: True)
    dropped = threading.Thread(target=store.__del__, daemon=True)
    dropped.start()
    dropped.join(5)
    finished = not dropped.is_alive()
    release.set()
    holder.join(10)
    dropped.join(10)
    monkeypatch.undo()
    store.close()
    agent.close()
    assert finished, "a store dropped at interpreter exit waited for the pool's lock"
