#!/usr/bin/env bash
# The second Python of the test suite: runs the unit tests and the worker-indexing test
# (tests/integration/test_indexing.py: function_app.py indexed by azure-functions-runtime, the
# library Azure's Python 3.13 worker loads the app with) on Python 3.13, in its own virtual
# environment, .venv313, with azure-functions 2.x (requirements.txt's markers choose it there).
# scripts/test.sh runs the whole suite on the default Python; .ci/run runs both.
# Extra arguments go to pytest. PYTHON313=/path/to/python3.13 picks the interpreter.
set -euo pipefail
script=$0
cd "$(dirname "$0")/.."
. scripts/python-env.sh

if [ -e .venv313/bin/python ] && [ "$(python_version .venv313/bin/python || true)" != 3.13 ]; then
  echo "$script: .venv313 was not made with Python 3.13; remove it (rm -rf .venv313) and run again" >&2
  exit 2
fi
if [ ! -x .venv313/bin/python ]; then
  require_python313 "$script"
  "$PYTHON313" -m venv .venv313
fi
.venv313/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
install_cli .venv313

exec .venv313/bin/python -m pytest tests/unit tests/integration/test_indexing.py "$@"
