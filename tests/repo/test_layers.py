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


def package_imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at the top or inside a function (a lazy import
    is still a dependency); ``if TYPE_CHECKING:`` blocks are types only and left out."""
    modules = {}
    for path in (ROOT / "shared").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
        found = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "shared":
                for alias in node.names:             # `from shared.control import azure_sql` names a module
                    found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in modules}
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    graph = package_imports()
    assert len(graph) > 40 and "shared.control.azure_sql" in graph["shared.control.db"]   # lazy ones count too
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
