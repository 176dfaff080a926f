"""The front ends act through shared.engine.operations: the command line and the monitor run no statement,
chain or transaction of their own (issue 24). Read from the modules' syntax trees, so a comment or
a string naming `.execute(` is not a call, and an aliased or nested call is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT_ENDS = sorted(p.relative_to(ROOT).as_posix() for folder in ("cli", "web")
                    for p in (ROOT / "shared" / folder).glob("*.py"))
# What reaches the database directly: a store's named query, chain or transaction, or a DB-API cursor.
DATABASE_CALLS = frozenset({"execute", "executemany", "chain", "transaction"})


def database_calls(source: str) -> list[str]:
    """``line: .name(`` for every call of a DATABASE_CALLS attribute in ``source``."""
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in DATABASE_CALLS]
    return [f"{call.lineno}: .{call.func.attr}(" for call in sorted(calls, key=lambda call: call.lineno)]


@pytest.mark.parametrize("path", FRONT_ENDS)
def test_the_front_ends_run_no_statement_of_their_own(path):
    found = database_calls((ROOT / path).read_text(encoding="utf-8"))
    assert not found, f"{path} calls the database itself (move it into shared/engine/operations.py): {found}"


def test_the_check_sees_each_kind_of_call():
    # The check above fails on each of these (and on nothing in a comment or a string).
    source = '''
# store.execute("x") in a comment
text = "store.chain(...)"
def f(agent, store, connection):
    store.execute("get_run", run_id=1).one()
    agent.store().chain(("a", {}))
    with store.transaction():
        pass
    connection.cursor().execute("GRANT ...")
'''
    assert database_calls(source) == ["5: .execute(", "6: .chain(", "7: .transaction(", "9: .execute("]


def test_the_front_ends_import_the_operations_they_offer():
    imported = set()
    for path in (ROOT / "shared" / "cli").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and node.module == "shared.engine.operations" for alias in node.names}
    assert {"submit", "cancel", "stop", "requeue", "run_now", "pause_job", "resume_job"} <= imported
