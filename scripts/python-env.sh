# Sourced by scripts/test.sh, scripts/test-313.sh and scripts/run-local.sh (not run on its own):
# picks the Python that creates the project's virtual environments, and stops with one line when
# none fits, instead of letting pip fail half-way through the requirements.
#
# Python 3.10 to 3.13: requirements.txt installs azure-functions 1.26 below 3.13 (it declares
# Requires-Python <3.13) and azure-functions 2.x from 3.13 (>=3.13). pyproject.toml's
# requires-python and classifiers, and infra/functionapp.bicep's pythonVersion (@allowed, and its
# default: the newest that Flex Consumption runs), say the same; tests/repo/test_python_versions.py
# checks they agree. PYTHON=/path/to/python3.11 picks the interpreter; without it the first of
# python3.11, python3.12, python3.13, python3.10 and python3 on the PATH whose version fits is used
# (3.11 first: the version the whole suite is run on; scripts/test-313.sh runs the unit tests and
# the worker-indexing test on 3.13 as well).

SUPPORTED_PYTHONS="3.10, 3.11, 3.12 or 3.13"
WHY_THESE_PYTHONS="azure-functions installs on these only: 1.26 on 3.10-3.12, 2.x on 3.13"

# The "major.minor" of interpreter $1, or nothing (and a failure) when it does not run.
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

is_supported_python() {
  case "$1" in
    3.10 | 3.11 | 3.12 | 3.13) return 0 ;;
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
    echo "$script: needs Python $SUPPORTED_PYTHONS ($WHY_THESE_PYTHONS), but $found; point PYTHON at one: PYTHON=/path/to/python3.11 $script" >&2
    exit 2
  fi
  for candidate in python3.11 python3.12 python3.13 python3.10 python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    version=$(python_version "$candidate") || continue   # e.g. a pyenv shim for a version not installed
    if is_supported_python "$version"; then
      PYTHON=$candidate
      return 0
    fi
    found="${found:+$found, }$candidate is $version"
  done
  echo "$script: needs Python $SUPPORTED_PYTHONS ($WHY_THESE_PYTHONS), but ${found:-no python3 is on the PATH}; install Python 3.11 and run PYTHON=/path/to/python3.11 $script" >&2
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

# Sets PYTHON313 to a Python 3.13 interpreter (for scripts/test-313.sh), or exits 2 with one line:
# PYTHON313=/path/to/python3.13 first, then python3.13 on the PATH, then pyenv's 3.13 builds.
# Debian 12 packages no Python 3.13 (Debian 13 does: apt-get install python3.13-venv); pyenv
# (pyenv install 3.13) or the python.org installers give one anywhere. $1: the script's name.
require_python313() {
  local script=$1 candidate version found=""
  if [ -n "${PYTHON313:-}" ]; then
    version=$(python_version "$PYTHON313") || version=""
    [ "$version" = 3.13 ] && return 0
    found="PYTHON313=$PYTHON313 does not run"
    [ -z "$version" ] || found="PYTHON313=$PYTHON313 is $version"
  else
    for candidate in python3.13 "$HOME"/.pyenv/versions/3.13*/bin/python3.13; do
      version=$(python_version "$candidate") || continue   # not on the PATH, or a glob that matched nothing
      if [ "$version" = 3.13 ]; then
        PYTHON313=$candidate
        return 0
      fi
      found="${found:+$found, }$candidate is $version"
    done
  fi
  echo "$script: needs Python 3.13 (the unit tests and the worker-indexing test run on it: azure-functions 2.x and azure-functions-runtime install on 3.13 only), but ${found:-no python3.13 is on the PATH or in ~/.pyenv/versions}; install it (pyenv install 3.13, or Debian 13: apt-get install python3.13-venv) or run PYTHON313=/path/to/python3.13 $script" >&2
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
