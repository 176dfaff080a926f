"""Schedules in words (shared/jobs/describe.py): the common shapes read as a person would say them;
everything else comes back as the expression, and nothing raises."""

from __future__ import annotations

import pytest

from shared.jobs.describe import describe_schedule


@pytest.mark.parametrize("expression,words", [
    ("* * * * * *", "every second"),
    ("*/15 * * * * *", "every 15 seconds"),
    ("0 * * * * *", "every minute"),
    ("30 * * * * *", "every minute, at second 30"),
    ("0 */5 * * * *", "every 5 minutes"),
    ("0 */1 * * * *", "every minute"),
    ("0 15 * * * *", "every hour, at minute 15"),
    ("0 0 */2 * * *", "every 2 hours, at minute 0"),
    ("0 30 2 * * *", "at 02:30 every day"),
    ("15 30 2 * * *", "at 02:30:15 every day"),
    ("0 0 6,18 * * *", "at 06:00 and 18:00 every day"),
    ("0 0 9 * * 1-5", "at 09:00, Monday to Friday"),
    ("0 0 3 * * 0", "at 03:00, on Sunday"),
    ("0 0 3 * * 7", "at 03:00, on Sunday"),
    ("0 0 8 * * mon,wed,fri", "at 08:00, on Monday, Wednesday and Friday"),
    ("0 0 3 1 * *", "at 03:00, on day 1 of the month"),
    ("0 0 0 1 1 *", "at 00:00, on day 1 of the month in January"),
    ("0  30   2 * * *", "at 02:30 every day"),
    ("@once 2026-12-31T23:00:00", "once, at 2026-12-31T23:00:00"),
    # SQL Server Agent's calendar (issue 33)
    ("0 0 22 * * MON-FRI#L", "at 22:00, on the last weekday of the month"),
    ("0 0 2 L * *", "at 02:00, on the last day of the month"),
    ("0 0 2 LW * *", "at 02:00, on the last weekday of the month"),
    ("0 0 2 15W * *", "at 02:00, on the weekday nearest day 15 of the month"),
    ("0 0 9 * * 5#3", "at 09:00, on the third Friday of the month"),
    ("0 0 9 * * FRIL", "at 09:00, on the last Friday of the month"),
    ("0 0 9 * * SAT-SUN#1", "at 09:00, on the first weekend day of the month"),
    ("0 0 9 * * MON,FRI ; every 2 weeks ; from 2026-01-05",
     "at 09:00, on Monday and Friday; every 2 weeks; from 2026-01-05"),
])
def test_common_shapes_in_words(expression, words):
    assert describe_schedule(expression) == words


@pytest.mark.parametrize("expression", [
    "1-5 * * * * *",            # a range of seconds
    "0 0 1-3/2 * * *",          # a step inside a range
    "0 0 3 1 * 1",              # day of month and weekday together (cron ORs them)
    "0 0 3 * 13 *",             # no 13th month
    "0 0 3 * * xyz",
    "0 0 3 * * *  extra",
    "0 0 1,2,3,4,5,6,7 * * *",  # too many hours to read well
    "bogus", "@once",           # "" is an on-demand job: tests/integration/test_on_demand.py
])
def test_other_shapes_come_back_as_the_expression(expression):
    assert describe_schedule(expression) == expression


@pytest.mark.parametrize("value", [None, 42, "\x00\x01", "0 0 99999999999999999999 * * *"])
def test_never_raises(value):
    assert isinstance(describe_schedule(value), str)
