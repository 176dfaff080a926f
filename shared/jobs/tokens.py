"""SQL Server Agent's tokens in a step's command: $(ESCAPE_SQUOTE(JOBNAME)) and the rest of the
documented list, replaced as SQL Agent replaces them — text substitution, always through an
escape macro (ESCAPE_SQUOTE doubles ', ESCAPE_DQUOTE doubles ", ESCAPE_RBRACKET doubles ],
ESCAPE_NONE as is). A token without a macro fails the step, as it does in SQL Agent since 2005 SP1.

One module for both users: import-sqlagent (shared/ops/sqlagent_import.py) replaces what is fixed
when the job is defined (the SQL Agent job's and step's name, the step's number) and leaves the
run-time tokens in the command; the executor replaces those when the step runs
(``substitute_at_run``): the run's start (STRTDT, STRTTM) and the current date and time (DATE,
TIME) in the job's time zone, the job's name, the step's number, and JOBID (a stable id of the
job's name, see ``job_id``).

A run's parameters are never tokens: they are bound values (shared/jobs/params.py).

Pure: no database.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from shared.errors import AgentError

MACROS: dict[str, tuple[str, str] | None] = {
    "ESCAPE_SQUOTE": ("'", "''"), "ESCAPE_DQUOTE": ('"', '""'), "ESCAPE_RBRACKET": ("]", "]]"), "ESCAPE_NONE": None}

# Replaced when the step runs (substitute_at_run), and left in the command by the importer.
RUN_TIME = {
    "DATE": "the current date (YYYYMMDD) in the job's time zone",
    "TIME": "the current time (HHMMSS) in the job's time zone",
    "STRTDT": "the date the run started (YYYYMMDD) in the job's time zone",
    "STRTTM": "the time the run started (HHMMSS) in the job's time zone",
    "JOBID": "a stable id of the job's name (job_id): 0x and 32 hex digits, as SQL Agent writes a job_id",
    "JOBNAME": "the job's name",
    "STEPID": "the step's number",
}
# Replaced by the importer only: steps here have no names.
DEFINITION_ONLY = {"STEPNAME": "the SQL Agent step's name: import-sqlagent replaces it; steps here have no names"}
NO_EQUIVALENT = {
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
TOKENS = set(RUN_TIME) | set(DEFINITION_ONLY) | set(NO_EQUIVALENT)
OLD_SYNTAX = re.compile(r"\[(STRTDT|STRTTM|JOBID|STEPID|STEPCT|SRVR|MACH|INST|SQLDIR|SQLLOGDIR|OSCMD|MSSA|"
                        r"A-DBN|A-SVR|A-ERR|A-SEV|A-MSG)\]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
# JOBID: uuid5 of the job's name in this namespace (fixed: the id of a job never changes).
JOB_ID_NAMESPACE = uuid.UUID("6f0c3c1e-5a1b-4d47-9a59-3b1f0e2a7c11")


class TokenError(AgentError):
    """A token the step's command cannot run with: the step fails (its message says which)."""


@dataclass
class TokenUse:
    text: str                   # as written: $(ESCAPE_SQUOTE(DATE))
    token: str                  # DATE, WMI(DatabaseName)
    macro: str | None

    @property
    def base(self) -> str:
        return self.token.split("(")[0]


def token_uses(command: str) -> list[TokenUse]:
    """Every $(...) in a command, as SQL Agent's token syntax reads it."""
    uses: list[TokenUse] = []
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


def escape(value: str, macro: str) -> str:
    pair = MACROS[macro]
    return value.replace(*pair) if pair else value


def replace_tokens(command: str, values: dict[str, str], *, leave: frozenset[str] | set[str] = frozenset(),
                   unknown_is_problem: bool = True) -> tuple[str, list[tuple[str, str]]]:
    """The command with the tokens in ``values`` replaced as SQL Agent replaces them (escaped by
    their macro), and the problems: (token as written, reason). Tokens named in ``leave`` stay as
    written (the importer leaves the run-time ones to the run). ``unknown_is_problem``: a $(name)
    that is no SQL Agent token is a problem (SQL Agent refuses the step), else left as written (a
    command written here, not in SQL Agent, may hold $( in a literal)."""
    problems: list[tuple[str, str]] = []
    out, position = [], 0
    for use in token_uses(command):
        start = command.find(use.text, position)
        out.append(command[position:start])
        position = start + len(use.text)
        base = use.base
        if base not in TOKENS:
            if unknown_is_problem:
                problems.append((use.text, f"not a SQL Agent token (tokens are case-sensitive: "
                                           f"{', '.join(sorted(TOKENS))}): SQL Server Agent refuses to start the "
                                           f"step ('Variable {use.token} not found')"))
            out.append(use.text)
            continue
        if use.macro is None:
            problems.append((use.text, "a token without an escape macro: SQL Server Agent (2005 SP1 and later) "
                                       "fails a step that has one; write $(ESCAPE_SQUOTE(...)) or $(ESCAPE_NONE(...))"))
            out.append(use.text)
            continue
        if base in leave:
            out.append(use.text)
            continue
        if base not in values:
            reason = NO_EQUIVALENT.get(base) or DEFINITION_ONLY.get(base) or RUN_TIME[base]
            problems.append((use.text, f"SQL Agent replaces it with {reason}"))
            out.append(use.text)
            continue
        out.append(escape(values[base], use.macro))
    out.append(command[position:])
    return "".join(out), problems


def job_id(job_name: str) -> str:
    """$(JOBID): SQL Agent's job_id is a uniqueidentifier, written by the token as binary(16)
    (0x and 32 hex digits). Jobs here have none, so it is uuid5 of the job's name: the same job
    always has the same id, and CONVERT(uniqueidentifier, $(ESCAPE_NONE(JOBID))) gives
    str(uuid.uuid5(JOB_ID_NAMESPACE, name)) (SQL Server stores a GUID's first three groups
    little-endian, hence bytes_le)."""
    return "0x" + uuid.uuid5(JOB_ID_NAMESPACE, job_name).bytes_le.hex().upper()


def run_time_values(*, job_name: str, step: int, started_at: datetime, now: datetime,
                    time_zone: str | None) -> dict[str, str]:
    """The run-time tokens' values. ``started_at`` and ``now``: UTC (naive or aware), shown in
    the job's time zone (UTC when it has none) as SQL Agent formats them: yyyymmdd, hhmmss."""
    zone = ZoneInfo(time_zone or "UTC")

    def local(moment: datetime) -> datetime:
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(zone)

    start, current = local(started_at), local(now)
    return {"DATE": current.strftime("%Y%m%d"), "TIME": current.strftime("%H%M%S"),
            "STRTDT": start.strftime("%Y%m%d"), "STRTTM": start.strftime("%H%M%S"),
            "JOBID": job_id(job_name), "JOBNAME": job_name, "STEPID": str(step)}


def has_tokens(command: str) -> bool:
    """Whether the command holds a SQL Agent token (the fast path is one substring search)."""
    return "$(" in command and any(use.base in TOKENS for use in token_uses(command))


def substitute_at_run(command: str, values: dict[str, str]) -> str:
    """The command as the step runs it: its SQL Agent tokens replaced with ``values``
    (run_time_values). Raises TokenError for a token without a macro or one that has no value
    here. A $(name) that is no SQL Agent token is left as written."""
    if "$(" not in command:
        return command
    text, problems = replace_tokens(command, values, unknown_is_problem=False)
    if problems:
        raise TokenError("; ".join(f"{written}: {reason}" for written, reason in problems)
                         + " (SQL Agent's tokens: docs/moving-from-sql-agent.md)")
    return text
