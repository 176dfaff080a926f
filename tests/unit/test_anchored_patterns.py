"""Names the agent validates with a regular expression are the whole value: Python's ``$`` also
matches before a final newline, so ``re.compile(r"^[A-Za-z]+$").match("nl\\n")`` passes, and a
job named ``nl<newline>`` became a second job beside ``nl`` whose name, pasted by a SQL Agent token
into a ``--`` comment, ended the comment (an attack on the job name). Every validation pattern
ends with ``\\Z``; this file keeps it so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# re.compile(r"^...$") without re.MULTILINE (a pattern that matches lines means $ on purpose).
_ANCHORED_DOLLAR = re.compile(r"""re\.compile\(r?(["'])\^.*\$\1(?P<rest>[^\n]*)""")


def test_no_validation_pattern_ends_with_a_dollar_that_lets_a_newline_through():
    found = []
    for path in sorted((ROOT / "shared").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = _ANCHORED_DOLLAR.search(line)
            if match and "MULTILINE" not in match.group("rest"):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "end these patterns with \\Z, not $ (which matches before a final newline):\n" + "\n".join(found)


@pytest.mark.parametrize("value", ["nl\n", "nl\r\n", "\nnl"])
def test_a_job_name_with_a_newline_is_an_invalid_job_that_names_itself_and_stops_no_other(value):
    from shared.settings import load_settings

    settings = load_settings(environ={f"JOB__{value}__COMMAND": "SELECT 1", f"JOB__{value}__SCHEDULE": "0 0 * * * *",
                                      "JOB__nl__COMMAND": "SELECT 1", "JOB__nl__SCHEDULE": "0 0 * * * *"})
    assert [job.name for job in settings.jobs] == ["nl"]
    invalid = [job for job in settings.invalid_jobs if job.name == value]
    assert len(invalid) == 1 and "must be 1-64 letters" in invalid[0].errors[0]


def test_every_name_pattern_refuses_a_trailing_newline():
    from shared.jobs.alert_definitions import ALERT_NAME
    from shared.values import DATABASE_NAME_PATTERN, JOB_NAME_PATTERN, PRINCIPAL_PATTERN

    for pattern, good in ((JOB_NAME_PATTERN, "nightly"), (DATABASE_NAME_PATTERN, "sales"),
                          (PRINCIPAL_PATTERN, "ops_login"), (ALERT_NAME, "disk_full")):
        assert pattern.match(good)
        assert not pattern.match(good + "\n"), pattern.pattern


def test_a_message_whose_operation_id_ends_with_a_newline_is_refused():
    from shared.messaging.messages import MessageError, parse_message

    good = {"v": 1, "run_id": 1, "token": 1, "op": "a" * 32}
    assert parse_message(json.dumps(good)).operation_id == "a" * 32
    with pytest.raises(MessageError):
        parse_message(json.dumps({**good, "op": "a" * 32 + "\n"}))
