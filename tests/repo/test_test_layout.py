"""The tests stay sorted by kind (tests/conftest.py says which needs what): every test module is
in tests/unit, tests/integration, tests/e2e or tests/repo, none in tests/ itself or in
tests/support (helpers, which pytest must not collect), and a unit test asks for no service:
no control database, Azurite or agent fixture, and none of the helpers that build them."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
KINDS = ("unit", "integration", "e2e", "repo")
# What a test needs a service for: the fixtures of tests/conftest.py and tests/support/azurite.py.
SERVICE_FIXTURES = {"db_url", "pg_url", "agent_factory", "azurite", "azurite_server", "azurite_https"}
# The helper modules that reach a database or start Azurite.
SERVICE_HELPERS = {"tests.support.harness", "tests.support.azurite", "tests.support.faults", "tests.support.tsql_caller",
                   "tests.support.monitor_scenario"}


def test_every_test_module_is_in_a_kind():
    misplaced = sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py")
                       if path.relative_to(TESTS).parts[0] not in KINDS)
    assert not misplaced, (f"test modules outside tests/{{{','.join(KINDS)}}}: {misplaced} (move each to the kind "
                           "its heaviest test belongs to; helpers go to tests/support without a test_ prefix)")
    for kind in KINDS + ("support",):
        assert (TESTS / kind / "__init__.py").is_file(), f"tests/{kind}/__init__.py is missing"


def _needs(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [f"{node.name}({arg.arg})" for arg in arguments if arg.arg in SERVICE_FIXTURES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in SERVICE_HELPERS:
                found.append(f"import {node.module}")
            if node.module == "tests.support":
                found += [f"import tests.support.{a.name}" for a in node.names if f"tests.support.{a.name}" in SERVICE_HELPERS]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in SERVICE_HELPERS]
    return found


def test_unit_tests_need_no_service():
    modules = sorted((TESTS / "unit").rglob("test_*.py"))
    assert modules
    needing = {str(path.relative_to(TESTS)): needs for path in modules if (needs := _needs(path))}
    assert not needing, f"unit tests that need a service (move them to tests/integration): {needing}"


def test_the_service_check_sees_a_service(tmp_path):
    """The check above on modules that do need one (so that it can fail)."""
    module = tmp_path / "test_x.py"
    module.write_text("from tests.support import harness\nfrom tests.support.azurite import azurite\n\n"
                      "def test_a(db_url):\n    pass\n\n\ndef test_b(tmp_path, *, pg_url):\n    pass\n", encoding="utf-8")
    assert sorted(_needs(module)) == ["import tests.support.azurite", "import tests.support.harness", "test_a(db_url)",
                                      "test_b(pg_url)"]
