"""Reading the Bicep in infra/ from tests, without the Bicep CLI (it cannot be installed here).

The Bicep files are parsed by pycep-parser, the parser Checkov itself uses for Bicep. Checkov
and pycep live in their own virtual environment (.checkov-venv, created by scripts/test.sh from
requirements-checkov.txt) so the test process cannot import them: `parse_bicep_files()` runs
pycep in a subprocess with .checkov-venv/bin/python and reads its JSON.

How pycep represents Bicep (what the accessors below rely on):
  - a literal string and an identifier are both plain JSON strings ('AGENT_QUEUE_NAME' and
    `queueName` both come out as "AGENT_QUEUE_NAME" / "queueName"); `resolve()` looks a name up
    in the file's variables and parameters and otherwise takes it as a literal;
  - an interpolated string keeps its text: 'JOB__${job.name}__SCHEDULE';
  - `a.b.c` is {"operator": {"type": "property_accessor", "operands": {"operand_1": "a",
    "operand_2": <b.c>}}} (right-nested); the safe-dereference `?` is not kept;
  - a function call is {"function": {"type": <name>, "parameters": {...}}};
  - a for-expression is {"loop_type": {"type": "array", "detail": {"item_name", "array_name"}},
    "condition": ..., "config": <body>}.
Anything else makes the accessors raise BicepShapeError with the expression, so a change to
the Bicep that these tests do not understand fails loudly instead of passing unchecked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
CHECKOV_VENV = REPO / ".checkov-venv"
CHECKOV_PYTHON = CHECKOV_VENV / "bin" / "python"
CHECKOV_BIN = CHECKOV_VENV / "bin" / "checkov"
ENABLE_HINT = (
    "Checkov (and its Bicep parser, pycep-parser) is not installed in .checkov-venv. "
    "Run scripts/test.sh, or: python3.11 -m venv .checkov-venv && "
    ".checkov-venv/bin/pip install -r requirements-checkov.txt"
)

# Runs inside .checkov-venv: parses every file named on the command line with pycep and
# prints {path: {"tree": ...} | {"error": ...}} as JSON.
_PYCEP_DUMP = r"""
import json, sys
from pycep import BicepParser
parser = BicepParser()
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, encoding="utf-8") as handle:
            out[path] = {"tree": parser.parse(text=handle.read())}
    except Exception as exc:
        out[path] = {"error": f"{type(exc).__name__}: {exc}"}
json.dump(out, sys.stdout, default=str)
"""


class BicepShapeError(AssertionError):
    """The Bicep uses a construct these helpers do not interpret."""


def require_checkov_venv() -> None:
    """Skip on a developer machine, fail in CI (CI=true), when .checkov-venv is missing."""
    if CHECKOV_PYTHON.is_file() and CHECKOV_BIN.is_file():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Checkov is required in CI: {ENABLE_HINT}", pytrace=False)
    pytest.skip(ENABLE_HINT)


def bicep_paths() -> list[Path]:
    return sorted(INFRA.glob("*.bicep"))


@lru_cache(maxsize=1)
def _parse_all() -> dict[str, dict[str, Any]]:
    paths = [str(path) for path in bicep_paths()]
    completed = subprocess.run(
        [str(CHECKOV_PYTHON), "-c", _PYCEP_DUMP, *paths],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if completed.returncode != 0:
        raise AssertionError(f"pycep subprocess failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(completed.stdout)


def parse_errors() -> dict[str, str]:
    """{file name: error} for every Bicep file pycep could not parse."""
    require_checkov_venv()
    return {Path(path).name: result["error"] for path, result in _parse_all().items() if "error" in result}


def bicep(name: str) -> "BicepFile":
    """The parsed tree of infra/<name>."""
    require_checkov_venv()
    result = _parse_all().get(str(INFRA / name))
    if result is None:
        raise AssertionError(f"infra/{name} does not exist")
    if "error" in result:
        raise AssertionError(f"pycep cannot parse infra/{name}: {result['error']}")
    return BicepFile(name, result["tree"])


@dataclass(frozen=True)
class BicepFile:
    name: str
    tree: dict[str, Any]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.tree.get("parameters") or {}

    @property
    def variables(self) -> dict[str, Any]:
        return self.tree.get("variables") or {}

    @property
    def resources(self) -> dict[str, Any]:
        return self.tree.get("resources") or {}

    @property
    def modules(self) -> dict[str, Any]:
        return self.tree.get("modules") or {}

    @property
    def outputs(self) -> dict[str, Any]:
        return self.tree.get("outputs") or {}

    def variable(self, name: str) -> Any:
        if name not in self.variables:
            raise BicepShapeError(f"{self.name}: no variable {name!r}")
        return self.variables[name]["value"]

    def resources_of_type(self, resource_type: str) -> dict[str, Any]:
        return {symbol: resource for symbol, resource in self.resources.items()
                if resource["type"].lower() == resource_type.lower()}

    def only_resource(self, resource_type: str, *, existing: bool = False) -> tuple[str, dict[str, Any]]:
        found = {symbol: resource for symbol, resource in self.resources_of_type(resource_type).items()
                 if bool(resource.get("existing")) == existing}
        if len(found) != 1:
            raise BicepShapeError(f"{self.name}: expected one {resource_type} (existing={existing}), "
                                  f"found {sorted(found)}")
        return next(iter(found.items()))

    def resolve(self, expression: Any) -> Any:
        """A plain name that is a variable becomes its value (recursively); anything else is
        returned as is (a literal, a parameter name, or an expression tree)."""
        seen: set[str] = set()
        while isinstance(expression, str) and expression in self.variables and expression not in seen:
            seen.add(expression)
            expression = self.variables[expression]["value"]
        return expression

    def parameter_default(self, name: str) -> Any:
        if name not in self.parameters:
            raise BicepShapeError(f"{self.name}: no parameter {name!r}")
        return self.parameters[name].get("default")

    def decorators(self, name: str) -> dict[str, Any]:
        """{decorator type: argument} of a parameter, e.g. {'allowed': [...], 'minValue': 1}."""
        result: dict[str, Any] = {}
        for decorator in self.parameters[name].get("decorators") or []:
            result[decorator["type"]] = decorator.get("argument")
        return result


# ------------------------------------------------------------------ expression shapes


def function_call(expression: Any, name: str) -> dict[str, Any] | None:
    """The parameters of a call to function `name` (pycep's name, e.g. 'subscription_resource_id'),
    or None when `expression` is something else."""
    if isinstance(expression, dict) and "function" in expression:
        function = expression["function"]
        if function.get("type") == name:
            return function.get("parameters") or {}
    return None


def accessor_path(expression: Any) -> list[str]:
    """`a.b.c` as ['a', 'b', 'c']; a plain name as [name]."""
    if isinstance(expression, str):
        return [expression]
    if isinstance(expression, dict) and expression.get("operator", {}).get("type") == "property_accessor":
        operands = expression["operator"]["operands"]
        return accessor_path(operands["operand_1"]) + accessor_path(operands["operand_2"])
    raise BicepShapeError(f"not a property access: {json.dumps(expression)[:300]}")


def body(declaration: dict[str, Any]) -> dict[str, Any]:
    """The `{ ... }` of a resource or module; `= if (condition) { ... }` nests it once more."""
    config = declaration["config"]
    if isinstance(config, dict) and "condition" in config and "config" in config:
        return config["config"]
    return config


def is_loop(expression: Any) -> bool:
    return isinstance(expression, dict) and "loop_type" in expression


# ------------------------------------------------------------------ Checkov


@dataclass(frozen=True)
class CheckovResult:
    summary: dict[str, Any]
    passed: list[dict[str, Any]]
    failed: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    parsing_errors: list[str]
    command: list[str]


# ------------------------------------------------------------------ network profiles
#
# Checkov reads Bicep without evaluating it: a value written `isPrivate ? 'Disabled' : 'Enabled'`
# is neither 'Disabled' nor 'Enabled' to it. So each network profile (main.bicep's networkProfile,
# handed to each module, which derives `var isPrivate = networkProfile == 'private'`) is rendered
# before it is scanned: every `isPrivate ? A : B` becomes A (private) or B (public), and for the
# private profile the inline skips that concern the public profile alone (their reason starts with
# "(networkProfile public)") are removed, so Checkov runs those checks and they must pass.

NETWORK_PROFILES = ("public", "private")
PUBLIC_ONLY_SKIP = "(networkProfile public)"
_OPERAND = r"(?:'[^'\n]*'|true|false|null|-?\d+|[A-Za-z_][\w.]*)"
_PROFILE_CONDITIONAL = re.compile(rf"\bisPrivate \? ({_OPERAND}) : ({_OPERAND})")


def render_profile(text: str, profile: str) -> str:
    """One Bicep file's text as Checkov should see it for `profile`."""
    if profile not in NETWORK_PROFILES:
        raise ValueError(f"network profile {profile!r}: expected one of {NETWORK_PROFILES}")
    index = 1 if profile == "private" else 2
    rendered = _PROFILE_CONDITIONAL.sub(lambda match: match.group(index), text)
    left = re.findall(r"[^\n]*\bisPrivate \?[^\n]*", rendered)
    if left:
        raise BicepShapeError(f"profile conditionals this renderer cannot resolve (write `isPrivate ? A : B` with "
                              f"literal or name operands): {left}")
    if profile == "private":
        rendered = "\n".join(line for line in rendered.split("\n")
                              if not (SKIP_COMMENT.search(line) and PUBLIC_ONLY_SKIP in line))
    return rendered


def render_infra(profile: str, destination: Path) -> Path:
    """A copy of infra/ rendered for `profile` (see render_profile)."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in INFRA.iterdir():
        if path.suffix == ".bicep":
            (destination / path.name).write_text(render_profile(path.read_text(encoding="utf-8"), profile), encoding="utf-8")
        elif path.is_file():
            (destination / path.name).write_bytes(path.read_bytes())
    return destination


def run_checkov(*, with_repo_config: bool = False, directory: Path | None = None) -> CheckovResult:
    """`checkov -d infra --framework bicep` with JSON output. --skip-download keeps it offline
    (no Prisma Cloud guideline download; the checks are the same). Run from the repository
    root it reads `.checkov.yaml` (the graph-check skips Checkov cannot take inline); without
    ``with_repo_config`` it runs from elsewhere, so every skip must be an inline one.
    ``directory``: another folder to scan (a profile's rendering of infra/)."""
    require_checkov_venv()
    import tempfile

    command = [str(CHECKOV_BIN), "-d", str(directory or REPO / "infra"), "--framework", "bicep",
               "--output", "json", "--compact", "--skip-download"]
    with tempfile.TemporaryDirectory() as elsewhere:
        completed = subprocess.run(command, cwd=REPO if with_repo_config else elsewhere, capture_output=True,
                                   text=True, timeout=600, check=False)
    try:
        document = json.loads(completed.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"checkov printed no JSON (exit {completed.returncode}):\n"
                             f"{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}") from None
    if isinstance(document, list):  # one report per framework; we ask for bicep only
        reports = [report for report in document if report.get("check_type") == "bicep"]
        if len(reports) != 1:
            raise AssertionError(f"expected one bicep report, got {[r.get('check_type') for r in document]}")
        document = reports[0]
    results = document.get("results", {})
    return CheckovResult(
        summary=document.get("summary", {}),
        passed=results.get("passed_checks", []),
        failed=results.get("failed_checks", []),
        skipped=results.get("skipped_checks", []),
        parsing_errors=results.get("parsing_errors", []),
        command=command,
    )


# The inline suppression syntax, as Checkov parses it (checkov/common/comment/enum.py,
# COMMENT_REGEX in checkov 3.3.30): `checkov:skip=<CHECK_ID>[,<CHECK_ID>...][:<reason>]`.
SKIP_COMMENT = re.compile(r"(checkov:skip=|bridgecrew:skip=|cortex:skip=) *([A-Za-z_\d-]+(?:,[A-Za-z_\d-]+)*)?(:[^\n]*)?")


@dataclass(frozen=True)
class InlineSkip:
    file: str
    line: int
    check_id: str
    reason: str


def skip_comments(file: str, number: int, line: str) -> list[InlineSkip]:
    """The inline skips on one source line (a comment may name several checks)."""
    match = SKIP_COMMENT.search(line)
    if not match or not match.group(2):
        return []
    reason = (match.group(3) or "")[1:].strip()
    return [InlineSkip(file, number, check_id, reason) for check_id in match.group(2).split(",")]


def inline_skips(path: Path) -> list[InlineSkip]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [skip for number, line in enumerate(lines, start=1) for skip in skip_comments(path.name, number, line)]
