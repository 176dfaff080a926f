"""T-SQL cut into tokens, and into batches at GO.

The lexer knows what SQL Server's own does about text: strings ('...' with '' inside, N'...'),
delimited identifiers ([...] with ]] inside, "..." with ""), nested block comments, line
comments, numbers (1, 1.5, 1e3, $1.25, 0x1F), @variables and @@functions, identifiers of any
Unicode letters. A string, identifier or comment that does not end is an error naming where it
starts: the file was cut short (or is not T-SQL).

GO is not T-SQL: it is the batch separator of SSMS and sqlcmd, recognised on a line of its own
(with an optional count, GO 5, and a trailing -- comment), outside strings and comments.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterator

from shared.errors import ScriptError

# Token kinds.
STRING, NUMBER, BINARY, VARIABLE, GLOBAL, NAME, OPERATOR, OTHER = (
    "string", "number", "binary", "variable", "global", "name", "operator", "other")

_TOKEN = re.compile(r"""
    (?:\s+|--[^\r\n]*)*                  # white space and line comments before the token
    (?:(?P<end>\Z)
  | (?P<block_comment>/\*)
  | (?P<string>[Nn]?'[^']*(?:''[^']*)*')
  | (?P<open_string>[Nn]?')
  | (?P<bracket>\[[^\]]*(?:\]\][^\]]*)*\])
  | (?P<open_bracket>\[)
  | (?P<quoted>"[^"]*(?:""[^"]*)*")
  | (?P<open_quoted>")
  | (?P<binary>0[xX][0-9A-Fa-f]*)
  | (?P<money>\$[ \t]*[+-]?(?:\d+(?:\.\d*)?|\.\d+))
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<global>@@[\w@$#]+)
  | (?P<variable>@[\w@$#]*)
  | (?P<name>(?:[^\W\d]|\#)[\w@$#]*)
  | (?P<operator><>|!=|!<|!>|<=|>=|\+=|-=|\*=|/=|%=|&=|\^=|\|=|::|[-+*/%&|^~=<>(),.;:!])
  | (?P<other>.))
""", re.VERBOSE | re.DOTALL)
_COMMENT_EDGE = re.compile(r"/\*|\*/")
_LINE_END = re.compile(r"\r\n|\r|\n")


class Token:
    """One token: kind, text as written, value (strings and identifiers unquoted; numbers as
    int, Decimal or float; binary as bytes), offsets in the text; quoted: a delimited identifier
    ([x] or "x", never a keyword); national: N'...'."""

    __slots__ = ("kind", "text", "value", "start", "end", "quoted", "national")

    def __init__(self, kind: str, text: str, value: Any, start: int, end: int, quoted: bool = False,
                 national: bool = False) -> None:
        self.kind, self.text, self.value, self.start, self.end = kind, text, value, start, end
        self.quoted, self.national = quoted, national

    def word(self) -> str | None:
        """The keyword this token spells (upper case), or None for anything else."""
        return self.value.upper() if self.kind == NAME and not self.quoted else None

    def __repr__(self) -> str:
        return f"Token({self.kind}, {self.text!r})"


class Lines:
    """Line and column numbers of offsets in a text (1-based), for messages."""

    def __init__(self, text: str, first_line: int = 1) -> None:
        self.starts = [0] + [m.end() for m in _LINE_END.finditer(text)]
        self.first_line = first_line

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1 + self.first_line

    def where(self, offset: int) -> str:
        index = bisect.bisect_right(self.starts, offset) - 1
        return f"line {index + self.first_line}, column {offset - self.starts[index] + 1}"


def tokens(text: str, source: str = "<script>", lines: Lines | None = None) -> Iterator[Token]:
    """The tokens of a text, comments and white space left out."""
    position, length = 0, len(text)
    match = _TOKEN.match
    while position < length:
        found = match(text, position)
        kind = found.lastgroup
        if kind == "end":
            return
        start, end = found.start(kind), found.end()
        position = end
        if kind == "name":
            yield Token(NAME, found.group(kind), found.group(kind), start, end)
        elif kind == "operator":
            raw = found.group(kind)
            yield Token(OPERATOR, raw, raw, start, end)
        elif kind == "variable":
            raw = found.group(kind)
            yield Token(VARIABLE, raw, raw[1:].lower(), start, end)
        elif kind == "string":
            raw = found.group(kind)
            national = raw[0] in "Nn"
            yield Token(STRING, raw, raw[1 + national:-1].replace("''", "'"), start, end, national=national)
        elif kind == "number":
            raw = found.group(kind)
            yield Token(NUMBER, raw, _number(raw), start, end)
        elif kind == "block_comment":
            position = _comment_end(text, start, source, lines)
        elif kind == "bracket":
            raw = found.group(kind)
            yield Token(NAME, raw, raw[1:-1].replace("]]", "]"), start, end, quoted=True)
        elif kind == "quoted":
            raw = found.group(kind)
            yield Token(NAME, raw, raw[1:-1].replace('""', '"'), start, end, quoted=True)
        elif kind == "binary":
            raw = found.group(kind)
            digits = raw[2:]
            yield Token(BINARY, raw, bytes.fromhex(digits if len(digits) % 2 == 0 else "0" + digits), start, end)
        elif kind == "money":
            raw = found.group(kind)
            yield Token(NUMBER, raw, Decimal(raw[1:].replace(" ", "").replace("\t", "")), start, end)
        elif kind == "global":
            raw = found.group(kind)
            yield Token(GLOBAL, raw, raw[2:].lower(), start, end)
        elif kind.startswith("open_"):
            what = {"open_string": "string (a ' without its closing quote)",
                    "open_bracket": "[identifier] (a [ without its closing ])",
                    "open_quoted": '"identifier" (a " without its closing quote)'}[kind]
            raise ScriptError(f"{source}, {(lines or Lines(text)).where(start)}: unterminated {what}: the file "
                              "is cut short, or the quote is missing")
        else:
            raw = found.group(kind)
            yield Token(OTHER, raw, raw, start, end)


def _number(raw: str):
    if "e" in raw or "E" in raw:
        return float(raw)
    if "." in raw:
        return Decimal(raw)
    return int(raw)


def _comment_end(text: str, start: int, source: str, lines: Lines | None) -> int:
    """The end of a /* */ comment starting at start; T-SQL's comments nest."""
    depth, position = 0, start
    while True:
        edge = _COMMENT_EDGE.search(text, position)
        if edge is None:
            raise ScriptError(f"{source}, {(lines or Lines(text)).where(start)}: unterminated /* comment (no */ "
                              "closes it): the file is cut short, or the */ is missing")
        depth += 1 if edge.group() == "/*" else -1
        position = edge.end()
        if depth == 0:
            return position


@dataclass
class Batch:
    tokens: list[Token]
    count: int              # GO n: the batch runs n times
    start: int              # offset of its first character in the text
    end: int                # offset after its last character (the GO line excluded)
    go_line: int | None     # the GO line that ends it, if any


def batches(text: str, source: str = "<script>", lines: Lines | None = None) -> Iterator[Batch]:
    """The batches of a script, split at GO lines (lazily: a huge script is never held as one
    token list)."""
    lines = lines or Lines(text)
    current: list[Token] = []
    start = 0
    stream = tokens(text, source, lines)
    pending: list[Token] = []

    def take() -> Token | None:
        if pending:
            return pending.pop(0)
        return next(stream, None)

    def peek(k: int = 0) -> Token | None:
        while len(pending) <= k:
            token = next(stream, None)
            if token is None:
                return None
            pending.append(token)
        return pending[k]

    previous: Token | None = None
    while True:
        token = take()
        if token is None:
            break
        if token.word() == "GO":
            line = lines.line(token.start)
            if previous is None or lines.line(previous.end - 1) < line:
                following, count = peek(0), 1
                if following is not None and following.kind == NUMBER and isinstance(following.value, int) \
                        and lines.line(following.start) == line:
                    after = peek(1)
                    if after is None or lines.line(after.start) > line:
                        count = following.value
                        take()
                        following = after
                if following is None or lines.line(following.start) > line:
                    yield Batch(current, count, start, token.start, line)
                    # The next batch starts on the line after GO (the rest of the GO line is its
                    # count and comment).
                    current, previous = [], None
                    next_line = line - lines.first_line + 1
                    start = lines.starts[next_line] if next_line < len(lines.starts) else len(text)
                    continue
        current.append(token)
        previous = token
    if current or start < len(text):
        yield Batch(current, 1, start, len(text), None)
