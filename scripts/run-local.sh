#!/usr/bin/env bash
# Runs the agent locally on the embedded default (SQLite file + a queue table in it), with
# the sample jobs of local.settings.example.json. Creates .venv and installs the pinned
# packages on first use. Ctrl-C stops it. Extra arguments go to `run`, e.g. --concurrency 2.
#   AGENT_DB=...             another control database (e.g. PostgreSQL ODBC string)
#   SETTINGS=path.json       another settings file (default local.settings.example.json)
#   PYTHON=/path/to/python3.11  the Python that creates .venv (3.10-3.12; python3.11 preferred)
set -euo pipefail
script=$0
cd "$(dirname "$0")/.."
. scripts/python-env.sh

require_venv_python "$script" .venv
if [ ! -x .venv/bin/python ]; then
  require_python "$script"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt

SETTINGS=${SETTINGS:-local.settings.example.json}
.venv/bin/python -m shared.cli --settings "$SETTINGS" init-db
exec .venv/bin/python -m shared.cli --settings "$SETTINGS" run "$@"
