"""Every numeric argument of every command, found in the parser itself (a new one cannot escape
these tests): a value that is not a plain number in its range is a usage error (exit 2, kind
`usage`) naming the argument, the value and the range, in the text and the --json form; the range's
ends are taken. Repeated single-value options are refused the same way (issue 34, item 9).

The database side of the ranges (the largest id, limit and age each dialect takes) is
tests/integration/test_cli_json.py's test_the_ends_of_every_range_reach_the_database."""

from __future__ import annotations

import argparse
import json

import pytest

from shared.cli.commands import main
from shared.cli.output import EXIT_USAGE
from shared.cli.parser import Number, _iso_datetime, build_parser

# Values that are no plain number, whatever the range: Python's int() or float() takes most of them.
NOT_NUMBERS = ["", " ", "1e20", "1E3", "nan", "NaN", "inf", "-inf", "Infinity", "0x10", "0o7", "0b1", " 5 ", "5 ",
               "+5", "1_000", "５", "٣", "𝟓", "1,000", "5.", "five", "5s", "\x00", "5\n", "--", "1e-3"]


@pytest.fixture(autouse=True)
def _nowhere(tmp_path, monkeypatch):
    """No database to reach: a command line that got past its checks fails here, not in a
    database of the working directory's."""
    for key in [k for k in __import__("os").environ if k.startswith(("AGENT_", "JOB__"))]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub is not parser:
                    yield from _walk(sub, (*path, name))


def _leaf_commands():
    """(command path, its parser) for every command that runs (no sub-commands of its own)."""
    for path, parser in _walk(build_parser()):
        if path and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            yield path, parser


def _required_arguments(parser: argparse.ArgumentParser, leave_out: argparse.Action | None) -> list[str]:
    """A command line's minimum besides ``leave_out``: its positionals, required options, and one
    option of each required exclusive group."""
    line: list[str] = []
    for group in parser._mutually_exclusive_groups:
        if group.required and leave_out not in group._group_actions:
            line.append(group._group_actions[0].option_strings[-1])
    for action in parser._actions:
        if action is leave_out or isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            if action.choices:
                line.append(sorted(action.choices)[0])
            else:
                line.append(str(action.type.low) if isinstance(action.type, Number) else "x")
        elif action.required:
            # A time where a time is required (backfill --from/--to), else any text.
            line += [action.option_strings[-1], "2000-01-01T00:00:00Z" if action.type is _iso_datetime else "x"]
    return line


def _number_arguments():
    for path, parser in _leaf_commands():
        for action in parser._actions:
            if isinstance(action.type, Number):
                yield path, parser, action


NUMBER_ARGUMENTS = list(_number_arguments())
IDS = [f"{' '.join(path)} {action.option_strings[-1] if action.option_strings else action.metavar}"
       for path, _, action in NUMBER_ARGUMENTS]


def test_every_typed_argument_is_a_number_or_a_time():
    """A numeric argument must be a Number (the checks below then cover it): a bare int or float
    takes ' 5 ', '+5', '５', 'nan' and numbers no column holds."""
    for path, parser in _leaf_commands():
        for action in parser._actions:
            if action.type is not None:
                assert isinstance(action.type, Number) or action.type is _iso_datetime, (path, action.dest, action.type)
    assert len(NUMBER_ARGUMENTS) >= 15, IDS


def _command_line(path, parser, action, value: str) -> list[str]:
    base = [*path, *_required_arguments(parser, action)]
    if action.option_strings:
        return [*base, f"{action.option_strings[-1]}={value}"]
    return [*base, "--", value] if value.startswith("-") else [*base, value]


def _refused(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(argv)
    out, err = capsys.readouterr()
    return exit.value.code, out, err


def _bad_values(number: Number) -> list[str]:
    outside = [str(number.low - 1), str(number.high + 1), "-1", "0", "9223372036854775808", "-9223372036854775809",
               str(10**30)]
    if not number.whole:
        outside += ["1.5e3", f"{number.high}.5"]
    else:
        outside += ["1.5", "1.0"]
    taken = {str(number.low), str(number.high)} if not number.above_low else {str(number.high)}
    return [v for v in NOT_NUMBERS + outside if v not in taken and not (_fits(number, v))]


def _fits(number: Number, text: str) -> bool:
    try:
        number(text)
        return True
    except argparse.ArgumentTypeError:
        return False


@pytest.mark.parametrize("path, parser, action", NUMBER_ARGUMENTS, ids=IDS)
def test_a_bad_number_is_one_usage_error_naming_the_argument_value_and_range(capsys, path, parser, action):
    number: Number = action.type
    name = action.option_strings[-1] if action.option_strings else action.metavar
    bad = _bad_values(number)
    assert str(number.high + 1) in bad and str(10**30) in bad and "1e20" in bad and "nan" in bad
    for value in bad:
        argv = _command_line(path, parser, action, value)
        code, out, err = _refused(capsys, ["--json", *argv])
        assert (code, out) == (EXIT_USAGE, ""), (argv, code, out, err)
        lines = err.strip("\n").split("\n")
        assert len(lines) == 1, (argv, err)
        error = json.loads(lines[0])
        assert error["kind"] == "usage" and error["setting"] == name, (argv, error)
        shown = "--" if value == "--" else value       # argparse hands on no value for `--limit=--`
        assert error["value"] == shown and error["expected"] == number.expected, (argv, error)
        assert name in error["error"] and repr(shown) in error["error"] and number.expected in error["error"], error
        code, out, err = _refused(capsys, argv)                  # the text form: one line too
        assert (code, out) == (EXIT_USAGE, ""), (argv, code, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert name in err and repr(shown) in err and number.expected in err, (argv, err)


@pytest.mark.parametrize("path, parser, action", NUMBER_ARGUMENTS, ids=IDS)
def test_both_ends_of_each_range_are_taken(path, parser, action):
    number: Number = action.type
    ends = [number.high] + ([] if number.above_low else [number.low])
    if not number.whole:
        ends.append(0.5)
    for value in ends:
        args = build_parser().parse_args(_command_line(path, parser, action, str(value)))
        assert getattr(args, action.dest) == value


def test_a_single_value_option_given_twice_is_refused(capsys):
    options = [(path, parser, action) for path, parser in _leaf_commands() for action in parser._actions
               if action.option_strings and action.nargs is None and isinstance(action, argparse._StoreAction)]
    assert len(options) >= 20
    for path, parser, action in options:
        name = action.option_strings[-1]
        value = str(action.type.high) if isinstance(action.type, Number) else (
            "2999-01-01T00:00:00Z" if action.type is _iso_datetime else "x")
        argv = [*path, *_required_arguments(parser, action), name, value, name, value]
        code, out, err = _refused(capsys, ["--json", *argv])
        error = json.loads(err)
        assert (code, out, error["kind"], error["setting"]) == (EXIT_USAGE, "", "usage", name), (argv, error)
        assert "more than once" in error["error"], error
        # Each value as it was written, not Python's repr of what it was parsed to (an attack saw
        # "datetime.datetime(2999, 1, 1, 0, 0, tzinfo=datetime.timezone.utc)").
        assert "datetime" not in error["error"] and "datetime" not in str(error["value"]), error
    # The top level's own options too.
    code, _, err = _refused(capsys, ["--json", "--db", "sqlite:///a.db", "--db", "sqlite:///b.db", "jobs"])
    assert code == EXIT_USAGE and json.loads(err)["setting"] == "--db"


def test_a_repeatable_option_still_repeats():
    args = build_parser().parse_args(["grant-sql", "--app-name", "a", "--execute-schema", "s1", "--execute-schema", "s2"])
    assert args.execute_schema == ["s1", "s2"]


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-05:00"])
def test_a_time_past_the_calendar_after_its_offset_is_a_usage_error(capsys, value):
    for command in (["tick", "--now", value], ["pause", "job", "--until", value]):
        code, out, err = _refused(capsys, ["--json", *command])
        error = json.loads(err)
        assert (code, out, error["kind"], error["value"]) == (EXIT_USAGE, "", "usage", value), error
        assert "between years 1 and 9999" in error["expected"], error


def test_the_operations_page_gives_every_numeric_arguments_range():
    """docs/operations.md's table of ranges names each numeric argument with the range the
    parser enforces."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `") and (" to " in line or "at most" in line)]
    for path, _, action in NUMBER_ARGUMENTS:
        number: Number = action.type
        name = action.option_strings[-1] if action.option_strings else action.metavar
        written = f"`{' '.join(path)} {name}`"
        (row,) = [line for line in rows if written in line] or [None]
        assert row is not None, f"docs/operations.md has no range for {written}"
        shown = f"above {number.low}, at most {number.high}" if number.above_low else f"{number.low} to {number.high}"
        assert shown in row, (written, shown, row)


def test_bytes_that_are_not_utf8_are_a_usage_error_naming_the_argument(capsys):
    """A command line's bytes that are not UTF-8 (Python keeps them as lone surrogates) cannot be
    a job name, SQL or a reason the database stores: a usage error, not a driver's encoding failure
    (exit 1); a file path keeps its bytes."""
    for argv, name in ((["run-now", "\udcff"], "NAME"), (["history", "--job", "x\udcff"], "--job"),
                       (["submit", "--sql", "SELECT '\udcff'"], "--sql"),
                       (["pause", "job", "--reason", "\udce9t\udce9"], "--reason"),
                       (["grant-sql", "--app-name", "a", "--execute-schema", "s\udcff"], "--execute-schema")):
        code, out, err = _refused(capsys, ["--json", *argv])
        error = json.loads(err)
        assert (code, out, error["kind"], error["setting"]) == (EXIT_USAGE, "", "usage", name), error
        assert "\\xff" in error["value"] or "\\xe9" in error["value"], error
        assert error["expected"] == "UTF-8 text"
    args = build_parser().parse_args(["import-sqlagent", "/tmp/\udcff.sql"])
    assert args.files == ["/tmp/\udcff.sql"]
