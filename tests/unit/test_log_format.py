"""Log records keep the documented format (docs/operations.md, "Log records") on every path
(issue 34, item 11): one line of text, `TIME LEVEL LOGGER: MESSAGE`, with an exception summed up
on the same line and control characters escaped; under --json one JSON object per line, the
traceback in `exception`. What no code of the agent writes (Python's warnings, an error no code
caught in a thread, at the top of the command or in a finalizer) is a record too."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shared.cli.output import JsonLogFormatter, TextLogFormatter

ROOT = Path(__file__).resolve().parents[2]
TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.\-]+: \S")


def _record(message: str, *args, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = None
    if exc is not None:
        try:
            raise exc
        except BaseException as raised:  # noqa: BLE001 - a real traceback for the record
            exc_info = (type(raised), raised, raised.__traceback__)
    return logging.LogRecord("shared.web.app", logging.ERROR, __file__, 1, message, args, exc_info)


def test_a_text_record_is_one_line_with_its_exception_and_no_control_characters():
    record = _record("monitor: GET %s failed", "/jobs/\x1b[2Jx\ny\r\u0085z", exc=ValueError("bad\nvalue"))
    line = TextLogFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u0085" not in line, repr(line)
    assert TEXT_RECORD.match(line), line
    assert line.split(" ", 2)[2].startswith("ERROR shared.web.app: monitor: GET /jobs/\\x1b[2Jx\\ny\\r\\x85z failed")
    assert line.endswith(f"[ValueError: bad\\nvalue at {__file__}:{_raise_line()} in _record]"), line


def _raise_line() -> int:
    source = Path(__file__).read_text(encoding="utf-8").splitlines()
    return next(number for number, text in enumerate(source, 1) if text.strip() == "raise exc")


def test_a_json_record_is_one_object_on_one_line_with_the_traceback():
    line = JsonLogFormatter().format(_record("a\nb", exc=KeyError("k")))
    assert "\n" not in line
    document = json.loads(line)
    assert document["message"] == "a\nb" and document["level"] == "ERROR" and document["logger"] == "shared.web.app"
    assert document["exception"].startswith("Traceback") and "KeyError: 'k'" in document["exception"]


PROGRAM = r"""
import argparse, gc, sys, threading, warnings
from shared.cli.output import configure_logging

configure_logging(argparse.Namespace(json={json}, verbose=True, command="monitor"), process=True)
warnings.warn("a library's warning")
thread = threading.Thread(target=lambda: 1 / 0, name="worker-7")
thread.start()
thread.join()

class Finalized:
    def __del__(self):
        raise RuntimeError("in a finalizer")

Finalized()
gc.collect()
raise LookupError("nobody caught this")
"""


@pytest.mark.parametrize("form", ["json", "text"])
def test_what_no_code_of_the_agent_writes_is_a_record_too(form):
    completed = subprocess.run([sys.executable, "-c", PROGRAM.replace("{json}", str(form == "json"))], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1 and completed.stdout == "", completed
    lines = completed.stderr.splitlines()
    assert len(lines) == 4, completed.stderr          # the warning, the thread, the finalizer, the top
    assert "Traceback" not in (completed.stderr if form == "text" else "".join(
        json.loads(line)["message"] for line in lines))
    if form == "json":
        records = [json.loads(line) for line in lines]
        assert [r["level"] for r in records] == ["WARNING", "CRITICAL", "WARNING", "CRITICAL"], records
        assert "a library's warning" in records[0]["message"]
        assert "worker-7" in records[1]["message"] and "ZeroDivisionError" in records[1]["exception"]
        assert "RuntimeError: in a finalizer" in records[2]["exception"]
        assert "LookupError: nobody caught this" in records[3]["exception"]
    else:
        for line in lines:
            assert TEXT_RECORD.match(line), line
        assert "ZeroDivisionError" in lines[1] and "LookupError" in lines[3]
