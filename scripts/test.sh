#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone: creates .venv, installs the pinned
# packages, installs Azurite (npm, pinned by package-lock.json) and Checkov (its own
# virtual environment, so it cannot disturb the app's requirements), then runs pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh -k poison, or one kind of test: scripts/test.sh tests/unit
# Needs Python 3.10-3.13 (python3.11 preferred); PYTHON=/path/to/python3.11 picks another one.
# scripts/test-313.sh runs the unit tests and the worker-indexing test on Python 3.13 as well.
set -euo pipefail
script=$0
cd "$(dirname "$0")/.."
. scripts/python-env.sh

require_venv_python "$script" .venv
if [ ! -x .venv/bin/python ]; then
  require_python "$script"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
# The sql-agent command (.venv/bin/sql-agent) running this clone's code: an editable install of
# pyproject.toml, its dependencies being the pinned ones just installed.
install_cli .venv

# The wheels of everything `pip install .` installs (and its build backend), for
# tests/repo/test_cli_install.py, which builds a virtual environment from `pip install .` alone
# without reaching an index. Made again when the pins or the interpreter change; pip's cache
# makes that quick.
wheelhouse_key="$(cat pyproject.toml requirements.txt requirements-cli.txt | cksum | cut -d' ' -f1) $(python_version .venv/bin/python)"
if [ "$(cat .wheelhouse/KEY 2>/dev/null || true)" != "$wheelhouse_key" ]; then
  rm -rf .wheelhouse
  .venv/bin/python -m pip wheel -q --disable-pip-version-check -w .wheelhouse \
    -r requirements.txt -r requirements-cli.txt "$(grep -o 'setuptools==[0-9.]*' pyproject.toml)"
  echo "$wheelhouse_key" > .wheelhouse/KEY
fi

if [ -f package.json ]; then
  if command -v npm >/dev/null 2>&1; then
    if [ ! -x node_modules/.bin/azurite-queue ]; then
      npm ci --silent --no-audit --no-fund
    fi
  else
    echo "note: npm not found; Azurite tests will be skipped (CI=true makes them fail)" >&2
  fi
fi

if [ -f requirements-checkov.txt ]; then
  if [ ! -x .checkov-venv/bin/checkov ]; then
    require_python "$script"
    "$PYTHON" -m venv .checkov-venv
  fi
  .checkov-venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-checkov.txt
fi

exec .venv/bin/python -m pytest "$@"
