"""A job's schedule in words, for the monitor's pages: "every 5 minutes", "at 02:30 every day",
"at 09:00, Monday to Friday".

Only the shapes people write most are put into words; any other shape (lists of hours, steps
inside ranges, month or day-of-month restrictions combined with weekdays, ...) comes back as the
expression itself, which the page shows beside the words anyway. It never raises: the schedule
text comes from the database, and an unexpected value must not break a page.
"""

from __future__ import annotations

import re

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_DAY_NAMES = {name[:3].lower(): index for index, name in enumerate(_DAYS)}
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_NUMBER = re.compile(r"^\d{1,2}\Z")
_STEP = re.compile(r"^(?:\*|0)/(\d{1,2})\Z")


ON_DEMAND = "on demand"


def describe_schedule(schedule: str | None) -> str:
    """The schedule in words (in the job's own time zone, which the pages show beside it), or the
    expression unchanged."""
    try:
        text = _describe(str(schedule or "").strip())
    except Exception:   # words are a courtesy: any surprise shows the expression itself
        text = None
    return str(schedule or "") if text is None else text


_ORDINALS = {"1": "first", "2": "second", "3": "third", "4": "fourth", "5": "fifth", "L": "last"}
_KINDS = {"MON-FRI": "weekday", "1-5": "weekday", "SAT-SUN": "weekend day", "6-7": "weekend day"}


def _describe(expression: str) -> str | None:
    if not expression:
        return ON_DEMAND
    if ";" in expression:
        # The extended form: the six fields in words, then each clause as written.
        cron, *clauses = expression.split(";")
        head = _describe(cron.strip())
        if head is None or head == cron.strip():
            return None
        return "; ".join([head, *(" ".join(c.split()) for c in clauses)])
    if expression.lower().startswith("@once"):
        moment = expression[len("@once"):].strip()
        return f"once, at {moment}" if moment else None
    fields = expression.split()
    if len(fields) != 6:
        return None
    second, minute, hour, day, month, weekday = fields
    days = _days(day, month, weekday)
    if days is None:
        return None
    if second == "*" and minute == "*" and hour == "*":
        return _with_days("every second", days)
    step = _STEP.match(second)
    if step and minute == "*" and hour == "*":
        return _with_days(_every(int(step.group(1)), "second"), days)
    if not _NUMBER.match(second):
        return None
    sec = int(second)
    if minute == "*" and hour == "*":
        return _with_days("every minute" + (f", at second {sec}" if sec else ""), days)
    step = _STEP.match(minute)
    if step and hour == "*":
        return _with_days(_every(int(step.group(1)), "minute") + (f", at second {sec}" if sec else ""), days)
    if not _NUMBER.match(minute):
        return None
    mins = int(minute)
    if hour == "*":
        return _with_days(f"every hour, at minute {mins}" + (f" second {sec}" if sec else ""), days)
    step = _STEP.match(hour)
    if step:
        return _with_days(f"{_every(int(step.group(1)), 'hour')}, at minute {mins}", days)
    hours = hour.split(",")
    if not all(_NUMBER.match(h) for h in hours) or len(hours) > 6:
        return None
    times = [_clock(int(h), mins, sec) for h in hours]
    at = "at " + (times[0] if len(times) == 1 else ", ".join(times[:-1]) + " and " + times[-1])
    return f"{at}, {days}" if days else f"{at} every day"


def _every(count: int, unit: str) -> str:
    return f"every {unit}" if count == 1 else f"every {count} {unit}s"


def _clock(hour: int, minute: int, second: int) -> str:
    return f"{hour:02d}:{minute:02d}" + (f":{second:02d}" if second else "")


def _with_days(text: str, days: str) -> str:
    return f"{text}, {days}" if days else text


def _days(day: str, month: str, weekday: str) -> str | None:
    """The day part: "" for every day, words for the shapes we know, None otherwise."""
    parts = []
    if day != "*":
        special = _day_token(day)
        if special is None and not _NUMBER.match(day):
            return None
        parts.append(special or f"on day {int(day)} of the month")
    if weekday != "*":
        if day != "*":
            return None
        weekdays = _weekday_token(weekday) or _weekdays(weekday)
        if weekdays is None:
            return None
        parts.append(weekdays)
    if month != "*":
        if not _NUMBER.match(month) or not 1 <= int(month) <= 12:
            return None
        parts.append(f"in {_MONTHS[int(month) - 1]}")
    return " ".join(parts)


def _day_token(field: str) -> str | None:
    """L, LW, nW in words, or None."""
    upper = field.upper()
    if upper == "L":
        return "on the last day of the month"
    if upper == "LW":
        return "on the last weekday of the month"
    if upper.endswith("W") and _NUMBER.match(upper[:-1]):
        return f"on the weekday nearest day {int(upper[:-1])} of the month"
    return None


def _weekday_token(field: str) -> str | None:
    """d#n, dL, d#L, a-b#n (MON-FRI#2: the second weekday) in words, or None."""
    upper = field.upper()
    if "#" in upper:
        kinds, _, which = upper.partition("#")
    elif upper.endswith("L") and len(upper) > 1 and "-" not in upper:
        kinds, which = upper[:-1], "L"
    else:
        return None
    ordinal = _ORDINALS.get(which)
    if ordinal is None:
        return None
    if kinds in _KINDS:
        what = _KINDS[kinds]
    else:
        day = _weekday(kinds)
        if day is None:
            return None
        what = _DAYS[day]
    return f"on the {ordinal} {what} of the month"


def _weekday(text: str) -> int | None:
    if _NUMBER.match(text) and int(text) <= 7:
        return int(text) % 7
    return _DAY_NAMES.get(text.lower())


def _weekdays(field: str) -> str | None:
    if "-" in field and "," not in field:
        first, _, last = field.partition("-")
        start, end = _weekday(first), _weekday(last)
        if start is None or end is None:
            return None
        return f"{_DAYS[start]} to {_DAYS[end]}"
    names = [_weekday(part) for part in field.split(",")]
    if any(name is None for name in names):
        return None
    words = [_DAYS[name] for name in names]
    return "on " + (words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1])
