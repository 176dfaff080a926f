"""The typed values of a run's life (shared/jobs/run_model.py): the run statuses are exactly the ones
every server dialect's schema allows (its latest migration redefining runs_status_check), and a
member travels as its bare value wherever the strings went before (equality, dict keys, JSON,
f-strings and %-formatting in log lines, query parameters)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sqlite3
from pathlib import Path

import pytest

from shared.jobs.run_model import RUN_ENDING_OUTCOMES, AttemptError, Outcome, RunStatus

MIGRATIONS = Path(__file__).resolve().parents[2] / "shared" / "control" / "sql" / "migrations"


def latest_status_check(dialect: str) -> set[str]:
    """The values of the last runs_status_check a dialect's migrations define, in order."""
    found: set[str] | None = None
    for path in sorted((MIGRATIONS / dialect).glob("*.sql")):
        for match in re.finditer(r"runs_status_check\s+CHECK\s*\(\s*status\s+IN\s*\(([^)]*)\)",
                                 path.read_text(encoding="utf-8"), re.IGNORECASE):
            found = set(re.findall(r"N?'([a-z_]+)'", match.group(1)))
    assert found, f"no runs_status_check in shared/control/sql/migrations/{dialect}"
    return found


@pytest.mark.parametrize("dialect", ["postgres", "mssql"])
def test_run_statuses_are_the_schemas(dialect):
    assert {status.value for status in RunStatus} == latest_status_check(dialect)


@pytest.mark.parametrize("enum", [RunStatus, Outcome])
def test_a_member_travels_as_its_value(enum, caplog):
    for member in enum:
        value = member.value
        assert member == value and {value: 1}[member] == 1 and enum(value) is member
        assert str(member) == f"{member}" == "%s" % member == value
        assert json.dumps({member: [member]}) == json.dumps({value: [value]})
        assert json.dumps({"s": member}, indent=2) == json.dumps({"s": value}, indent=2)
        with caplog.at_level(logging.INFO):
            logging.getLogger("test_run_model").info("run 1: %s", member)
        assert caplog.records[-1].getMessage() == f"run 1: {value}"
        row = sqlite3.connect(":memory:").execute("SELECT ?, typeof(?)", (member, member)).fetchone()
        assert row == (value, "text")


def test_outcome_values_are_distinct_and_lowercase():
    values = [outcome.value for outcome in Outcome]
    assert len(values) == len(set(values)) == 13
    assert all(re.fullmatch(r"[a-z_]+", value) for value in values)
    assert RUN_ENDING_OUTCOMES == {Outcome.SUCCEEDED, Outcome.FAILED, Outcome.POISONED}


@pytest.mark.parametrize("kind,transient,timed_out,recorded", [
    ("transient", True, False, "failed"),
    ("permanent", False, False, "failed"),
    ("timeout", False, True, "timeout"),
])
def test_attempt_error(kind, transient, timed_out, recorded):
    error = AttemptError(kind, 1205, "40001", "deadlock victim")
    assert (error.transient, error.timed_out, error.attempt_outcome) == (transient, timed_out, recorded)
    with pytest.raises(dataclasses.FrozenInstanceError):
        error.message = "changed"    # frozen: an error travels as it was classified
