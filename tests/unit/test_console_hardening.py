"""The operator's console, hardened (issue 32, from the attack), at the unit level: a time zone is
a canonical IANA name wherever one is given (F4), and a one-time job's local time names one
instant or is refused in words (F3). The monitor's form is driven end to end in
tests/integration/test_console_hardening.py."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from shared.engine.planning import verdict
from shared.jobs.definition import blank_form, form_of, parse_definition
from shared.jobs.schedules import iana_timezones, parse_schedule, validate_timezone
from shared.ops.sqlagent_import import convert_script
from shared.settings import load_settings

UTC = timezone.utc
HOST_NAMES = ["localtime", "posixrules", "Factory", "posix/Europe/Paris", "right/UTC", "right/Europe/London",
              "posix/UTC", "SystemV/EST5"]


# ------------------------------------------------------------------ F4

@pytest.mark.parametrize("zone", HOST_NAMES + ["europe/paris", "Europe/Nowhere", "zone.tab", "../etc/localtime",
                                               "/etc/localtime", " UTC", ""])
def test_validate_timezone_refuses_host_files_and_unknown_names_with_an_example(zone):
    with pytest.raises(ValueError) as caught:
        validate_timezone(zone)
    message = str(caught.value)
    assert repr(zone) in message and "such as UTC or Europe/Paris" in message


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/New_York", "US/Eastern", "Etc/GMT+5", "GMT",
                                  "Asia/Kolkata", "America/Argentina/Buenos_Aires"])
def test_canonical_iana_names_and_their_links_are_accepted(zone):
    assert validate_timezone(zone).key == zone


def test_the_canonical_list_is_the_pinned_tzdata_packages_not_the_hosts():
    names = iana_timezones()
    assert "Europe/Paris" in names and len(names) > 500
    assert not [n for n in names if n in ("localtime", "posixrules", "Factory") or n.startswith(("posix/", "right/"))]


@pytest.mark.parametrize("zone", HOST_NAMES)
def test_a_settings_job_with_a_host_time_zone_is_invalid_naming_the_setting(zone):
    env = {"JOB__good__SCHEDULE": "0 0 * * * *", "JOB__good__COMMAND": "SELECT 1",
           "JOB__bad__SCHEDULE": "0 0 * * * *", "JOB__bad__COMMAND": "SELECT 2", "JOB__bad__TIMEZONE": zone}
    settings = load_settings(environ=env)
    assert [job.name for job in settings.jobs] == ["good"]          # one bad job stops no other
    (bad,) = settings.invalid_jobs
    assert "JOB__bad__TIMEZONE" in bad.message and zone in bad.message
    assert "IANA time zone name such as UTC or Europe/Paris" in bad.message


@pytest.mark.parametrize("zone", HOST_NAMES)
def test_a_procedures_job_with_a_host_time_zone_is_refused_at_planning(zone):
    error, first = verdict({"timezone": zone, "schedule": "0 0 2 * * *", "enabled": 1, "job_name": "p",
                            "command": "SELECT 1"})
    assert first is None and error is not None
    assert "agent.add_scheduled_job @timezone" in error and zone in error and "Europe/Paris" in error


@pytest.mark.parametrize("zone", HOST_NAMES)
def test_the_form_and_the_importer_refuse_a_host_time_zone(zone):
    form = {**blank_form(), "name": "j", "sql": "SELECT 1", "schedule": "0 0 2 * * *", "timezone": zone}
    definition, errors = parse_definition(form)
    assert definition is None and [e.field for e in errors] == ["timezone"]
    assert errors[0].value == zone and "such as UTC or Europe/Paris" in errors[0].message
    with pytest.raises(ValueError, match="Europe/Paris"):
        convert_script([], zone)
    with pytest.raises(ValueError, match=zone.replace("/", ".")):
        parse_schedule("0 0 2 * * *", zone)


# ------------------------------------------------------------------ F3

def test_an_ambiguous_once_names_both_instants_and_an_offset_picks_one():
    with pytest.raises(ValueError) as caught:
        parse_schedule("@once 2027-10-31T01:30", "Europe/London")
    message = str(caught.value)
    assert "2027-10-31 01:30:00 happens twice in Europe/London" in message
    assert "2027-10-31 01:30:00+01:00 (2027-10-31 00:30:00 UTC, the first time)" in message
    assert "2027-10-31 01:30:00+00:00 (2027-10-31 01:30:00 UTC, the second)" in message
    assert parse_schedule("@once 2027-10-31T01:30+01:00", "Europe/London").at == datetime(2027, 10, 31, 0, 30, tzinfo=UTC)
    assert parse_schedule("@once 2027-10-31T01:30+00:00", "Europe/London").at == datetime(2027, 10, 31, 1, 30, tzinfo=UTC)
    # the hour before and after the change: one instant each, no offset needed
    assert parse_schedule("@once 2027-10-31T00:59:59", "Europe/London").at == datetime(2027, 10, 30, 23, 59, 59,
                                                                                        tzinfo=UTC)
    assert parse_schedule("@once 2027-10-31T02:00", "Europe/London").at == datetime(2027, 10, 31, 2, 0, tzinfo=UTC)


def test_a_once_in_the_spring_gap_is_refused_with_the_time_after_the_jump():
    with pytest.raises(ValueError) as caught:
        parse_schedule("@once 2027-03-28T01:30", "Europe/London")
    assert "2027-03-28 01:30:00 does not exist in Europe/London" in str(caught.value)
    assert "e.g. 2027-03-28 02:30:00" in str(caught.value)
    # Australia/Lord_Howe moves by half an hour; America/Sao_Paulo's old changes at midnight
    with pytest.raises(ValueError, match="happens twice"):
        parse_schedule("@once 2027-04-04T01:45", "Australia/Lord_Howe")
    with pytest.raises(ValueError, match="does not exist"):
        parse_schedule("@once 2018-11-04T00:30", "America/Sao_Paulo")


def test_a_settings_job_at_an_ambiguous_local_time_is_invalid_naming_the_setting():
    env = {"JOB__once__SCHEDULE": "@once 2027-10-31T01:30", "JOB__once__COMMAND": "SELECT 1",
           "JOB__once__TIMEZONE": "Europe/London"}
    (bad,) = load_settings(environ=env).invalid_jobs
    assert "JOB__once__SCHEDULE" in bad.message and "happens twice in Europe/London" in bad.message


@pytest.mark.parametrize("instant, shown", [
    (datetime(2027, 10, 31, 0, 30, tzinfo=UTC), "2027-10-31 01:30:00+01:00"),     # the first 01:30
    (datetime(2027, 10, 31, 1, 30, tzinfo=UTC), "2027-10-31 01:30:00+00:00"),     # the second
    (datetime(2027, 10, 31, 2, 30, tzinfo=UTC), "2027-10-31 02:30:00"),           # after: one only
    (datetime(2027, 3, 28, 1, 30, tzinfo=UTC), "2027-03-28 02:30:00"),            # after the jump
    (datetime(2027, 7, 1, 12, 0, tzinfo=UTC), "2027-07-01 13:00:00"),
])
def test_the_form_of_a_one_time_job_round_trips_to_the_same_instant(instant, shown):
    row = {"job_name": "j", "command": "SELECT 1", "schedule": f"@once {instant.isoformat()}",
           "timezone": "Europe/London", "enabled": 1}
    form = form_of(row)
    assert form["run_at"] == shown
    definition, errors = parse_definition(form)
    assert errors == [] and definition is not None and definition.run_at == instant


def test_the_form_refuses_an_offset_its_zone_does_not_have_then_but_takes_utc_with_z():
    form = {**blank_form(), "name": "j", "sql": "SELECT 1", "timezone": "Europe/Paris"}
    definition, errors = parse_definition({**form, "run_at": "2027-07-01 09:00+01:00"})
    assert definition is None and [e.field for e in errors] == ["run_at"]
    assert "+01:00 is not the offset of Europe/Paris at 2027-07-01 09:00:00" in errors[0].message
    definition, errors = parse_definition({**form, "run_at": "2027-07-01 09:00Z"})
    assert errors == [] and definition.run_at == datetime(2027, 7, 1, 9, 0, tzinfo=UTC)
    definition, errors = parse_definition({**form, "run_at": "2027-07-01 09:00+02:00"})
    assert errors == [] and definition.run_at == datetime(2027, 7, 1, 7, 0, tzinfo=UTC)


def test_import_sqlagent_refuses_a_host_time_zone_naming_the_option(capsys):
    from shared.cli.commands import main
    from shared.cli.output import EXIT_USAGE
    script = Path(__file__).resolve().parents[1] / "integration" / "sqlagent" / "several_jobs.sql"
    assert main(["import-sqlagent", str(script), "--timezone", "localtime"]) == EXIT_USAGE
    printed = capsys.readouterr()
    said = printed.out + printed.err
    assert "--timezone 'localtime'" in said and "such as UTC or Europe/Paris" in said, said


@pytest.mark.parametrize("zone", ["localtime", "right/UTC"])
def test_a_condition_alert_with_a_host_time_zone_is_invalid_naming_its_timezone(zone):
    from shared.jobs.alert_definitions import check_definition, parse_alerts

    alerts, invalid = parse_alerts({"ALERT__slow__QUERY": "SELECT 1", "ALERT__slow__SCHEDULE": "0 */5 * * * *",
                                    "ALERT__slow__TIMEZONE": zone,
                                    "ALERT__fine__QUERY": "SELECT 1", "ALERT__fine__SCHEDULE": "0 */5 * * * *"})
    assert [a.name for a in alerts] == ["fine"]
    (bad,) = invalid
    said = " ".join(bad.errors)
    assert "ALERT__slow__TIMEZONE" in said and zone in said and "Europe/Paris" in said, said
    error, first = check_definition({"alert_name": "p", "source": "procedure", "probe_query": "SELECT 1",
                                     "schedule": "0 */5 * * * *", "timezone": zone}, datetime(2027, 1, 1, tzinfo=UTC))
    assert first is None and "agent.add_alert @timezone" in error and zone in error


def test_a_procedures_one_time_job_at_an_ambiguous_local_time_is_refused_at_planning_naming_run_at():
    error, first = verdict({"timezone": "Europe/London", "schedule": "@once 2027-10-31T01:30:00", "enabled": 1,
                            "job_name": "p", "command": "SELECT 1"})
    assert first is None and error.startswith("agent.add_scheduled_job @run_at='@once 2027-10-31T01:30:00'")
    assert "NCRONTAB" not in error and "happens twice in Europe/London" in error
