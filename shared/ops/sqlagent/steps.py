"""What SQL Server Agent does to a T-SQL step's command before it runs it: it replaces its
tokens ($(ESCAPE_SQUOTE(JOBNAME)) ...), then runs the text batch by batch, split at GO lines
(a step may hold several batches, as a script for sqlcmd does; the first batch that fails
fails the step, and the batches after it do not run).

The tokens are shared/jobs/tokens.py's: the importer replaces those whose value is fixed when
the job is defined (the SQL Agent job's and step's name, the step's number) and leaves the
run-time ones (the date, the run's start, the job's id) to the executor, which replaces them when
the step runs; the others (the server, alert values) have no equivalent and are reported. A command with GO becomes one step per batch, unless its
batches share a session (a #temporary table, SET options, a transaction, USE in a batch with
other statements), which separate steps here do not: that is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.errors import ScriptError
from shared.ops.sqlagent.lexer import Lines, Token, batches
from shared.ops.sqlagent.parser import BatchRefused, Parser, SetOption, Skipped, Transaction, Use

# A line that is only GO (and a count, a comment), whatever ends the lines: SSMS writes CRLF, and
# with re.MULTILINE "$" matches only before "\n", so a CRLF command looked like one batch (an
# attack: its GO went to the server, and every run failed). The lexer (Lines) knows all three.
_GO_LINE = re.compile(r"(?:\A|(?<=[\r\n]))[ \t]*GO(?:[ \t]+\d+)?[ \t]*(?:--[^\r\n]*)?(?=[\r\n]|\Z)", re.IGNORECASE)


@dataclass
class StepBatch:
    command: str
    database: str | None        # from a USE batch before it, else None (the step's database)
    line: int                   # where it starts in the command


@dataclass
class Split:
    batches: list[StepBatch] = field(default_factory=list)
    problem: str | None = None  # why the command cannot be split as SQL Agent runs it


def split_batches(command: str) -> Split:
    """A step's command as the batches SQL Agent runs (one when it has no GO line)."""
    if not _GO_LINE.search(command):
        return Split([StepBatch(command, None, 1)])
    lines = Lines(command)
    try:
        found = list(batches(command, "the step's command", lines))
    except ScriptError as error:
        return Split(problem=f"it has GO lines but cannot be cut into batches ({error})")
    kept: list[tuple[list, list[Token], StepBatch]] = []
    database = None
    for batch in found:
        if batch.count != 1:
            return Split(problem=f"GO {batch.count} (line {batch.go_line}) runs a batch {batch.count} times in sqlcmd; "
                                 "what SQL Agent does with a count is not documented")
        if not batch.tokens:
            continue
        try:
            statements = Parser(batch.tokens, command, lines).statements()
        except BatchRefused as refused:
            return Split(problem=f"a batch of it does not compile ({refused.message})")
        if len(statements) == 1 and isinstance(statements[0], Use):
            database = statements[0].database
            continue
        text = command[batch.start:batch.end].rstrip().lstrip("\r\n")
        kept.append((statements, batch.tokens, StepBatch(text, database, lines.line(batch.start))))
    if len(kept) <= 1:
        return Split([b for _, _, b in kept] or [StepBatch(command, database, 1)])
    # Batches of one step share a session in SQL Agent; separate steps here do not.
    temp_names: dict[str, int] = {}
    last = len(kept) - 1
    for index, (statements, batch_tokens, _) in enumerate(kept):
        for statement in statements if index < last else ():
            if isinstance(statement, SetOption):
                return Split(problem=f"batch {index + 1} sets a session option (SET {' '.join(statement.words)}) "
                                     "that SQL Agent keeps for the batches after it; steps here do not share a "
                                     "session")
            if isinstance(statement, Transaction):
                return Split(problem=f"batch {index + 1} has {statement.action} TRANSACTION: a transaction across "
                                     "GO needs one session; steps here do not share one")
            if isinstance(statement, Use):
                return Split(problem=f"batch {index + 1} has USE {statement.database} with other statements: the "
                                     "database would change for the batches after it in SQL Agent")
            if isinstance(statement, Skipped) and statement.word in ("EXECUTE AS", "REVERT", "SETUSER"):
                return Split(problem=f"batch {index + 1} changes the session's user ({statement.word})")
        for token in batch_tokens:
            if token.kind == "name" and token.value.startswith("#"):
                first = temp_names.setdefault(token.value.lower(), index)
                if first != index:
                    return Split(problem=f"the temporary object {token.value} is used in batches {first + 1} and "
                                         f"{index + 1}: it lives in SQL Agent's session, and steps here do not "
                                         "share one")
    return Split([b for _, _, b in kept])
