#!/usr/bin/env bash
# Runs the agent locally on the embedded default (SQLite file + a queue table in it), with
# the sample jobs of local.settings.example.json, and the read-only Job Activity Monitor beside it
# (it prints its URL). Creates .venv and installs the pinned packages on first use. Ctrl-C stops
# both. Extra arguments go to `run`, e.g. --concurrency 2.
#   AGENT_DB=...             another control database (e.g. PostgreSQL ODBC string)
#   SETTINGS=path.json       another settings file (default local.settings.example.json)
#   PYTHON=/path/to/python3.11  the Python that creates .venv (3.10-3.13; python3.11 preferred)
#   MONITOR_PORT=8080        the monitor's port on 127.0.0.1 (0: any free port; off: no monitor)
set -euo pipefail
script=$0
cd "$(dirname "$0")/.."
. scripts/python-env.sh

require_venv_python "$script" .venv
if [ ! -x .venv/bin/python ]; then
  require_python "$script"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-cli.txt
# The sql-agent command (.venv/bin/sql-agent) running this clone's code: an editable install of
# pyproject.toml, its dependencies being the pinned ones just installed.
install_cli .venv

SETTINGS=${SETTINGS:-local.settings.example.json}
MONITOR_PORT=${MONITOR_PORT:-8080}
.venv/bin/sql-agent --settings "$SETTINGS" init-db
if [ "$MONITOR_PORT" != off ]; then
  # In the background: a non-interactive shell starts it ignoring Ctrl-C's SIGINT, so the runner
  # stops first (finishing its current runs), then this trap stops the monitor (SIGTERM).
  .venv/bin/sql-agent --settings "$SETTINGS" monitor --port "$MONITOR_PORT" &
  monitor_pid=$!
  trap 'kill "$monitor_pid" 2>/dev/null || true; wait "$monitor_pid" 2>/dev/null || true' EXIT
fi
.venv/bin/sql-agent --settings "$SETTINGS" run "$@"
