"""The documentation is the user's entry point: it must name every setting and every command the
code has, with the defaults the code uses. The README keeps the quick start; the settings tables
live in docs/configuration.md and the command table in docs/operations.md, both linked from it."""

from pathlib import Path

from shared.cli.commands import COMMANDS
from shared.cli.parser import build_parser
from shared.jobs.from_settings import JOB_DEFAULTS, JOB_SETTING_SUFFIXES
from shared.settings import ENGINE_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
OPERATIONS = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")


def test_every_engine_setting_and_its_default_is_documented():
    for spec in ENGINE_SETTINGS:
        row = next((line for line in CONFIGURATION.splitlines() if line.startswith(f"| `{spec.name}` |")), None)
        assert row is not None, f"{spec.name} missing from the configuration table (docs/configuration.md)"
        if spec.default:
            assert f"`{spec.default}`" in row, f"{spec.name}: default {spec.default!r} not in {row!r}"


def test_every_job_setting_and_its_default_is_documented():
    for suffix in JOB_SETTING_SUFFIXES:
        row = next((line for line in CONFIGURATION.splitlines()
                    if line.startswith(f"| `JOB__<name>__{suffix}` |")), None)
        assert row is not None, f"JOB__<name>__{suffix} missing from the job settings table (docs/configuration.md)"
        if suffix in JOB_DEFAULTS:
            assert f"`{JOB_DEFAULTS[suffix]}`" in row, f"{suffix}: default {JOB_DEFAULTS[suffix]!r} not in {row!r}"


def test_every_command_is_documented():
    rows = [line for line in OPERATIONS.splitlines() if line.startswith("| `")]
    for name in COMMANDS:
        assert any(row.startswith(f"| `{name}") or f", `{name}" in row.split("|")[1] for row in rows), \
            f"command {name} missing from the command table (docs/operations.md)"
    assert build_parser().prog in README and build_parser().prog in OPERATIONS


def test_the_readme_links_the_pages_holding_the_tables():
    assert "(docs/configuration.md)" in README and "(docs/operations.md)" in README


def test_quick_start_commands_exist():
    for script in ("scripts/run-local.sh", "scripts/test.sh"):
        assert script in README and (ROOT / script).exists()
