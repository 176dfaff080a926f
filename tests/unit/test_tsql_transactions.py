"""The Store's T-SQL transactions on an autocommit connection (issue 35 item 3, migration 0023),
checked against a scripted driver connection: what is sent, in how many round trips, and what
a fence or an error leaves behind. (SQL Server cannot run here: tests/integration's conformance
runs on one, AGENT_TEST_MSSQL; this pins the Store's side of the protocol.)"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyodbc
import pytest

from shared.control.db import DatabaseTarget, TsqlConnection
from shared.control.store import TSQL_ROLLBACK, Store
from shared.errors import AgentError, LeaseLost

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


class ScriptedCursor:
    def __init__(self, connection: "ScriptedConnection") -> None:
        self.connection = connection
        self.results: list[tuple[list[str], list[tuple]]] = []
        self.description: Any = None
        self.rowcount = -1
        self._rows: list[tuple] = []

    def execute(self, sql: str, *params: Any) -> "ScriptedCursor":
        self.connection.sent.append(sql)
        answer = self.connection.answer(sql)
        if isinstance(answer, BaseException):
            raise answer
        self.results = list(answer)
        self._show()
        return self

    def _show(self) -> None:
        if self.results:
            columns, self._rows = self.results.pop(0)
            self.description = [(c, None, None, None, None, None, True) for c in columns]
        else:
            self.description, self._rows = None, []

    def fetchall(self) -> list[tuple]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> tuple | None:
        return self._rows.pop(0) if self._rows else None

    def nextset(self) -> bool:
        if not self.results:
            return False
        self._show()
        return True

    def close(self) -> None:
        pass


class ScriptedConnection:
    def __init__(self, answer: Any) -> None:
        self.sent: list[str] = []
        self.answer = answer
        self.autocommit = True

    def cursor(self) -> ScriptedCursor:
        return ScriptedCursor(self)

    def commit(self) -> None:
        raise AssertionError("an autocommit connection: the Store sends COMMIT TRANSACTION itself")

    def rollback(self) -> None:
        raise AssertionError("an autocommit connection: the Store sends ROLLBACK itself")

    def close(self) -> None:
        pass


def store_with(answer: Any) -> tuple[Store, ScriptedConnection]:
    raw = ScriptedConnection(answer)
    target = DatabaseTarget(dialect="mssql", location="Driver={FreeTDS};Server=scripted.invalid;Database=agent;",
                            display="scripted")
    connection = TsqlConnection(raw, (55, False, "dbo"))
    return Store(target, connect=lambda: connection), raw


FINISH = (["run_id"], [(7,)])
FOLLOW = (["run_id", "job_name", "followed_run_id", "operation_id", "status", "note"], [])
EMPTY_UNLOCKED = (["unlocked"], [])
EMPTY_ACTIVE = (["active"], [])


def completion(store: Store) -> list[Any]:
    return store.commit_with(("reset_session", {}), ("check_work_transaction", {"work_transaction": None}),
                             ("finish_run", {"run_id": 7, "token": 3, "now": NOW}),
                             ("start_follow_up_runs", {"now": NOW, "max_chain_jobs": 100}))


def test_a_claim_is_one_round_trip_and_no_commit():
    store, raw = store_with(lambda sql: [(["decision", "run_id"], [("start", 7)])])
    rows = store.execute("claim_runs", now=NOW, late_cutoff=NOW, batch=1, max_concurrency=8, worker="w").rows
    assert rows == [{"decision": "start", "run_id": 7}]
    assert raw.sent == ["EXEC agent.claim_runs ?, ?, ?, ?, ?;"]


def test_begin_rides_on_the_job_and_commit_on_the_completion():
    answers = {"job": []}

    def answer(sql: str) -> Any:
        if "agent.run_job" in sql:
            return answers["job"]
        return [EMPTY_UNLOCKED, EMPTY_ACTIVE, FINISH, FOLLOW]

    store, raw = store_with(answer)
    with store.transaction():
        store.run_script("SELECT 1")
        results = completion(store)
    assert raw.sent[0] == "BEGIN TRANSACTION;\nEXEC agent.run_job ?;"
    assert len(raw.sent) == 2, raw.sent            # the job, the completion: nothing after it
    assert raw.sent[1].startswith("SET LOCK_TIMEOUT 30000;") and raw.sent[1].endswith("\nCOMMIT TRANSACTION;")
    assert "EXEC agent.finish_run ?, ?, ?;" in raw.sent[1] and "BEGIN TRANSACTION" not in raw.sent[1]
    assert results[2].rows == [{"run_id": 7}] and results[3].rows == []


def test_a_fenced_completion_raises_lease_lost_and_rolls_back_never_commits():
    fenced = pyodbc.ProgrammingError("42000", "[42000] [FreeTDS][SQL Server]fenced: the run is no longer running "
                                              "with this token (50003) (SQLExecDirectW)")

    def answer(sql: str) -> Any:
        if "agent.finish_run" in sql:
            return fenced
        return []

    store, raw = store_with(answer)
    with pytest.raises(LeaseLost):
        with store.transaction():
            store.run_script("SELECT 1")
            completion(store)
    assert raw.sent[-1] == TSQL_ROLLBACK
    assert not any(sql.strip() == "COMMIT TRANSACTION;" for sql in raw.sent)


def test_a_transaction_with_nothing_sent_sends_no_commit():
    store, raw = store_with(lambda sql: [])
    with store.transaction():
        pass
    assert raw.sent == []


def test_a_chain_of_queries_not_counted_runs_one_batch_each_then_commits():
    store, raw = store_with(lambda sql: [])
    with store.transaction():
        store.chain(("close_fenced_attempt", {"run_id": 7, "token": 3, "now": NOW, "error_message": "x"}),
                    ("record_attempt_output", {"run_id": 7, "token": 3, "attempt": 1, "step_output": "o"}))
    assert raw.sent[0].startswith("BEGIN TRANSACTION;\n") and len(raw.sent) == 3
    assert raw.sent[-1] == "COMMIT TRANSACTION;"


def test_a_multi_statement_query_outside_a_transaction_is_one_round_trip_with_begin_and_commit():
    store, raw = store_with(lambda sql: [(["run_id"], [])])
    query = next(name for name, q in store.queries.items() if len(q.statements) > 1
                 and not q.parameters - {"now", "run_id", "token"} and "bootstrap" not in name
                 and "migration" not in name)
    store.execute(query, now=NOW, run_id=7, token=3)
    assert len(raw.sent) == 1
    assert raw.sent[0].startswith("BEGIN TRANSACTION;\n") and raw.sent[0].endswith("\nCOMMIT TRANSACTION;")


def test_a_completion_answered_with_another_count_of_result_sets_is_an_error():
    store, raw = store_with(lambda sql: [FINISH])
    with pytest.raises(AgentError, match="result sets"):
        with store.transaction():
            completion(store)
    assert raw.sent[-1] == TSQL_ROLLBACK
