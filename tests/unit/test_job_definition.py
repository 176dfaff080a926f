"""The job form's definition (shared/jobs/definition.py): its arguments are the define_job query's
parameters, and a defined job's row gives back the form it was defined from (an edit starts there)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from shared.control.queries import DIALECTS, load_queries
from shared.jobs.definition import FIELDS, blank_form, form_of, parse_definition


def test_the_arguments_are_the_define_job_querys_parameters_in_every_dialect():
    definition, errors = parse_definition({**blank_form(), "name": "j", "sql": "SELECT 1"})
    assert not errors
    for dialect in DIALECTS:
        assert load_queries(dialect)["define_job"].parameters == set(definition.arguments()), dialect
    assert [field.name for field in FIELDS][:2] == ["name", "sql"]


@pytest.mark.parametrize("fields", [
    {"schedule": "0 30 2 * * *", "timezone": "Europe/Paris"},
    # (02:30 that day does not exist in Europe/Paris: refused, tests/unit/test_console_hardening.py)
    {"schedule": "", "run_at": "2031-03-30 03:30:00", "timezone": "Europe/Paris"},
    # happens twice: the offset says which, and the form gives it back
    {"schedule": "", "run_at": "2031-10-26 02:30:00+01:00", "timezone": "Europe/Paris"},
    {"schedule": "", "run_at": "", "timezone": "UTC"},                       # on demand
    {"schedule": "0 0 1 * * *", "after": "load", "after_outcome": "failed", "targets": "db:tenant_*",
     "target_parallelism": "4", "overlap": "queue", "catchup_seconds": "600", "grace_seconds": "3600"},
])
def test_a_defined_jobs_row_gives_back_its_form(fields):
    form = {**blank_form(), "name": "job", "sql": "SELECT 1", **fields}
    definition, errors = parse_definition(form)
    assert not errors, errors
    arguments = definition.arguments()
    row = {"job_name": definition.name, "command": definition.sql, "schedule": definition.schedule_text,
           "timezone": definition.timezone, "enabled": definition.enabled, "after_job": definition.after,
           "after_outcome": definition.after_outcome if definition.after else None,
           "max_attempts": arguments["max_attempts"], "timeout_seconds": arguments["timeout_seconds"],
           "overlap": definition.overlap, "misfire": definition.misfire, "grace_seconds": definition.grace_seconds,
           "catchup_seconds": definition.catchup_seconds, "lease_seconds": definition.lease_seconds,
           "target_database": definition.database, "requested_targets": definition.targets,
           "requested_target_parallelism": definition.target_parallelism,
           "requested_target_stagger_seconds": definition.target_stagger_seconds}
    again, errors = parse_definition(form_of(row))
    assert not errors and again == definition


def test_a_one_time_job_is_kept_as_an_instant_in_utc():
    definition, _ = parse_definition({**blank_form(), "name": "once", "sql": "SELECT 1", "run_at": "2031-01-01 01:00",
                                      "timezone": "Europe/Paris"})
    assert definition.run_at == datetime(2031, 1, 1, 0, 0, tzinfo=timezone.utc)
    assert definition.schedule is None and definition.schedule_text == "@once 2031-01-01T00:00:00+00:00"
