"""The README is the user's entry point: it must name every setting and every command the
code has, with the defaults the code uses."""

from pathlib import Path

from shared.cli import COMMANDS, build_parser
from shared.config import ENGINE_SETTINGS, JOB_DEFAULTS, JOB_SETTING_SUFFIXES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_every_engine_setting_and_its_default_is_documented():
    for spec in ENGINE_SETTINGS:
        row = next((line for line in README.splitlines() if line.startswith(f"| `{spec.name}` |")), None)
        assert row is not None, f"{spec.name} missing from the configuration table"
        if spec.default:
            assert f"`{spec.default}`" in row, f"{spec.name}: default {spec.default!r} not in {row!r}"


def test_every_job_setting_and_its_default_is_documented():
    for suffix in JOB_SETTING_SUFFIXES:
        row = next((line for line in README.splitlines() if line.startswith(f"| `JOB__<name>__{suffix}` |")), None)
        assert row is not None, f"JOB__<name>__{suffix} missing from the job settings table"
        if suffix in JOB_DEFAULTS:
            assert f"`{JOB_DEFAULTS[suffix]}`" in row, f"{suffix}: default {JOB_DEFAULTS[suffix]!r} not in {row!r}"


def test_every_command_is_documented():
    for name in COMMANDS:
        assert f"`{name}" in README, f"command {name} missing from the README"
    assert build_parser().prog in README


def test_quick_start_commands_exist():
    root = Path(__file__).resolve().parent.parent
    for script in ("scripts/run-local.sh", "scripts/test.sh"):
        assert script in README and (root / script).exists()
