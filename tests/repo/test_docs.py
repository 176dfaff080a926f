"""The README and the pages of docs/ as a newcomer uses them.

* The README stays a first-hour read (at most ~250 lines) and links every page of docs/.
* Every relative link in README.md and docs/*.md resolves: the file exists, and a `#anchor`
  names a heading of that file (GitHub's heading ids).
* Every command line of the operator CLI in them runs as written after the quick start: it is
  the `.venv/bin/sql-agent` the quick start installs (or `.venv/bin/python -m shared.cli`, the
  same; never a bare `python`, which has none of the requirements; a bare `sql-agent` only as
  `pipx install .` gives it), and the arguments parse with the real parser,
  `shared.cli.commands.build_parser()`.
  Shell variables (`$APP`) stand for values. Found, not listed: a command documented later is
  checked too. The same holds for the command line the Bicep prints (`grantSqlCommand`).
* Every repository path a documented command uses exists (`scripts/...`, `infra/...`).
* The publish command names the project's language (`--python`): a fresh clone has no
  local.settings.json, so Core Tools cannot tell it otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
# The pages the README points a newcomer to, by task.
PAGES = ("configuration", "operations", "azure-sql", "queue", "deploying", "monitoring",
         "guarantees-and-limits", "performance", "monitor", "fleet")
# Code blocks that show output or formats, not commands to type.
NOT_COMMANDS = {"text", "json", "sql", "kusto", "python", "yaml", "ini", "bicep"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VENV_PYTHON = ".venv/bin/python"
VENV_COMMAND = ".venv/bin/sql-agent"
INSTALLED_COMMAND = "sql-agent"            # after `pipx install .` (docs/operations.md)


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True)
class Snippet:
    file: Path
    line: int
    text: str
    kind: str            # "block:<info>" for a fenced code block line, "inline" for `code` in prose


def split_markdown(path: Path) -> tuple[list[Snippet], list[tuple[int, str]]]:
    """(code: every line of every fenced block, with continuation lines joined; prose lines)."""
    code: list[Snippet] = []
    prose: list[tuple[int, str]] = []
    fence: str | None = None
    info = ""
    pending: tuple[int, str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"^(`{3,}|~{3,})\s*([\w+-]*)", stripped)
            if match:
                fence, info = match.group(1), match.group(2).lower()
                continue
            prose.append((number, line))
            continue
        if stripped.startswith(fence):
            fence = None
            continue
        if pending is not None:
            start, text = pending
            line, number = text + " " + line.strip(), start
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        code.append(Snippet(path, number, line, f"block:{info}"))
    return code, prose


def inline_code(path: Path, prose: list[tuple[int, str]]) -> list[Snippet]:
    """`code` spans of the prose (a span may wrap onto the next line)."""
    spans = []
    text = "\n".join(line for _, line in prose)
    numbers = [number for number, _ in prose]
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        line_index = text.count("\n", 0, match.start())
        spans.append(Snippet(path, numbers[line_index] if numbers else 0, " ".join(match.group(1).split()), "inline"))
    return spans


def all_snippets() -> list[Snippet]:
    snippets = []
    for path in markdown_files():
        code, prose = split_markdown(path)
        snippets += code + inline_code(path, prose)
    return snippets


def simple_commands(snippet: Snippet) -> list[list[str]]:
    """The snippet as shell simple commands: comments dropped, split on ; && || |."""
    lexer = shlex.shlex(snippet.text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as error:          # not shell (e.g. an unbalanced quote in prose)
        if snippet.kind == "inline":
            return []
        raise AssertionError(f"{where(snippet)}: cannot read as shell: {error}: {snippet.text}")
    commands, current = [], []
    for token in tokens:
        if token in (";", "&&", "||", "|", "&"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    return [command for command in commands if command]


def where(snippet: Snippet) -> str:
    return f"{snippet.file.relative_to(ROOT)}:{snippet.line}"


@dataclass(frozen=True)
class CliCall:
    snippet: Snippet
    interpreter: str
    arguments: list[str]


def cli_calls(snippets: list[Snippet]) -> list[CliCall]:
    calls = []
    for snippet in snippets:
        if ("shared.cli" not in snippet.text and "sql-agent" not in snippet.text) or \
                snippet.kind.split(":", 1)[-1] in NOT_COMMANDS:
            continue
        for command in simple_commands(snippet):
            words = list(command)
            while words and ENV_ASSIGNMENT.match(words[0]):
                words.pop(0)
            redirect = next((i for i, word in enumerate(words) if re.match(r"^\d*(>>?|<)", word)), None)
            words = words[:redirect]         # `> file`: the shell's, not the command's
            # Without arguments in prose (`sql-agent`), the command is named, not run.
            if len(words) >= 3 and words[1] == "-m" and words[2] == "shared.cli":
                if len(words) > 3 or snippet.kind != "inline":
                    calls.append(CliCall(snippet, f"{words[0]} -m shared.cli", words[3:]))
            elif words and words[0].endswith("sql-agent") and (len(words) > 1 or snippet.kind != "inline"):
                calls.append(CliCall(snippet, words[0], words[1:]))
    return calls


class CliParseError(Exception):
    pass


def parse_cli(arguments: list[str]) -> argparse.Namespace:
    """The real parser's verdict on `arguments`: its namespace, or its error message."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(arguments)
    except SystemExit as exit:
        if exit.code == 0:                       # --help
            return argparse.Namespace(command="--help")
        raise CliParseError(errors.getvalue().strip().splitlines()[-1] if errors.getvalue() else f"exit {exit.code}")


# ---------------------------------------------------------------- the README


def test_the_readme_is_a_first_hour_read_that_links_every_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move sections to docs/"
    text = "\n".join(lines)
    for page in PAGES:
        assert (DOCS / f"{page}.md").is_file(), f"docs/{page}.md is missing"
    for page in sorted(DOCS.glob("*.md")):
        assert f"(docs/{page.name})" in text or f"(docs/{page.name}#" in text, \
            f"README.md does not link docs/{page.name}"
    for script in ("scripts/run-local.sh", "scripts/test.sh"):
        assert f"\n{script}" in text, f"the quick start lacks {script}"


# ---------------------------------------------------------------- links


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: markup removed, lowercased, punctuation dropped (letters,
    digits, spaces, '-' and '_' kept), spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # [text](link) -> text
    text = text.replace("`", "").replace("*", "").strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    _, prose = split_markdown(path)
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        anchor = github_anchor(match.group(1))
        if anchor in counts:
            counts[anchor] += 1
            anchor = f"{anchor}-{counts[anchor]}"
        else:
            counts[anchor] = 0
        found.add(anchor)
    return found


def links(path: Path) -> list[tuple[int, str]]:
    _, prose = split_markdown(path)
    found = []
    for number, line in prose:
        without_code = re.sub(r"`[^`]*`", "", line)
        for match in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", without_code):
            found.append((number, match.group(1)))
    return found


def test_the_anchor_rule_matches_github():
    assert github_anchor("Granting the app (`grant-sql`)") == "granting-the-app-grant-sql"
    assert github_anchor("`host.json` explained") == "hostjson-explained"
    assert github_anchor("Misfires: the agent was down at 13:00") == "misfires-the-agent-was-down-at-1300"
    assert github_anchor("Poison: the engine's table or the host's queue") == "poison-the-engines-table-or-the-hosts-queue"


def test_every_relative_link_resolves():
    checked = 0
    for path in markdown_files():
        for number, target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):        # https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            destination = (path.parent / file_part).resolve() if file_part else path
            place = f"{path.relative_to(ROOT)}:{number}: ({target})"
            assert destination.exists(), f"{place}: {file_part} does not exist"
            if anchor:
                assert destination.suffix == ".md", f"{place}: an anchor into a file that is not Markdown"
                assert anchor in anchors(destination), \
                    f"{place}: no heading #{anchor} in {destination.relative_to(ROOT)}"
            checked += 1
    assert checked >= len(PAGES), "hardly any links found: is the link pattern still right?"


# ---------------------------------------------------------------- commands


def test_every_cli_command_in_the_docs_uses_the_project_venv_and_parses():
    calls = cli_calls(all_snippets())
    assert len(calls) >= 10, f"only {len(calls)} sql-agent command lines found"
    subcommands = set()
    for call in calls:
        place = f"{where(call.snippet)}: {call.snippet.text.strip()}"
        assert call.interpreter in (VENV_COMMAND, f"{VENV_PYTHON} -m shared.cli", INSTALLED_COMMAND), (
            f"{place}: runs {call.interpreter!r}; documented commands run the project's {VENV_COMMAND} "
            f"(installed by the quick start), {VENV_PYTHON} -m shared.cli, or {INSTALLED_COMMAND} as "
            "`pipx install .` gives it")
        try:
            namespace = parse_cli(call.arguments)
        except CliParseError as error:
            pytest.fail(f"{place}: shared.cli does not accept it: {error}")
        subcommands.add(namespace.command)
    assert {"init-db", "grant-sql", "jobs", "history", "completion"} <= subcommands, sorted(subcommands)
    assert sum(call.interpreter == VENV_COMMAND for call in calls) >= 10


def test_the_parser_check_can_fail():
    with pytest.raises(CliParseError):
        parse_cli(["grant-sql", "--app-name", "<function", "app", "name>"])
    with pytest.raises(CliParseError):
        parse_cli(["no-such-command"])
    parse_cli(["--settings", "local.settings.json", "run-now", "hello"])


def test_no_documented_command_runs_a_bare_python_on_the_cli():
    bare = re.compile(r"(?<![\w./-])python3?(\.\d+)? -m shared\.cli\b")
    for snippet in all_snippets():
        if snippet.kind.split(":", 1)[-1] in NOT_COMMANDS:
            continue
        assert not bare.search(snippet.text), f"{where(snippet)}: {snippet.text.strip()}: use {VENV_PYTHON}"


def test_the_command_line_the_bicep_prints_parses():
    text = (ROOT / "infra" / "main.bicep").read_text(encoding="utf-8")
    (value,) = re.findall(r"^output grantSqlCommand string = '(.*)'$", text, flags=re.MULTILINE)
    words = shlex.split(re.sub(r"\$\{[^}]*\}", "APP", value))
    assert words[:3] == [VENV_PYTHON, "-m", "shared.cli"], value
    parse_cli(words[3:])


def test_repository_paths_in_documented_commands_exist():
    path_like = re.compile(r"^@?((?:scripts|bench|infra|tests|docs|shared|functions)/[\w./-]+)$")
    checked = 0
    for snippet in all_snippets():
        if snippet.kind == "inline" or snippet.kind.split(":", 1)[-1] in NOT_COMMANDS:
            continue
        for command in simple_commands(snippet):
            for word in command:
                match = path_like.match(word)
                if match:
                    assert (ROOT / match.group(1)).exists(), f"{where(snippet)}: {match.group(1)} does not exist"
                    checked += 1
            if command and command[0].startswith("scripts/"):
                assert (ROOT / command[0]).stat().st_mode & 0o111, f"{where(snippet)}: {command[0]} is not executable"
    assert checked >= 4


def test_the_publish_command_names_the_language():
    publishes = [(snippet, command) for snippet in all_snippets()
                 for command in (simple_commands(snippet) if "functionapp publish" in snippet.text else [])
                 if command[:4] == ["func", "azure", "functionapp", "publish"]]
    assert publishes, "the docs do not say how to publish"
    for snippet, command in publishes:
        assert "--python" in command, (
            f"{where(snippet)}: {' '.join(command)}: a fresh clone has no local.settings.json "
            "(FUNCTIONS_WORKER_RUNTIME), so Core Tools needs --python")
    assert any(s.file == DOCS / "deploying.md" and s.kind.startswith("block") for s, _ in publishes)
