"""Settings validation: every error names the setting, the value and what is expected;
one bad job never stops the others."""

import json
from datetime import datetime, timezone

import pytest

from shared.errors import ConfigError
from shared.jobs.from_settings import JOB_DEFAULTS
from shared.settings import ENGINE_SETTINGS, load_settings


def test_defaults():
    settings = load_settings(environ={})
    agent = settings.agent
    assert agent.db == "sqlite:///agent.db"
    assert agent.queue_name == "agent-tasks"
    assert agent.tick_schedule == "0 */1 * * * *"
    assert agent.max_dequeue_count == 5
    assert settings.jobs == () and settings.invalid_jobs == ()
    # Every engine setting is documented with its default in one place.
    assert {s.name for s in ENGINE_SETTINGS} >= {"AGENT_DB", "AGENT_QUEUE_NAME", "AGENT_TICK_SCHEDULE",
                                                  "AGENT_MAX_DEQUEUE_COUNT", "AGENT_MAX_CONCURRENCY"}


def test_job_with_all_settings():
    env = {
        "JOB__nightly__SCHEDULE": "0 30 2 * * *", "JOB__nightly__COMMAND": "EXEC dbo.purge",
        "JOB__nightly__TIMEZONE": "Europe/Paris", "JOB__nightly__ENABLED": "false",
        "JOB__nightly__MAX_ATTEMPTS": "5", "JOB__nightly__TIMEOUT_SECONDS": "600",
        "JOB__nightly__LEASE_SECONDS": "30", "JOB__nightly__MISFIRE": "skip",
        "JOB__nightly__GRACE_SECONDS": "120", "JOB__nightly__OVERLAP": "queue",
        "JOB__nightly__DATABASE": "reporting",
    }
    (job,) = load_settings(environ=env).jobs
    assert (job.name, job.timezone, job.enabled, job.max_attempts, job.timeout_seconds, job.lease_seconds,
            job.misfire, job.grace_seconds, job.overlap, job.database) == (
        "nightly", "Europe/Paris", False, 5, 600, 30, "skip", 120, "queue", "reporting")


def test_job_defaults():
    (job,) = load_settings(environ={"JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1"}).jobs
    assert job.timezone == JOB_DEFAULTS["TIMEZONE"] == "UTC"
    assert job.misfire == "run-once" and job.overlap == "skip" and job.enabled
    assert job.max_attempts == 3 and job.lease_seconds == 60 and job.grace_seconds == 86400


@pytest.mark.parametrize("suffix,value,expected", [
    ("SCHEDULE", "every day", "six-field NCRONTAB"),
    ("SCHEDULE", "0 0 25 * * *", "six-field NCRONTAB"),
    ("TIMEZONE", "Europe/Nowhere", "IANA time zone"),
    ("ENABLED", "maybe", "true or false"),
    ("MAX_ATTEMPTS", "0", "from 1 to 100"),
    ("MAX_ATTEMPTS", "three", "from 1 to 100"),
    ("TIMEOUT_SECONDS", "-5", "whole number"),
    ("LEASE_SECONDS", "2", "from 6 to 3600"),
    ("MISFIRE", "catch-up-all", "run-once or skip"),
    ("GRACE_SECONDS", "soon", "whole number"),
    ("OVERLAP", "parallel", "skip or queue or allow"),
    ("DATABASE", "bad;name", "database name"),
    ("SCHEDUEL", "0 0 * * * *", "unknown job setting"),
])
def test_one_bad_setting_names_setting_value_and_expectation(suffix, value, expected):
    env = {"JOB__good__SCHEDULE": "0 0 * * * *", "JOB__good__COMMAND": "SELECT 1",
           "JOB__bad__SCHEDULE": "0 0 * * * *", "JOB__bad__COMMAND": "SELECT 2",
           f"JOB__bad__{suffix}": value}
    settings = load_settings(environ=env)
    assert [job.name for job in settings.jobs] == ["good"]
    (bad,) = settings.invalid_jobs
    assert bad.name == "bad"
    message = bad.message
    assert f"JOB__bad__{suffix}" in message
    assert value in message
    assert expected in message


def test_a_missing_command_is_reported_and_a_missing_schedule_is_an_on_demand_job():
    (bad,) = load_settings(environ={"JOB__x__TIMEZONE": "UTC"}).invalid_jobs
    assert "JOB__x__COMMAND" in bad.message and "SCHEDULE" not in bad.message
    (job,) = load_settings(environ={"JOB__x__COMMAND": "SELECT 1"}).jobs
    assert job.schedule == "" and job.schedule_object().next_after(datetime.now(timezone.utc)) is None


def test_bad_job_name():
    settings = load_settings(environ={"JOB__bad name!__SCHEDULE": "0 0 * * * *", "JOB__bad name!__COMMAND": "SELECT 1"})
    assert settings.jobs == ()
    assert "job name" in settings.invalid_jobs[0].message


@pytest.mark.parametrize("name,value,expected", [
    ("AGENT_MAX_DEQUEUE_COUNT", "0", "from 1 to 100"),
    ("AGENT_MAX_CONCURRENCY", "lots", "whole number"),
    ("AGENT_TICK_SCHEDULE", "* * * * *", "six-field NCRONTAB"),
    # Croniter takes day 30 of February: the agent would never tick (an attack).
    ("AGENT_TICK_SCHEDULE", "0 0 0 30 2 *", "six-field NCRONTAB expression with a slot within 50 years"),
    ("AGENT_TICK_SCHEDULE", "0 0 0 31 4,6,9,11 *", "with a slot within 50 years"),
    ("AGENT_QUEUE_NAME", "Agent_Tasks", "Azure Storage queue name"),
    ("AGENT_QUEUE_ENCODING", "utf8", "base64 or none"),
    ("AGENT_SQL_SERVER", "myserver", "AGENT_SQL_DATABASE"),
])
def test_engine_setting_errors(name, value, expected):
    with pytest.raises(ConfigError) as error:
        load_settings(environ={name: value})
    text = str(error.value)
    assert expected in text
    assert name in text or "AGENT_SQL_DATABASE" in text


def test_local_settings_file_and_environment_precedence(tmp_path):
    file = tmp_path / "local.settings.json"
    file.write_text(json.dumps({"IsEncrypted": False, "Values": {
        "AGENT_QUEUE_NAME": "from-file", "AGENT_MAX_CONCURRENCY": 3,
        "JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1"}}))
    settings = load_settings(environ={"AGENT_QUEUE_NAME": "from-env"}, settings_file=str(file))
    assert settings.agent.queue_name == "from-env"
    assert settings.agent.max_concurrency == 3
    assert [job.name for job in settings.jobs] == ["a"]


@pytest.mark.parametrize("content,expected", [
    ("not json", "readable JSON"),
    ('{"Values": []}', '"Values" object'),
])
def test_bad_local_settings_file(tmp_path, content, expected):
    file = tmp_path / "s.json"
    file.write_text(content)
    with pytest.raises(ConfigError, match=expected):
        load_settings(environ={}, settings_file=str(file))


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16"])
def test_a_settings_file_is_read_as_the_functions_host_reads_it(tmp_path, encoding):
    """A byte order mark says UTF-8 or UTF-16 (Notepad's "Unicode"), none means UTF-8."""
    file = tmp_path / "s.json"
    file.write_text(json.dumps({"Values": {"JOB__a__COMMAND": "SELECT 'żółć'"}}, ensure_ascii=False),
                    encoding=encoding)
    assert load_settings(environ={}, settings_file=str(file)).jobs[0].command == "SELECT 'żółć'"


def test_a_settings_file_that_is_no_text_is_a_setting_error_not_a_failure(tmp_path):
    file = tmp_path / "s.json"
    file.write_bytes(b'{"Values": {"AGENT_QUEUE_NAME": "\xff"}}')          # Windows-1252, or no text
    with pytest.raises(ConfigError, match="--settings.*expected a JSON file in UTF-8, or in UTF-8 or UTF-16 "
                                          "with a byte order mark"):
        load_settings(environ={}, settings_file=str(file))


def test_missing_settings_file(tmp_path):
    with pytest.raises(ConfigError, match="--settings"):
        load_settings(environ={}, settings_file=str(tmp_path / "missing.json"))


def test_config_hash_changes_with_jobs():
    a = load_settings(environ={"JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1"})
    b = load_settings(environ={"JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 2"})
    assert a.config_hash != b.config_hash
    assert a.config_hash == load_settings(environ={"JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1"}).config_hash


def test_the_parsers_jobs_equal_the_dataclasss_own_and_stay_frozen():
    import dataclasses

    from shared.jobs.model import JobDefinition

    settings = load_settings(environ={
        "JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1",
        "JOB__b__SCHEDULE": "0 */5 * * * *", "JOB__b__COMMAND": "SELECT 2", "JOB__b__TIMEZONE": "Europe/Paris",
        "JOB__b__MAX_ATTEMPTS": "7", "JOB__b__OVERLAP": "QUEUE", "JOB__b__ENABLED": "no", "JOB__b__DATABASE": "other",
        "JOB__c__STEPS__1__COMMAND": "SELECT 3", "JOB__c__STEPS__2__COMMAND": "SELECT 4", "JOB__c__NOTIFY": " never ",
    })
    assert [job.name for job in settings.jobs] == ["a", "b", "c"] and not settings.invalid_jobs
    for job in settings.jobs:
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(JobDefinition)}
        twin = JobDefinition(**fields)
        assert job == twin and hash(job) == hash(twin) and repr(job) == repr(twin)
        with pytest.raises(dataclasses.FrozenInstanceError):
            job.name = "other"   # type: ignore[misc]
    b = settings.job("b")
    assert (b.timezone, b.max_attempts, b.overlap, b.enabled, b.database) == ("Europe/Paris", 7, "queue", False, "other")
    a = settings.job("a")
    assert (a.enabled, a.max_attempts, a.timeout_seconds, a.lease_seconds, a.misfire, a.overlap, a.notify) == \
        (True, 3, 1800, 60, "run-once", "skip", "on_failure")


def test_blank_settings_take_the_defaults_and_set_ones_are_still_validated():
    settings = load_settings(environ={
        "JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1", "JOB__a__MAX_ATTEMPTS": "  ",
        "JOB__a__ENABLED": "", "JOB__a__TIMEZONE": " ",
        "JOB__b__SCHEDULE": "0 0 0 30 2 *", "JOB__b__COMMAND": "SELECT 1",
        "JOB__c__SCHEDULE": "0 0 0 30 2 *", "JOB__c__COMMAND": "SELECT 1", "JOB__c__MAX_ATTEMPTS": "0",
        "JOB__c__ENABLED": "maybe", "JOB__c__TIMEZONE": "Mars/Base",
    })
    a = settings.job("a")
    assert (a.max_attempts, a.enabled, a.timezone) == (3, True, "UTC")
    errors = {bad.name: bad.message for bad in settings.invalid_jobs}
    # The same impossible schedule is refused for each job that has it (one verdict, shared).
    assert "JOB__b__SCHEDULE" in errors["b"] and "JOB__c__SCHEDULE" in errors["c"]
    assert "JOB__c__MAX_ATTEMPTS='0'" in errors["c"] and "JOB__c__ENABLED='maybe'" in errors["c"]
    assert "JOB__c__TIMEZONE='Mars/Base'" in errors["c"]


def test_the_config_hash_covers_every_field():
    base = {"JOB__a__SCHEDULE": "0 0 * * * *", "JOB__a__COMMAND": "SELECT 1"}
    hashes = {load_settings(environ=base).config_hash}
    for suffix, value in [("TIMEZONE", "Europe/Paris"), ("ENABLED", "false"), ("MAX_ATTEMPTS", "4"),
                          ("TIMEOUT_SECONDS", "60"), ("LEASE_SECONDS", "30"), ("MISFIRE", "skip"),
                          ("GRACE_SECONDS", "10"), ("OVERLAP", "allow"), ("DATABASE", "other"),
                          ("NOTIFY", "never"), ("NOTIFY_WEBHOOK_URL", "https://example.org/hook")]:
        hashes.add(load_settings(environ={**base, f"JOB__a__{suffix}": value}).config_hash)
    hashes.add(load_settings(environ={**base, "JOB__a__COMMAND": "SELECT 2"}).config_hash)
    assert len(hashes) == 13
