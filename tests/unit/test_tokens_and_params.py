"""SQL Agent's tokens (shared/jobs/tokens.py) and run parameters (shared/jobs/params.py), pure."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from shared.jobs.from_settings import parse_jobs
from shared.jobs.params import ParamError, parse_assignment, read_json, resolve, values_for_run
from shared.jobs.tokens import (JOB_ID_NAMESPACE, MACROS, TokenError, has_tokens, job_id, replace_tokens,
                                run_time_values, substitute_at_run, token_uses)

UTC = timezone.utc


def values(**extra):
    return {**run_time_values(job_name="O'Brien ]\"", step=2, started_at=datetime(2026, 3, 29, 0, 30, 5),
                              now=datetime(2026, 3, 29, 1, 0, 7, tzinfo=UTC), time_zone="Europe/London"), **extra}


def test_each_macro_escapes_its_character_only():
    text = substitute_at_run("'$(ESCAPE_SQUOTE(JOBNAME))' \"$(ESCAPE_DQUOTE(JOBNAME))\" "
                             "[$(ESCAPE_RBRACKET(JOBNAME))] $(ESCAPE_NONE(JOBNAME))", values())
    assert text == "'O''Brien ]\"' \"O'Brien ]\"\"\" [O'Brien ]]\"] O'Brien ]\""
    assert set(MACROS) == {"ESCAPE_SQUOTE", "ESCAPE_DQUOTE", "ESCAPE_RBRACKET", "ESCAPE_NONE"}


def test_start_and_now_are_in_the_job_time_zone_as_sql_agent_formats_them():
    # 2026-03-29 00:30:05 UTC is 00:30:05 GMT; 01:00:07 UTC is 02:00:07 BST (the clocks went forward).
    v = values()
    assert (v["STRTDT"], v["STRTTM"], v["DATE"], v["TIME"], v["STEPID"]) == ("20260329", "003005", "20260329",
                                                                          "020007", "2")
    tokyo = run_time_values(job_name="j", step=1, started_at=datetime(2026, 12, 31, 15, 0, 0), now=datetime.now(UTC),
                            time_zone="Asia/Tokyo")
    assert (tokyo["STRTDT"], tokyo["STRTTM"]) == ("20270101", "000000")


def test_job_id_is_stable_and_reads_back_as_a_guid():
    assert job_id("nightly") == job_id("nightly") != job_id("Nightly")
    text = job_id("nightly")
    assert text.startswith("0x") and len(text) == 34
    # CONVERT(uniqueidentifier, 0x...) reads the first three groups little-endian: bytes_le.
    assert uuid.UUID(bytes_le=bytes.fromhex(text[2:])) == uuid.uuid5(JOB_ID_NAMESPACE, "nightly")


def test_a_token_without_a_macro_or_without_a_value_here_fails_naming_it():
    with pytest.raises(TokenError, match=r"\$\(JOBNAME\): a token without an escape macro"):
        substitute_at_run("PRINT '$(JOBNAME)'", values())
    with pytest.raises(TokenError, match=r"\$\(ESCAPE_NONE\(SRVR\)\).*@@SERVERNAME"):
        substitute_at_run("PRINT '$(ESCAPE_NONE(SRVR))'", values())
    with pytest.raises(TokenError, match="STEPNAME"):
        substitute_at_run("PRINT '$(ESCAPE_NONE(STEPNAME))'", values())


def test_other_dollar_parens_are_left_as_written_at_run_time_and_listed_by_the_importer():
    command = "SELECT '$(notatoken)', '$(date)', '$(', '$()' -- $(ESCAPE_NONE(x"
    assert not has_tokens(command)
    assert substitute_at_run(command, values()) == command
    _, problems = replace_tokens("PRINT '$(MyVariable)'", {})
    assert [written for written, _ in problems] == ["$(MyVariable)"]
    assert "Variable MyVariable not found" in problems[0][1]


def test_the_importer_leaves_run_time_tokens_and_replaces_definition_time_ones():
    text, problems = replace_tokens("x_$(ESCAPE_SQUOTE(JOBNAME))_$(ESCAPE_NONE(STEPID))_$(ESCAPE_SQUOTE(STRTDT))",
                                    {"JOBNAME": "a'b", "STEPNAME": "s", "STEPID": "3"},
                                    leave={"DATE", "TIME", "STRTDT", "STRTTM", "JOBID"})
    assert (text, problems) == ("x_a''b_3_$(ESCAPE_SQUOTE(STRTDT))", [])


def test_a_value_that_looks_like_a_token_is_not_replaced_again():
    assert substitute_at_run("'$(ESCAPE_SQUOTE(JOBNAME))'", values(JOBNAME="$(ESCAPE_NONE(STEPID))")) == \
        "'$(ESCAPE_NONE(STEPID))'"
    assert [u.token for u in token_uses("$(ESCAPE_SQUOTE(WMI(TextData)))")] == ["WMI(TextData)"]


def test_params_are_declared_in_settings_with_clear_errors():
    jobs, invalid = parse_jobs({
        "JOB__a__COMMAND": "SELECT @day", "JOB__a__PARAMS__day__DEFAULT": "", "JOB__a__PARAMS__Who__REQUIRED": "true",
        "JOB__a__PARAMS__off__REQUIRED": "false",
        "JOB__b__COMMAND": "x", "JOB__b__PARAMS__1x__DEFAULT": "a",
        "JOB__c__COMMAND": "x", "JOB__c__PARAMS__k__DEFAULT": "a", "JOB__c__PARAMS__K__REQUIRED": "true",
        "JOB__d__COMMAND": "x", "JOB__d__PARAMS__k__REQUIRED": "maybe",
        "JOB__e__COMMAND": "x", "JOB__e__PARAMS__k__DEFAUL": "a",
        # A default is a value: at most 1,000,000 characters, as agent.set_job_params refuses it.
        "JOB__f__COMMAND": "x", "JOB__f__PARAMS__k__DEFAULT": "é" * 1_000_001})
    (a,) = jobs
    assert read_json(a.params) == {"Who": None, "day": ""}
    errors = {bad.name: bad.message for bad in invalid}
    assert "JOB__b__PARAMS__1x__DEFAULT='a': expected a setting whose <parameter> is a parameter name" in errors["b"]
    assert "one parameter declared twice" in errors["c"]
    assert "JOB__d__PARAMS__k__REQUIRED='maybe': expected true" in errors["d"]
    assert "JOB__e__PARAMS__k__DEFAUL='a': expected JOB__<name>__PARAMS__<parameter>__DEFAULT or __REQUIRED" in errors["e"]
    assert "JOB__f__PARAMS__k__DEFAULT='ééé" in errors["f"] and len(errors["f"]) < 300
    assert "expected a default that is at most 1000000 characters (found 1000001)" in errors["f"]


def test_a_job_without_params_keeps_its_definition_and_hash_inputs():
    (job,), _ = parse_jobs({"JOB__a__COMMAND": "SELECT 1"})
    assert job.params == ""


def test_resolve_fills_defaults_and_refuses_what_is_wrong():
    declared = {"day": "today", "who": None}
    assert resolve(declared, {"WHO": "x"}, job="j") == {"day": "today", "who": "x"}
    for given, setting, expected in [({"nobody": "1"}, "--param nobody", "declares (day, who)"),
                                     ({}, "--param who", "without a default"),
                                     ({"who": "a\x00"}, "--param who", "without NUL"),
                                     ({"who": 1}, "--param who", "text"),
                                     ({"who": "a" * 1_000_001}, "--param who", "at most 1000000")]:
        with pytest.raises(ParamError) as caught:
            resolve(declared, given, job="j")
        assert caught.value.setting == setting and expected in str(caught.value), caught.value
    assert parse_assignment("k=a=b") == ("k", "a=b") and parse_assignment("k=") == ("k", "")
    for bad in ("k", "=v", "k-1=v", "é=v", "stmt=x", "Params=x"):
        with pytest.raises(ParamError):
            parse_assignment(bad)


def test_values_for_run():
    assert values_for_run(None, None) is None
    assert values_for_run(None, '{"d": "x"}') == {"d": "x"}
    assert values_for_run('{"d": "given"}', '{"d": "x"}') == {"d": "given"}
    with pytest.raises(ParamError, match="'r'"):
        values_for_run(None, '{"r": null}')
