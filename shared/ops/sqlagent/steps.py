"""What SQL Server Agent does to a T-SQL step's command before it runs it: it replaces its
tokens ($(ESCAPE_SQUOTE(JOBNAME)) ...), then runs the text batch by batch, split at GO lines
(a step may hold several batches, as a script for sqlcmd does; the first batch that fails
fails the step, and the batches after it do not run).

Here a token is replaced where its value is fixed when the job is defined (the job's and the
step's name, the step's number); the others (the date, the server, the job's id, alert values)
have no equivalent and are reported. A command with GO becomes one step per batch, unless its
batches share a session (a #temporary table, SET options, a transaction, USE in a batch with
other statements), which separate steps here do not: that is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.errors import ScriptError
from shared.ops.sqlagent.lexer import Lines, Token, batches
from shared.ops.sqlagent.parser import BatchRefused, Parser, SetOption, Skipped, Transaction, Use

TRANSLATED = {"JOBNAME", "STEPNAME", "STEPID"}
NO_EQUIVALENT = {
    "DATE": "the current date (YYYYMMDD): use CONVERT(char(8), SYSDATETIME(), 112) in the step",
    "TIME": "the current time (HHMMSS): use REPLACE(CONVERT(char(8), SYSDATETIME(), 108), ':', '') in the step",
    "STRTDT": "the date the job started: the run's start is in the history; use CONVERT(char(8), SYSDATETIME(), 112)",
    "STRTTM": "the time the job started: the run's start is in the history",
    "JOBID": "SQL Agent's job_id: jobs here have no GUID",
    "STEPCT": "how many times the step has run in this run: no equivalent",
    "SRVR": "the SQL Server's name: use @@SERVERNAME in the step",
    "INST": "the instance's name: use SERVERPROPERTY('InstanceName') in the step",
    "MACH": "the computer's name: there is none in Azure SQL Database",
    "MSSA": "the master SQL Agent's name: no multi-server administration here",
    "OSCMD": "the CmdExec program prefix: no CmdExec here",
    "SQLDIR": "SQL Server's install directory: no file system here",
    "SQLLOGDIR": "SQL Server's error log directory: no file system here",
    "A-DBN": "a database name from the alert that ran the job: alerts are not carried",
    "A-SVR": "a server name from the alert that ran the job: alerts are not carried",
    "A-ERR": "an error number from the alert that ran the job: alerts are not carried",
    "A-SEV": "an error severity from the alert that ran the job: alerts are not carried",
    "A-MSG": "an error message from the alert that ran the job: alerts are not carried",
    "WMI": "a WMI event's property: WMI alerts are not carried",
}
MACROS = {"ESCAPE_SQUOTE": ("'", "''"), "ESCAPE_DQUOTE": ('"', '""'), "ESCAPE_RBRACKET": ("]", "]]"),
          "ESCAPE_NONE": None}
OLD_SYNTAX = re.compile(r"\[(STRTDT|STRTTM|JOBID|STEPID|STEPCT|SRVR|MACH|INST|SQLDIR|SQLLOGDIR|OSCMD|MSSA|"
                        r"A-DBN|A-SVR|A-ERR|A-SEV|A-MSG)\]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_GO_LINE = re.compile(r"^[ \t]*GO(?:[ \t]+\d+)?[ \t]*(?:--.*)?$", re.IGNORECASE | re.MULTILINE)


@dataclass
class TokenUse:
    text: str                   # as written: $(ESCAPE_SQUOTE(DATE))
    token: str                  # DATE, WMI(DatabaseName)
    macro: str | None


def token_uses(command: str) -> list[TokenUse]:
    """Every $(...) in a command, as SQL Agent's token syntax reads it."""
    uses = []
    position = 0
    while True:
        start = command.find("$(", position)
        if start == -1:
            return uses
        name = _NAME.match(command, start + 2)
        if name is None:
            position = start + 2
            continue
        end, word = name.end(), name.group()
        macro = None
        if word in MACROS and command.startswith("(", end):
            inner = _NAME.match(command, end + 1)
            if inner is None:
                position = end
                continue
            macro, word, end = word, inner.group(), inner.end()
        if command.startswith("(", end):            # WMI(property)
            close = command.find(")", end)
            if close == -1:
                position = end
                continue
            word, end = command[start + 2 + (len(macro) + 1 if macro else 0):close + 1], close + 1
        closing = "))" if macro else ")"
        if command.startswith(closing, end):
            end += len(closing)
        uses.append(TokenUse(command[start:end], word, macro))
        position = end


def replace_tokens(command: str, values: dict[str, str]) -> tuple[str, list[tuple[str, str]]]:
    """The command with the tokens whose value is fixed replaced as SQL Agent replaces them
    (escaped by their macro), and the problems: (token as written, reason)."""
    problems: list[tuple[str, str]] = []
    out, position = [], 0
    for use in token_uses(command):
        start = command.find(use.text, position)
        out.append(command[position:start])
        position = start + len(use.text)
        base = use.token.split("(")[0]
        if base not in TRANSLATED and base not in NO_EQUIVALENT:
            problems.append((use.text, f"not a SQL Agent token (tokens are case-sensitive: {', '.join(sorted(TRANSLATED | set(NO_EQUIVALENT)))}): "
                                       f"SQL Server Agent refuses to start the step ('Variable {use.token} not "
                                       "found')"))
            out.append(use.text)
            continue
        if use.macro is None:
            problems.append((use.text, "a token without an escape macro: SQL Server Agent (2005 SP1 and later) "
                                       "fails a step that has one; write $(ESCAPE_SQUOTE(...)) or $(ESCAPE_NONE(...))"))
            out.append(use.text)
            continue
        if base in NO_EQUIVALENT:
            problems.append((use.text, f"SQL Agent replaces it with {NO_EQUIVALENT[base]}"))
            out.append(use.text)
            continue
        value = values[base]
        escape = MACROS[use.macro]
        out.append(value.replace(*escape) if escape else value)
    out.append(command[position:])
    return "".join(out), problems


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
