# Sourced by scripts/test.sh and scripts/run-local.sh (not run on its own): picks the Python that
# creates the project's virtual environments, and stops with one line when none fits, instead of
# letting pip fail half-way through the requirements.
#
# azure-functions==1.26.0 (requirements.txt) declares Requires-Python >=3.10,<3.13: it installs on
# Python 3.10, 3.11 and 3.12 only (not 3.13 yet), and Azure runs the app on 3.11.
# pyproject.toml's requires-python says the same (tests/repo/test_packaging.py checks they agree). PYTHON=/path/to/python3.11 picks the interpreter; without it the
# first of python3.11, python3.12, python3.10 and python3 on the PATH whose version fits is used.

SUPPORTED_PYTHONS="3.10, 3.11 or 3.12"

# The "major.minor" of interpreter $1, or nothing (and a failure) when it does not run.
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

is_supported_python() {
  case "$1" in
    3.10 | 3.11 | 3.12) return 0 ;;
    *) return 1 ;;
  esac
}

# Sets PYTHON to a supported interpreter, or exits 2 with one line: what is needed, what was
# found, how to point the script at another one. $1: the script's name, for the message.
require_python() {
  local script=$1 found="" candidate version
  if [ -n "${PYTHON:-}" ]; then
    version=$(python_version "$PYTHON") || version=""
    if is_supported_python "$version"; then
      return 0
    fi
    found="PYTHON=$PYTHON does not run"
    [ -z "$version" ] || found="PYTHON=$PYTHON is $version"
    echo "$script: needs Python $SUPPORTED_PYTHONS (azure-functions==1.26.0 installs on no other; Azure runs 3.11), but $found; point PYTHON at one: PYTHON=/path/to/python3.11 $script" >&2
    exit 2
  fi
  for candidate in python3.11 python3.12 python3.10 python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    version=$(python_version "$candidate") || continue   # e.g. a pyenv shim for a version not installed
    if is_supported_python "$version"; then
      PYTHON=$candidate
      return 0
    fi
    found="${found:+$found, }$candidate is $version"
  done
  echo "$script: needs Python $SUPPORTED_PYTHONS (azure-functions==1.26.0 installs on no other; Azure runs 3.11), but ${found:-no python3 is on the PATH}; install Python 3.11 and run PYTHON=/path/to/python3.11 $script" >&2
  exit 2
}

# Stops with one line when the virtual environment $2 exists but was made with a Python outside
# the supported range (by an earlier run, or by hand). $1: the script's name, for the message.
require_venv_python() {
  local script=$1 venv=$2 version
  [ -e "$venv/bin/python" ] || return 0
  version=$(python_version "$venv/bin/python") || version=""
  if is_supported_python "$version"; then
    return 0
  fi
  local made="a Python that no longer runs"
  [ -z "$version" ] || made="Python $version"
  echo "$script: $venv was made with $made, but this project needs Python $SUPPORTED_PYTHONS; remove it (rm -rf $venv) and run again, with PYTHON=/path/to/python3.11 $script if python3.11 is not on the PATH" >&2
  exit 2
}

# Installs the sql-agent command ($1/bin/sql-agent) as an editable install of this clone
# (pyproject.toml; its dependencies are the pinned ones the caller installed first), unless the
# environment already has one of this very directory (asked with -I: the egg-info an editable
# install leaves here is not on the path): a virtual environment copied or shared
# from another clone is reinstalled, so sql-agent never runs another clone's code.
install_cli() {
  local venv=$1 here installed
  here="file://$(pwd -P)"
  installed=$("$venv/bin/python" -I -c '
import json, importlib.metadata as metadata
try:
    print(json.loads(metadata.distribution("sql-agent-azure").read_text("direct_url.json") or "{}").get("url", ""))
except metadata.PackageNotFoundError:
    pass' 2>/dev/null) || installed=""
  if [ "$installed" != "$here" ] || [ ! -x "$venv/bin/sql-agent" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
  fi
}
