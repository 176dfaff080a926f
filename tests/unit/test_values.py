"""shared.values.parse_int, which reads every whole number of the settings and of a database job's
steps (agent.set_job_steps @steps): only a number as a person and the database write it."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.values import parse_int

NOT_WHOLE_NUMBERS = ["", " ", "1_0", "1_000", "５", "٣", "𝟓", "1,000", "5.", "5.0", "1e3", "0x10", "nan", "inf",
                     "five", "--5", "+-5", "5 5", "\x00", True, False, None, 5.0, "9" * 31]


@pytest.mark.parametrize("raw", NOT_WHOLE_NUMBERS)
def test_what_is_not_a_plain_whole_number_is_refused_naming_the_setting_and_the_range(raw):
    with pytest.raises(ConfigError) as caught:
        parse_int("JOB__x__TIMEOUT_SECONDS", raw, 1, 86400)
    assert "JOB__x__TIMEOUT_SECONDS" in str(caught.value) and "a whole number from 1 to 86400" in str(caught.value)


@pytest.mark.parametrize(("raw", "expected"), [("10", 10), (" 10 ", 10), ("+10", 10), ("0010", 10), (10, 10),
                                               ("86400", 86400), ("1", 1)])
def test_a_plain_whole_number_in_range_is_read(raw, expected):
    assert parse_int("JOB__x__TIMEOUT_SECONDS", raw, 1, 86400) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "86401", str(10 ** 29)])
def test_a_number_out_of_range_is_refused(raw):
    with pytest.raises(ConfigError, match="a whole number from 1 to 86400"):
        parse_int("JOB__x__TIMEOUT_SECONDS", raw, 1, 86400)


@pytest.mark.parametrize("value", [
    "Driver={PostgreSQL Unicode};Servername=a;Server=b;Database=x;",
    "Driver={PostgreSQL Unicode};Server=a;server=b;Database=x;",
    "Driver={FreeTDS};Server=a;Address=b;",
    "Driver={FreeTDS};Server=a;Port=1;Port=2;",
    "Driver={ODBC Driver 18 for SQL Server};Data Source=a;Server=tcp:b,1433;",
])
def test_a_control_connection_string_naming_its_server_twice_is_refused(value):
    """Drivers differ on which spelling wins; the agent's own server (the fleet allow-list) must be
    the one it reaches."""
    from shared.control.db import parse_database_url

    with pytest.raises(ConfigError, match="naming its server once"):
        parse_database_url(value)
