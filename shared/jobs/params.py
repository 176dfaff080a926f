"""A job's parameters: declared with their defaults (JOB__<name>__PARAMS__<k>__DEFAULT, or
__REQUIRED=true for one without a default; agent.add_scheduled_job's @params), given when a run
is started (run-now --param k=v, agent.start_job's @params), recorded with the run (agent.runs.params,
JSON) and read by the job's SQL as BOUND values — never pasted into its text: a value is data,
whatever it holds.

How a job's SQL reads parameter ``k`` (shared/control/store.py binds them):

* T-SQL: ``@k`` — the command runs through ``sp_executesql @stmt, N'@k nvarchar(max), ...', @k = ?``;
* PostgreSQL: ``current_setting('agent.param.k')`` — set by ``set_config('agent.param.k', ?, true)``
  in the job's transaction, before its SQL (local: gone at its end);
* SQLite: ``@k`` (or ``:k``) — a named parameter of each statement, bound by sqlite3.

Names are identifiers (a letter or _, then letters, digits or _, at most 63 characters: what a
PostgreSQL setting's part may be), compared case-insensitively (T-SQL's variables and
PostgreSQL's settings are); not ``stmt`` or ``params``, sp_executesql's own parameters. Values
are text, at most MAX_VALUE_CHARS characters, without NUL (PostgreSQL's text cannot hold U+0000;
refused on every dialect so that a job behaves alike).

Pure: no database.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from shared.errors import AgentError
from shared.values import storable_problem

PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
MAX_PARAMS = 50
MAX_VALUE_CHARS = 1_000_000
NAME_EXPECTED = ("a parameter name: a letter or _, then letters, digits or _, at most 63 characters, not stmt or "
                 "params (sp_executesql's own)")
# sp_executesql's own parameters: a job parameter of that name would be given to it twice.
RESERVED_NAMES = frozenset({"stmt", "params"})


class ParamError(AgentError):
    """Parameters that cannot start a run: the message names the parameter, the value and what is
    expected. ``setting``, ``value``, ``expected`` as ConfigError's (the CLI's --json errors)."""

    def __init__(self, setting: str, value: object, expected: str) -> None:
        self.setting, self.value, self.expected = setting, value, expected
        shown = "<missing>" if value is None else repr(value)
        super().__init__(f"{setting}={shown}: expected {expected}")


def name_problem(name: str) -> str | None:
    return None if PARAM_NAME.match(name) and name.casefold() not in RESERVED_NAMES else NAME_EXPECTED


def value_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"text (found {type(value).__name__})"
    if len(value) > MAX_VALUE_CHARS:
        return f"at most {MAX_VALUE_CHARS} characters (found {len(value)})"
    problem = storable_problem(value)
    return f"text without NUL, valid UTF-8 (found {problem})" if problem else None


def check_declarations(declared: Mapping[str, Any], where: str) -> dict[str, str | None]:
    """Declarations ({name: default or None}) checked; raises ParamError naming ``where``."""
    if not isinstance(declared, Mapping):
        raise ParamError(where, declared, "a JSON object {name: default or null}")
    if len(declared) > MAX_PARAMS:
        raise ParamError(where, f"{len(declared)} parameters", f"at most {MAX_PARAMS} parameters")
    folded: dict[str, str] = {}
    for name, default in declared.items():
        if not isinstance(name, str) or name_problem(name):
            raise ParamError(where, name, NAME_EXPECTED)
        if name.casefold() in folded:
            raise ParamError(where, name, f"names that differ by more than letter case ({folded[name.casefold()]!r} "
                                          "too: T-SQL's variables and PostgreSQL's settings ignore case)")
        folded[name.casefold()] = name
        if default is not None and value_problem(default):
            raise ParamError(f"{where} {name}", default, f"a default that is {value_problem(default)} or null")
    return dict(declared)


def declarations_json(declared: Mapping[str, str | None]) -> str | None:
    """What agent.jobs.params holds (None: the job declares none)."""
    return json.dumps(dict(sorted(declared.items())), ensure_ascii=False) if declared else None


def read_json(text: str | None) -> dict[str, Any]:
    """agent.jobs.params or agent.runs.params as stored (NULL or empty: none)."""
    if not text:
        return {}
    found = json.loads(text)
    return found if isinstance(found, dict) else {}


def parse_assignment(text: str, setting: str = "--param") -> tuple[str, str]:
    """``k=v`` of the command line: the name up to the first '=', the value after it, as is."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ParamError(setting, text, "NAME=VALUE (a value may be empty: NAME=)")
    if name_problem(name):
        raise ParamError(setting, text, f"NAME=VALUE with NAME {NAME_EXPECTED}")
    return name, value


def resolve(declared: Mapping[str, str | None], given: Mapping[str, Any], *, job: str,
            setting: str = "--param") -> dict[str, str]:
    """The values a run starts with: ``given`` checked against the job's declarations, the
    defaults filled in. Raises ParamError for a name the job does not declare, a value that is
    not text, and a declared parameter with no default that is not given."""
    by_fold = {name.casefold(): name for name in declared}
    values: dict[str, str] = {}
    for name, value in given.items():
        declared_as = by_fold.get(str(name).casefold())
        if declared_as is None:
            known = ", ".join(sorted(declared)) or "none"
            raise ParamError(f"{setting} {name}", value, f"a parameter job {job!r} declares ({known})")
        problem = value_problem(value)
        if problem:
            raise ParamError(f"{setting} {name}", value, problem)
        if declared_as in values:
            raise ParamError(f"{setting} {name}", value, "each parameter given once")
        values[declared_as] = value
    for name, default in declared.items():
        if name not in values:
            if default is None:
                raise ParamError(f"{setting} {name}", None, f"a value: job {job!r} declares {name!r} without a default")
            values[name] = default
    return dict(sorted(values.items()))


def values_for_run(run_params: str | None, job_params: str | None) -> dict[str, str] | None:
    """What the executor binds for a run: the run's recorded values (given at start, defaults
    filled in), else the job's defaults (a scheduled run). None: nothing to bind (the job
    declares nothing): the run takes the path of a job without parameters. A declared parameter
    without a default and without a value is an error naming it (the step fails)."""
    if not run_params and not job_params:
        return None
    declared = read_json(job_params)
    recorded = read_json(run_params)
    values = dict(recorded)
    missing = [name for name, default in declared.items()
               if default is None and name.casefold() not in {k.casefold() for k in values}]
    if missing:
        raise ParamError("the run's parameters", None,
                         f"a value for {', '.join(map(repr, missing))} (declared without a default; start the run "
                         "with run-now --param or agent.start_job @params)")
    folded = {k.casefold() for k in values}
    for name, default in declared.items():
        if name.casefold() not in folded:
            values[name] = default
    return values or None
