"""Lint as part of the test command: ruff's checks and the import contracts of pyproject.toml
(what the job model, the engine and the front ends may import), with the pinned tools of
requirements-dev.txt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    result = _run([sys.executable, "-m", "ruff", "check", "--no-cache", "."])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_import_contracts_are_kept():
    result = _run([str(BIN / "lint-imports"), "--no-cache"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and "kept" in result.stdout
