"""The `sql-agent` command as `pip install .` / `pipx install .` gives it (pyproject.toml).

The wheel is built from a copy of the files pyproject.toml reads, offline (`pip wheel --no-deps
--no-build-isolation`: the project's setuptools, pinned in requirements-dev.txt as in the
build-system table). Then:

* the wheel holds every module of shared/, every SQL file (each dialect's queries and
  migrations) and the monitor's stylesheet, found in the working tree, not listed here;
* its entry point is `sql-agent = shared.cli:main`, its version the constant in
  shared/__init__.py, its dependencies exactly the pins of requirements.txt and
  requirements-cli.txt;
* installed into a fresh virtual environment (its dependencies seen through a .pth line to the
  project's .venv), the `sql-agent` script runs away from the clone: --version, init-db on a new
  SQLite database (the migrations come from the installed package) and the monitor's stylesheet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import shared
from tests.support.harness import ROOT

try:
    import tomllib
except ImportError:             # Python 3.10: setuptools carries the same parser
    from setuptools._vendor import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _pins(name: str) -> list[str]:
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith(("#", "-"))]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "requirements.txt", "requirements-cli.txt", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "shared", source / "shared", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "-q", "-w", str(dist), str(source)],
                           capture_output=True, text=True, timeout=180)
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = dist.glob("*.whl")
    return path


def test_the_build_backend_is_pinned_and_is_the_one_the_tests_build_with():
    requires = PYPROJECT["build-system"]["requires"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.]+", spec) for spec in requires), requires
    (setuptools,) = [spec for spec in requires if spec.startswith("setuptools==")]
    assert setuptools in _pins("requirements-dev.txt"), f"requirements-dev.txt should pin {setuptools} too"
    assert PYPROJECT["project"]["scripts"] == {"sql-agent": "shared.cli:main"}


def test_the_wheel_holds_every_module_sql_file_and_the_stylesheet(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = {p.relative_to(ROOT).as_posix() for pattern in ("*.py", "*.sql", "*.css")
                for p in (ROOT / "shared").rglob(pattern) if "__pycache__" not in p.parts}
    assert {"shared/web/monitor.css", "shared/control/sql/mssql.sql", "shared/control/sql/postgres.sql", "shared/control/sql/sqlite.sql"} <= expected
    assert any(name.startswith("shared/control/sql/migrations/sqlite/") for name in expected)
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {missing[:20]}"
    # Only the package: no tests, docs or the function app's own files.
    outside = sorted(name for name in names if not name.startswith(("shared/", "sql_agent_azure-")))
    assert not outside, outside


def test_the_wheel_metadata_entry_point_version_and_pins(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        info = next(name.split("/")[0] for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert re.search(r"^\[console_scripts\]\s*\nsql-agent = shared\.cli:main\s*$", entry_points, re.MULTILINE), \
        entry_points
    assert re.search(rf"^Version: {re.escape(shared.__version__)}$", metadata, re.MULTILINE), metadata[:500]
    assert wheel.name.startswith(f"sql_agent_azure-{shared.__version__}-")
    requires = sorted(line.split(": ", 1)[1].replace(" ", "") for line in metadata.splitlines()
                      if line.startswith("Requires-Dist: "))
    pins = sorted(pin.replace(" ", "") for pin in _pins("requirements.txt") + _pins("requirements-cli.txt"))
    assert requires == pins
    assert "shtab==" in " ".join(requires)


def test_the_installed_command_runs_away_from_the_clone(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The dependencies: the project's .venv, seen from the new environment through a .pth line.
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    command = venv / "bin" / "sql-agent"
    assert command.is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AGENT_", "JOB__", "PYTHONPATH"))}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(command), *args], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=120)

    version = run("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().startswith(f"sql-agent {shared.__version__} ")
    as_json = run("--version", "--json")
    assert json.loads(as_json.stdout)["version"] == shared.__version__

    database = tmp_path / "agent.db"
    init = run("--db", f"sqlite:///{database}", "--json", "init-db")
    assert init.returncode == 0, init.stderr
    document = json.loads(init.stdout)
    assert document["upgraded"] and document["schema_version"] >= 8, document
    where = subprocess.run([str(python), "-c", "import shared.web.app as m, shared; print(shared.__file__); "
                            "print(len(m.STYLESHEET.read_text()))"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    location, css_length = where.stdout.split()
    assert Path(location).is_relative_to(venv), location            # the installed copy, not the clone
    assert int(css_length) > 100
