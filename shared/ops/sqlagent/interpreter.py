"""A T-SQL script run, statement by statement in script order, over the msdb model: what SQL
Server would do with the msdb job procedures when the script runs on it.

Everything a script can compute from its own text is computed (variables, string building,
CAST/CONVERT/REPLACE/CHAR..., IF/WHILE/GOTO/TRY, transactions and their rollbacks, dynamic SQL
and procedures the script defines); what only the server knows at run time (a column, a cursor's
row, GETDATE(), @@SERVERNAME) is an Unknown value. An IF on such a value runs both ways: when the
jobs come out the same either way nothing is lost; when they differ, each job that differs is
listed. Every call SQL Server would refuse, every job procedure called with a value known only
at run time, and every way of changing jobs the model does not follow is a Finding.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field, replace
from decimal import Decimal, DivisionByZero, InvalidOperation
from typing import Any, Callable

from shared.errors import ScriptError
from shared.ops.sqlagent import msdb as model
from shared.ops.sqlagent.lexer import Lines, Token, batches, tokens
from shared.ops.sqlagent.msdb import DEFAULT, HARMLESS, NOT_FOLLOWED, SIGNATURES, Msdb
from shared.ops.sqlagent.parser import (
    Assign, BatchRefused, Between, Binary, Block, Case, Cast, Change, Column, Declare, Exec, ExecString, Expr, Fetch, Func,
    Global, If, InList, IsNull, Jump, Label, Like, Lit, Logical, Module, Not, Opaque, Parser, Raise, SetOption,
    Skipped, Stmt, Subquery, Transaction, Try, Unary, Use, VarRef, While)
from shared.ops.sqlagent.values import (
    NVARCHAR_MAX, SqlFailure, SqlType, Unknown, Value, convert, first_unknown, text_key, to_decimal, to_float,
    to_int, to_string)

MAX_LOOP = 10_000               # iterations of one WHILE (or GO n) before the importer calls it endless
MAX_STATEMENTS = 2_000_000      # statements run for all files together
MAX_NESTING = 32                # EXEC of dynamic SQL or procedures within each other (SQL Server's limit)
MAX_TEXT = 16_000_000           # characters of one computed string
JOB_TABLES = {"sysjobs", "sysjobs_view", "sysjobsteps", "sysschedules", "sysjobschedules", "sysjobservers",
              "sysschedules_localserver_view", "sysjobactivity"}


@dataclass
class Finding:
    """Something a script does that the import does not carry as SQL Server would do it."""
    source: str
    line: int
    what: str
    reason: str
    job: int | None = None          # the model's key of the job it concerns
    job_name: str | None = None
    kind: str = "structural"        # "failure": a call SQL Server refuses; "note": said, not a loss

    def key(self) -> tuple:
        return self.source, self.line, self.what, self.reason, self.job


@dataclass(frozen=True)
class Var:
    type: SqlType | None            # None: a table or cursor variable
    value: Value


@dataclass
class UserProcedure:
    name: str
    params: list[tuple[str, SqlType | None, Expr | None, bool]]
    body: list[Token]
    text: str
    lines: Lines
    line: int


@dataclass
class Session:
    """A connection's state (one per file): what outlives a batch."""
    database: str | None = None
    quoted_identifier: bool = True
    noexec: bool = False
    trancount: int = 0
    saves: list[tuple[str | None, Msdb, int]] = field(default_factory=list)   # (name, model, line)
    procedures: dict[str, UserProcedure] = field(default_factory=dict)
    assumed_msdb: bool = False
    xact_abort: bool = False        # SET XACT_ABORT: a run-time error rolls back and ends the batch

    def copy(self) -> "Session":
        return replace(self, saves=list(self.saves), procedures=dict(self.procedures))


@dataclass
class Frame:
    """A batch, a piece of dynamic SQL or a procedure's body: its variables and code."""
    variables: dict[str, Var]
    code: list
    labels: dict[str, int]
    text: str
    lines: Lines
    source: str
    depth: int = 0
    error: int = 0                  # @@ERROR
    handlers: list[int] = field(default_factory=list)   # catch blocks of the TRYs the code is in
    return_value: Value = 0
    parent: "Frame | None" = None
    back_jumps: int = 0             # GOTOs to an earlier label: a loop made of GOTO


class Stop(Exception):
    """The batch ends here: RETURN (ends the procedure or dynamic SQL it is in), THROW outside
    TRY (whole: ends the batch that called it too)."""

    def __init__(self, whole: bool = False) -> None:
        super().__init__()
        self.whole = whole


class Disconnect(Exception):
    """RAISERROR WITH LOG of severity 20 or more: SQL Server closes the connection."""


class Raised(Exception):
    """An error inside a TRY: control goes to its CATCH."""


class StatementFailed(Exception):
    """A run-time error computing a statement's values (a conversion, a division by zero, an
    overflow): SQL Server's error, raised where the statement is, decided by statement_failed."""

    def __init__(self, failure: SqlFailure, offset: int) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.offset = offset


# Run-time errors that end the batch, not only the statement, outside TRY (conversion of a
# string to a number or date: SQL Server's batch-aborting conversion errors).
BATCH_ABORTING_ERRORS = frozenset({245, 241, 8114})
# Errors SQL Server raises when it compiles the batch (a function given the wrong number of
# arguments): the batch never runs.
COMPILE_ERRORS = frozenset({174})


@dataclass
class FileStats:
    source: str
    batches: int = 0
    calls: int = 0                  # calls of msdb's job procedures


# ---------------------------------------------------------------- code


@dataclass
class CIf:
    stmt: If
    otherwise: int = 0              # where the ELSE side starts
    end: int = 0


@dataclass
class CWhile:
    stmt: While
    end: int = 0


@dataclass
class CJump:
    target: int
    stmt: Stmt | None = None


@dataclass
class CGoto:
    stmt: Jump


@dataclass
class CTry:
    catch: int = 0
    end: int = 0


@dataclass
class CTryEnd:
    end: int = 0


@dataclass
class CStmt:
    stmt: Stmt


def compile_code(statements: list[Stmt]) -> tuple[list, dict[str, int]]:
    """Statements as a flat list of instructions with jumps (GOTO may go anywhere in the batch)."""
    code: list = []
    labels: dict[str, int] = {}
    loops: list[tuple[int, list[CJump]]] = []

    def emit(statement: Stmt) -> None:
        if isinstance(statement, Block):
            for inner in statement.body:
                emit(inner)
        elif isinstance(statement, If):
            instruction = CIf(statement)
            code.append(instruction)
            emit(statement.then)
            if statement.otherwise is not None:
                jump = CJump(0)
                code.append(jump)
                instruction.otherwise = len(code)
                emit(statement.otherwise)
                jump.target = len(code)
            else:
                instruction.otherwise = len(code)
            instruction.end = len(code)
        elif isinstance(statement, While):
            head = len(code)
            instruction = CWhile(statement)
            code.append(instruction)
            breaks: list[CJump] = []
            loops.append((head, breaks))
            emit(statement.body)
            loops.pop()
            code.append(CJump(head))
            instruction.end = len(code)
            for jump in breaks:
                jump.target = len(code)
        elif isinstance(statement, Try):
            instruction = CTry()
            code.append(instruction)
            for inner in statement.body:
                emit(inner)
            end = CTryEnd()
            code.append(end)
            instruction.catch = len(code)
            for inner in statement.catch:
                emit(inner)
            instruction.end = end.end = len(code)
        elif isinstance(statement, Jump) and statement.kind in ("BREAK", "CONTINUE"):
            if not loops:
                code.append(CStmt(Skipped(statement.start, statement.kind)))
            elif statement.kind == "BREAK":
                jump = CJump(0, statement)
                loops[-1][1].append(jump)
                code.append(jump)
            else:
                code.append(CJump(loops[-1][0], statement))
        elif isinstance(statement, Jump) and statement.kind == "GOTO":
            code.append(CGoto(statement))
        elif isinstance(statement, Label):
            labels.setdefault(statement.name, len(code))
        else:
            code.append(CStmt(statement))

    for statement in statements:
        emit(statement)
    return code, labels


# ---------------------------------------------------------------- the interpreter


class Interpreter:
    def __init__(self, msdb: Msdb) -> None:
        self.msdb = msdb
        self.findings: list[Finding] = []
        self.notes: list[Finding] = []
        self.statements_run = 0
        self.speculating = 0
        self.session = Session()
        self.stats = FileStats("")
        self._compiled: dict[tuple, tuple] = {}
        self._dynamic: dict[str, tuple] = {}

    # ------------------------------------------------------------ files and batches

    def run_file(self, text: str, source: str) -> FileStats:
        self.session = Session()
        self.stats = FileStats(source)
        lines = Lines(text)
        sqlcmd_said = False
        try:
            for batch in batches(text, source, lines):
                if not batch.tokens:
                    continue
                self.stats.batches += 1
                command = None if sqlcmd_said else _sqlcmd_command(batch.tokens, lines)
                if command is not None:
                    sqlcmd_said = True
                    self.find(source, lines.line(command.start), f":{command.value}",
                              "a sqlcmd command: the script is meant for SQLCMD mode, whose :setvar, :r and $(variable) "
                              "the importer does not run or replace (SQL Server refuses them as T-SQL); run the script "
                              "through sqlcmd's preprocessing first, or write the values in")
                if batch.count > MAX_LOOP:
                    self.find(source, batch.go_line or 1, f"GO {batch.count}",
                              f"runs the batch {batch.count:,} times: followed for the first {MAX_LOOP:,} only")
                for _ in range(min(max(batch.count, 0), MAX_LOOP)):
                    self.run_batch(batch.tokens, text, lines, source, depth=0)
        except Disconnect:
            pass
        if self.session.trancount > 0:
            name, _, line = self.session.saves[0]
            self.find(source, line, "BEGIN TRANSACTION",
                      "the script ends with this transaction open: SQL Server rolls it back when the connection closes "
                      "(sqlcmd) or asks (SSMS); its changes are kept here")
        return self.stats

    def run_batch(self, batch_tokens: list[Token], text: str, lines: Lines, source: str, *, depth: int,
                  variables: dict[str, Var] | None = None, parent: Frame | None = None) -> Frame | None:
        try:
            statements, code, labels, parser = self.compiled(batch_tokens, text, lines)
            if not any(isinstance(statement, Module) for statement in statements):
                _check_declared(parser, batch_tokens, set(variables or ()))
        except BatchRefused as refused:
            self.find(source, lines.line(refused.offset), "batch",
                      f"SQL Server refuses to compile this batch ({refused.message}, at "
                      f"{lines.where(refused.offset)}): none of it runs, here either")
            return None
        except RecursionError:
            self.find(source, lines.line(batch_tokens[0].start), "batch",
                      "nested too deeply for SQL Server (error 191): none of it runs, here either")
            return None
        frame = Frame(variables if variables is not None else {}, code, labels, text, lines, source, depth,
                      parent=parent)
        try:
            self.run(frame, 0, len(code))
        except Stop as stop:
            if stop.whole and depth > 0:
                raise
        return frame

    def compiled(self, batch_tokens: list[Token], text: str, lines: Lines):
        """A batch parsed and compiled; kept for the batches run again (a procedure's body, the
        same dynamic SQL in a loop). Raises BatchRefused (also when it is met again)."""
        key = (id(batch_tokens), self.session.quoted_identifier)
        cached = self._compiled.get(key)
        if cached is None:
            parser = Parser(batch_tokens, text, lines, quoted_identifier=self.session.quoted_identifier)
            try:
                statements = parser.statements()
                code, labels = compile_code(statements)
                result = (statements, code, labels, parser)
            except BatchRefused as refused:
                result = refused
            if len(self._compiled) > 512:
                self._compiled.clear()
            cached = self._compiled[key] = (batch_tokens, result)       # the tokens kept: their id stays theirs
        result = cached[1]
        if isinstance(result, BatchRefused):
            raise result
        return result

    def find(self, source: str, line: int, what: str, reason: str, *, job: int | None = None,
             kind: str = "structural", job_name: str | None = None) -> None:
        name = self.msdb.jobs[job].name if job is not None and job in self.msdb.jobs else job_name
        finding = Finding(source, line, what, reason, job, name, kind)
        if kind == "note":
            if finding.key() not in {f.key() for f in self.notes}:
                self.notes.append(finding)
        else:
            self.findings.append(finding)

    # ------------------------------------------------------------ running code

    def run(self, frame: Frame, start: int, stop: int) -> int:
        """Run frame.code from start while control stays in [start, stop); return where it went
        (stop when it ran to the end of the range; elsewhere after a GOTO, BREAK or CATCH)."""
        pc = start
        code = frame.code
        while start <= pc < stop:
            self.statements_run += 1
            if self.statements_run > MAX_STATEMENTS:
                raise ScriptError(f"{frame.source}: more than {MAX_STATEMENTS:,} statements run (a loop that does not "
                                  "end?): stopped")
            instruction = code[pc]
            if self.session.noexec and not (isinstance(instruction, CStmt) and isinstance(instruction.stmt,
                                                                                          SetOption)):
                pc += 1
                continue
            try:
                pc = self.step(frame, instruction, pc)
            except Raised:
                if not frame.handlers:
                    raise
                pc = frame.handlers.pop()
        return pc

    def step(self, frame: Frame, instruction, pc: int) -> int:
        if isinstance(instruction, CStmt):
            self.execute(frame, instruction.stmt)
            return pc + 1
        if isinstance(instruction, CJump):
            return instruction.target
        if isinstance(instruction, CIf):
            return self.run_if(frame, instruction, pc)
        if isinstance(instruction, CWhile):
            return self.run_while(frame, instruction, pc)
        if isinstance(instruction, CGoto):
            target = frame.labels.get(instruction.stmt.label)
            if target is None:
                self.find(frame.source, self.line(frame, instruction.stmt.start), f"GOTO {instruction.stmt.label}",
                          "no such label in the batch: SQL Server refuses the batch (error 133)")
                raise Stop()
            if target <= pc:
                frame.back_jumps += 1
                if frame.back_jumps > MAX_LOOP:
                    self.find(frame.source, self.line(frame, instruction.stmt.start), f"GOTO {instruction.stmt.label}",
                              f"jumps back more than {MAX_LOOP:,} times: a loop that would not end on SQL Server "
                              "either; the rest of the batch is not followed")
                    raise Stop()
            return target
        if isinstance(instruction, CTry):
            frame.handlers.append(instruction.catch)
            return pc + 1
        if isinstance(instruction, CTryEnd):
            if frame.handlers:
                frame.handlers.pop()
            return instruction.end
        raise AssertionError(instruction)

    def line(self, frame: Frame, offset: int) -> int:
        return frame.lines.line(offset)

    def in_try(self, frame: Frame | None) -> bool:
        while frame is not None:
            if frame.handlers:
                return True
            frame = frame.parent
        return False

    # ------------------------------------------------------------ IF, WHILE and undecided conditions

    def run_if(self, frame: Frame, instruction: CIf, pc: int) -> int:
        try:
            condition = self.truth(frame, instruction.stmt.condition, instruction.stmt.start)
        except StatementFailed as failed:
            self.statement_failed(frame, failed)
            return instruction.end          # the IF failed: neither side runs
        frame.error = 0
        if condition is True:
            return pc + 1
        if not isinstance(condition, Unknown):
            return instruction.otherwise
        # Known only at run time: run both sides and keep what they agree on.
        then_stop = instruction.otherwise if instruction.otherwise == instruction.end else instruction.otherwise - 1
        text = self.snippet(frame, instruction.stmt.start)
        self.speculate(frame, [(pc + 1, then_stop, {then_stop}), (instruction.otherwise, instruction.end,
                                                                  {instruction.end})],
                       instruction.stmt.start, f"IF {text}", condition.reason)
        return instruction.end

    def run_while(self, frame: Frame, instruction: CWhile, pc: int) -> int:
        iterations = 0
        body_end = instruction.end - 1              # the jump back to the head
        while True:
            try:
                condition = self.truth(frame, instruction.stmt.condition, instruction.stmt.start)
            except StatementFailed as failed:
                self.statement_failed(frame, failed)
                return instruction.end      # the WHILE failed: the loop ends
            frame.error = 0
            if condition is True:
                iterations += 1
                if iterations > MAX_LOOP:
                    self.find(frame.source, self.line(frame, instruction.stmt.start), "WHILE",
                              f"the loop has not ended after {MAX_LOOP:,} turns: it would not end on SQL Server "
                              "either; the rest of the batch is not followed")
                    raise Stop()
                went = self.run(frame, pc + 1, body_end)
                if went in (body_end, pc):
                    continue                        # the end of the body, or CONTINUE
                return went                         # BREAK (the loop's end), or a GOTO out of it
            if not isinstance(condition, Unknown):
                return instruction.end
            text = self.snippet(frame, instruction.stmt.start)
            self.speculate(frame, [(pc + 1, body_end, {body_end, pc, instruction.end}),
                                   (instruction.end, instruction.end, {instruction.end})],
                           instruction.stmt.start, f"WHILE {text}", condition.reason, loop=True)
            return instruction.end

    def speculate(self, frame: Frame, sides: list[tuple[int, int, set[int]]], offset: int, what: str, why: str, *,
                  loop: bool = False) -> None:
        """Run each side of an undecided IF (or a loop's body, and nothing) on a copy of the
        state; keep what they agree on; list each job that differs and take the first side's."""
        base = self.snapshot(frame)
        line = self.line(frame, offset)
        results = []
        for start, stop, ends in sides:
            self.restore(frame, base, copy=True)
            mark = len(self.findings)
            self.speculating += 1
            try:
                went = self.run(frame, start, stop) if start < stop else stop
                left = went not in ends
            except (Stop, Raised):
                left = True
            finally:
                self.speculating -= 1
            results.append((self.snapshot(frame), self.findings[mark:], left))
            del self.findings[mark:]
        staying = [r for r in results if not r[2]]
        if len(staying) < len(results):
            # A way that leaves the statement (GOTO, RETURN, BREAK, an error) cannot be merged with
            # one that goes on: the importer goes on the way that stays, and says so.
            if not staying:
                self.restore(frame, base, copy=True)
                self.find(frame.source, line, what, f"known only when the script runs ({why}), and every way leaves "
                          "the statement (GOTO, RETURN, BREAK or an error): not followed")
                return
            state, side_findings, _ = staying[0]
            self.restore(frame, state, copy=False)
            self.findings.extend(f for f in side_findings if f.kind != "failure")
            self.find(frame.source, line, what, f"known only when the script runs ({why}), and one way leaves the "
                      "statement (GOTO, RETURN, BREAK or an error): the importer follows the way that does not; what "
                      "the other way does is not carried")
            return
        first = results[0][0]
        self.restore(frame, first, copy=False)
        models = [state[0] for state, _, _ in results]
        differing = differing_jobs(models)
        for key, name in differing.items():
            if loop:
                reason = (f"known only when the script runs ({why}): the loop changes this job, and how many times "
                          "it runs is not known; the job is taken as after one turn")
            else:
                reason = (f"known only when the script runs ({why}): the job comes out differently either way; the "
                          "importer takes the IF side")
            self.find(frame.source, line, what, reason, job=key if key in models[0].jobs else None,
                      job_name=name)
        seen = set()
        for index, (_, side_findings, _) in enumerate(results):
            for finding in side_findings:
                if finding.kind == "failure" and (not differing or index > 0):
                    continue            # a refused call that changes nothing either way
                if finding.key() not in seen:
                    seen.add(finding.key())
                    self.findings.append(finding)
        before = base[2]
        after = [state[2] for state, _, _ in results]
        for name in set().union(*after):
            values = [v.get(name) for v in after]
            changed = any(value is not values[0] and value != values[0] for value in values[1:])
            if loop:
                changed = changed or values[0] is not before.get(name)
            if changed:
                kept = next(v for v in values if v is not None)
                frame.variables[name] = Var(kept.type, Unknown(f"set by the {what.split()[0]} at line {line}, whose "
                                                               f"condition is known only when the script runs"))

    def snapshot(self, frame: Frame) -> tuple:
        return (self.msdb, self.session, dict(frame.variables), frame.error, list(frame.handlers))

    def restore(self, frame: Frame, state: tuple, *, copy: bool) -> None:
        msdb, session, variables, error, handlers = state
        self.msdb = msdb.copy() if copy else msdb
        self.session = session.copy() if copy else session
        frame.variables = dict(variables)
        frame.error = error
        frame.handlers = list(handlers)

    def snippet(self, frame: Frame, offset: int) -> str:
        text = frame.text[offset:offset + 200].split("\n")[0].strip()
        text = re.sub(r"^(IF|WHILE)\s+", "", text, flags=re.IGNORECASE)
        return text[:100] + ("..." if len(text) > 100 else "")

    def truth(self, frame: Frame, expression: Expr, offset: int = 0):
        """True, False, None (SQL's unknown: NULL) or Unknown (not known before run time). A
        condition SQL Server fails computing raises StatementFailed."""
        try:
            return self.evaluate(frame, expression, boolean=True)
        except SqlFailure as failure:
            raise StatementFailed(failure, getattr(expression, "start", 0) or offset) from None

    def statement_failed(self, frame: Frame, failed: StatementFailed) -> None:
        """A statement SQL Server fails at run time, as it does: inside TRY, control goes to the
        CATCH; with XACT_ABORT on, the transaction rolls back and the batch ends; a conversion
        error ends the batch; any other ends the statement only (what it would have done is not
        done) and the batch goes on."""
        failure, line = failed.failure, self.line(frame, failed.offset)
        frame.error = failure.number
        if failure.number in COMPILE_ERRORS:
            # Found here while computing, but SQL Server refuses the batch before running any of it.
            self.find(frame.source, line, "batch", f"SQL Server refuses to compile the batch ({failure.message}): "
                      "none of it runs; the importer stops it here, what came before in it is not undone")
            raise Stop(whole=True)
        if self.in_try(frame):
            raise Raised()
        if self.session.xact_abort:
            if self.session.trancount > 0:
                target = self.session.saves[0][1]
                self.report_undone(frame, line, self.msdb, target, f"error {failure.number} under XACT_ABORT")
                self.msdb = target
                self.session.trancount, self.session.saves = 0, []
            self.find(frame.source, line, f"error {failure.number}",
                      f"SQL Server fails this statement ({failure.message}) with XACT_ABORT on: the transaction rolls "
                      "back and the batch ends here, here too", kind="note")
            raise Stop(whole=True)
        if failure.number in BATCH_ABORTING_ERRORS:
            self.find(frame.source, line, f"error {failure.number}",
                      f"SQL Server fails this statement ({failure.message}), which ends the batch: what follows in "
                      "it does not run, here either", kind="note")
            raise Stop(whole=True)
        self.find(frame.source, line, f"error {failure.number}",
                  f"SQL Server fails this statement ({failure.message}): it does nothing, the batch goes on, here too",
                  kind="note")

    # ------------------------------------------------------------ statements

    def execute(self, frame: Frame, statement: Stmt) -> None:
        handler: Callable = getattr(self, "_" + type(statement).__name__.lower())
        try:
            handler(frame, statement)
        except StatementFailed as failed:
            self.statement_failed(frame, failed)

    def _skipped(self, frame: Frame, statement: Skipped) -> None:
        # A statement the importer does not run (a query, a synonym, OPENROWSET, ...) that names a
        # job procedure may change jobs when SQL Server runs it: said, never dropped silently.
        if statement.end > statement.start:
            named = _job_procedures_named(frame.text[statement.start:statement.end])
            if named:
                line = self.line(frame, statement.start)
                self.find(frame.source, line, f"{statement.word} naming {', '.join(named)}",
                          f"{self.snippet(frame, statement.start)!r} is not run by the importer: what it does to "
                          "jobs when SQL Server runs it is not carried")
            elif self.in_try(frame) or (self.session.xact_abort and self.session.trancount > 0):
                # It may fail on SQL Server (a division by zero, a missing table), and there that
                # sends control to the CATCH or rolls the transaction back: not knowable here.
                line = self.line(frame, statement.start)
                self.find(frame.source, line, statement.word,
                          f"{self.snippet(frame, statement.start)!r} is not run by the importer; inside TRY (or under "
                          "XACT_ABORT) its failure on SQL Server would change what the script does to the jobs: "
                          "taken as succeeding")
        frame.error = 0

    def _declare(self, frame: Frame, statement: Declare) -> None:
        for name, type_, initial, kind in statement.items:
            if kind != "scalar":
                frame.variables[name] = Var(None, Unknown(f"a {kind} variable"))
                continue
            value = None
            if initial is not None:
                value = self.value(frame, initial, statement.start)
                value = self.assigned(frame, value, type_, statement.start, name)
            frame.variables[name] = Var(type_, value)
        frame.error = 0

    def _assign(self, frame: Frame, statement: Assign) -> None:
        rows = None
        if statement.source is not None:
            rows = self.query_rows(frame, statement.source, statement.start)
            if isinstance(rows, list) and not rows:
                frame.error = 0                     # no row: the variables keep their values
                return
        for name, operator, expression in statement.targets:
            var = self.variable(frame, name, statement.start)
            if var is None:
                continue
            if rows is not None and isinstance(rows, Unknown):
                value = Unknown(f"a value read from a table or view at line {self.line(frame, statement.start)}")
            else:
                row = rows[-1] if rows else None
                value = self.value(frame, expression, statement.start, row=row)
            if operator != "=":
                value = self.binary(operator[0], var.value, value)
            frame.variables[name] = Var(var.type, self.assigned(frame, value, var.type, statement.start, name))
        frame.error = 0

    def assigned(self, frame: Frame, value: Value, type_: SqlType | None, offset: int, name: str) -> Value:
        if type_ is None:
            return value
        try:
            return convert(value, type_)
        except SqlFailure as failure:
            raise StatementFailed(failure, offset) from None

    def variable(self, frame: Frame, name: str, offset: int) -> Var | None:
        var = frame.variables.get(name)
        if var is None:
            self.find(frame.source, self.line(frame, offset), f"@{name}",
                      "not declared in this batch: SQL Server refuses the batch ('Must declare the scalar variable'); "
                      "the importer goes on as if it were declared")
            var = Var(NVARCHAR_MAX, None)
            frame.variables[name] = var
        return var

    def _setoption(self, frame: Frame, statement: SetOption) -> None:
        words = statement.words
        if len(words) >= 2 and words[-1] in ("ON", "OFF"):
            state = words[-1] == "ON"
            for word in words[:-1]:
                if word == "QUOTED_IDENTIFIER":
                    self.session.quoted_identifier = state
                elif word in ("NOEXEC", "PARSEONLY"):
                    self.session.noexec = state
                elif word == "XACT_ABORT":
                    self.session.xact_abort = state
        frame.error = 0

    def _use(self, frame: Frame, statement: Use) -> None:
        self.session.database = statement.database
        frame.error = 0

    def _fetch(self, frame: Frame, statement: Fetch) -> None:
        for name in statement.variables:
            var = self.variable(frame, name, statement.start)
            if var is not None:
                frame.variables[name] = Var(var.type, Unknown(f"a row fetched from a cursor at line "
                                                              f"{self.line(frame, statement.start)}"))
        frame.error = 0

    def _change(self, frame: Frame, statement: Change) -> None:
        names = {t.value.lower() for t in statement.tokens if t.kind == "name"}
        touched = sorted(names & JOB_TABLES)
        if touched:
            self.find(frame.source, self.line(frame, statement.start), f"{statement.verb} on msdb's {touched[0]}",
                      "a direct change to SQL Agent's tables: the importer follows only msdb's procedures, so what "
                      "this statement does to the jobs is not carried")
        frame.error = 0

    def _module(self, frame: Frame, statement: Module) -> None:
        name = statement.name[-1].lower() if statement.name else ""
        line = self.line(frame, statement.start)
        mentions = {t.value.lower() for t in statement.body if t.kind == "name"} & (set(SIGNATURES) | set(NOT_FOLLOWED))
        if statement.kind == "PROCEDURE":
            self.session.procedures[name] = UserProcedure(name, statement.params, statement.body, frame.text,
                                                          frame.lines, line)
            if mentions:
                self.find(frame.source, line, f"procedure {name}",
                          f"calls {', '.join(sorted(mentions))}: what it does is followed where the script runs it "
                          "(EXEC), not where it is defined", kind="note")
        elif mentions:
            self.find(frame.source, line, f"{statement.kind.lower()} {name}",
                      f"calls {', '.join(sorted(mentions))} when it fires: a {statement.kind.lower()} is not run by "
                      "the import, so what it would do to the jobs is not carried")
        frame.error = 0

    def _transaction(self, frame: Frame, statement: Transaction) -> None:
        session, line = self.session, self.line(frame, statement.start)
        frame.error = 0
        if statement.action == "BEGIN":
            if session.trancount == 0:
                session.saves = [(None, self.msdb.copy(), line)]
            session.trancount += 1
        elif statement.action == "COMMIT":
            if session.trancount == 0:
                frame.error = 3902
                self.find(frame.source, line, "COMMIT TRANSACTION",
                          "no transaction is open: SQL Server fails it (error 3902)", kind="note")
                return
            session.trancount -= 1
            if session.trancount == 0:
                session.saves = []
        elif statement.action == "SAVE":
            if session.trancount > 0:
                session.saves.append((statement.name, self.msdb.copy(), line))
        elif statement.action == "ROLLBACK":
            if session.trancount == 0:
                frame.error = 3903
                return
            if statement.name is not None and session.saves and any(name == statement.name
                                                                     for name, _, _ in session.saves[1:]):
                index = max(i for i, (name, _, _) in enumerate(session.saves) if name == statement.name)
                target = session.saves[index][1]
                session.saves = session.saves[:index + 1]
                self.report_undone(frame, line, self.msdb, target, "ROLLBACK TRANSACTION " + statement.name)
                self.msdb = target.copy()
                return
            target = session.saves[0][1]
            self.report_undone(frame, line, self.msdb, target, "ROLLBACK TRANSACTION")
            self.msdb = target
            session.trancount = 0
            session.saves = []

    def report_undone(self, frame: Frame, line: int, now: Msdb, before: Msdb, what: str) -> None:
        for key, job in now.jobs.items():
            if key not in before.jobs:
                self.find(frame.source, line, f"job {job.name!r}",
                          f"{what} undoes its creation (SQL Server does the same): the job is not created")
            elif now.job_view(key) != before.job_view(key):
                self.find(frame.source, line, f"job {job.name!r}",
                          f"{what} undoes the changes made to it since the transaction began (SQL Server does the "
                          "same)", job=key)

    def _raise(self, frame: Frame, statement: Raise) -> None:
        line = self.line(frame, statement.start)
        if statement.kind == "THROW":
            frame.error = 50000
            if self.in_try(frame):
                raise Raised()
            self.find(frame.source, line, "THROW", "the batch ends here on SQL Server (an error outside TRY): what "
                      "follows in it does not run, here either", kind="note")
            raise Stop(whole=True)
        severity = self.value(frame, statement.args[1], statement.start) if len(statement.args) > 1 else 16
        severity = severity if isinstance(severity, int) else 16
        if severity >= 20 and statement.with_log:
            self.find(frame.source, line, "RAISERROR", f"severity {severity} WITH LOG closes the connection on SQL "
                      "Server: nothing after it in the file runs, here either")
            raise Disconnect()
        if severity >= 11:
            frame.error = 50000
            if self.in_try(frame):
                raise Raised()
        else:
            frame.error = 0

    # ------------------------------------------------------------ EXEC

    def _exec(self, frame: Frame, statement: Exec) -> None:
        line = self.line(frame, statement.start)
        if isinstance(statement.procedure, VarRef):
            name = self.value(frame, statement.procedure, statement.start)
            if not isinstance(name, str):
                reason = name.reason if isinstance(name, Unknown) else "NULL"
                self.find(frame.source, line, f"EXEC @{statement.procedure.name}",
                          f"the procedure's name is known only when the script runs ({reason}): if it changes jobs, "
                          "that is not carried")
                self.unknown_outputs(frame, statement, line)
                return
            parts = _split_name(name)
        else:
            parts = statement.procedure
        server, database, schema, name = (p.lower() for p in parts)
        if statement.error:
            self.fail(frame, statement, line, name, 119, statement.error)
            return
        if name == "sp_executesql":
            self.sp_executesql(frame, statement, line)
            return
        user = self.session.procedures.get(name)
        if user is not None and database in ("", (self.session.database or "").lower()) and not server:
            self.run_procedure(frame, statement, user, line)
            return
        is_msdb = name in SIGNATURES or name in HARMLESS or name in NOT_FOLLOWED or name.startswith("sp_help")
        if name in SIGNATURES and database not in ("", "msdb") and not server:
            self.fail(frame, statement, line, name, 2812, f"Could not find stored procedure '{database}.{schema or 'dbo'}"
                      f".{name}' (msdb's job procedures are only in msdb)")
            return
        if database == "msdb" or (is_msdb and not database):
            where = database or (self.session.database or "").lower()
            if server:
                self.find(frame.source, line, f"{name} on server {parts[0]}",
                          "a call to another server's msdb (a linked server): its jobs are not this import's")
                self.unknown_outputs(frame, statement, line)
                return
            if not where:
                if not self.session.assumed_msdb and name in SIGNATURES:
                    self.session.assumed_msdb = True
                    self.find(frame.source, line, name, "called without msdb. and without USE msdb before it: taken as "
                              "run in msdb (SQL Server finds it only there)", kind="note")
            elif where != "msdb":
                self.fail(frame, statement, line, name, 2812,
                          f"Could not find stored procedure '{name}' in database {where!r} (msdb's job procedures are "
                          "only in msdb)")
                return
            if schema not in ("", "dbo"):
                self.fail(frame, statement, line, name, 2812, f"Could not find stored procedure '{schema}.{name}'")
                return
            if name in NOT_FOLLOWED:
                self.find(frame.source, line, name, f"{NOT_FOLLOWED[name]}: not followed by the importer")
                self.unknown_outputs(frame, statement, line)
                frame.error = 0
                return
            if name in SIGNATURES:
                self.call_msdb(frame, statement, name, line)
                return
            if name in HARMLESS or name.startswith("sp_help"):
                if name == "sp_start_job":
                    self.find(frame.source, line, "sp_start_job", "starts a job once when the script runs: that run is "
                              "not part of the job's definition (start it with run-now if you need it)", kind="note")
                self.unknown_outputs(frame, statement, line)
                frame.error = 0
                self.set_return(frame, statement, 0, line)
                return
            self.find(frame.source, line, f"msdb.dbo.{name}",
                      "not a procedure of msdb this importer knows: if it changes jobs, that is not carried (SQL Server "
                      "fails the call if it does not exist)")
            self.unknown_outputs(frame, statement, line)
            return
        if name in NOT_FOLLOWED:
            self.find(frame.source, line, name, f"{NOT_FOLLOWED[name]}: not followed by the importer")
        elif not (name in HARMLESS or name.startswith("sp_help")):
            # A procedure neither msdb's nor created by the script (a synonym, sp_MSforeachdb,
            # xp_cmdshell, one that exists only on the server): what it does is not known here,
            # and it may change jobs (its SQL arguments say so when they name a job procedure).
            held = [value for value in self.argument_texts(frame, statement)]
            named = sorted({p for text in held for p in _job_procedures_named(text)})
            full = ".".join(parts).lstrip(".")
            self.find(frame.source, line, f"EXEC {full}",
                      (f"its arguments hold SQL calling {', '.join(named)}, which the importer does not run: what "
                       "that does to jobs is not carried") if named else
                      ("not a procedure this script creates nor one of msdb's: what it does is not known to the "
                       "importer; if it changes jobs, that is not carried"))
        # What it hands back is known only at run time.
        self.unknown_outputs(frame, statement, line)
        frame.error = 0
        self.set_return(frame, statement, Unknown(f"the return code of {name} at line {line}"), line)

    def argument_texts(self, frame: Frame, statement: Exec) -> list[str]:
        """The arguments of a call that are known strings (never raises: an argument whose value
        is not known, or whose computation fails, is left out)."""
        texts = []
        for argument in statement.arguments:
            expression = getattr(argument, "value", None)
            if expression is None:
                continue
            try:
                value = self.value(frame, expression, statement.start)
            except Exception:  # noqa: BLE001 - a look at the arguments, not their computation
                continue
            if isinstance(value, str):
                texts.append(value)
        return texts

    def unknown_outputs(self, frame: Frame, statement: Exec, line: int) -> None:
        for argument in statement.arguments:
            if argument.output and argument.variable is not None:
                var = self.variable(frame, argument.variable, statement.start)
                frame.variables[argument.variable] = Var(var.type, Unknown(f"set by the procedure called at line "
                                                                           f"{line}"))
        if statement.return_variable:
            var = self.variable(frame, statement.return_variable, statement.start)
            frame.variables[statement.return_variable] = Var(var.type, Unknown(f"the return code of the call at line "
                                                                               f"{line}"))

    def set_return(self, frame: Frame, statement: Exec, value: Value, line: int) -> None:
        if statement.return_variable:
            var = self.variable(frame, statement.return_variable, statement.start)
            frame.variables[statement.return_variable] = Var(var.type, self.assigned(
                frame, value, var.type, statement.start, statement.return_variable))

    def fail(self, frame: Frame, statement: Exec, line: int, name: str, number: int, message: str) -> None:
        self.find(frame.source, line, name, f"SQL Server fails this call ({message}): it changes nothing, here either",
                  kind="failure")
        frame.error = number
        if self.in_try(frame):
            raise Raised()

    def arguments(self, frame: Frame, statement: Exec):
        positional, named = [], []
        for argument in statement.arguments:
            if isinstance(argument.value, Lit) and argument.value.value is DEFAULT:
                value: Any = DEFAULT
            else:
                value = self.value(frame, argument.value, statement.start)
                if argument.variable is not None and argument.variable not in frame.variables:
                    value = None
            if argument.name is None:
                positional.append((value, argument.output))
            else:
                named.append((argument.name, value, argument.output))
        return positional, named

    def call_msdb(self, frame: Frame, statement: Exec, name: str, line: int) -> None:
        self.stats.calls += 1
        positional, named = self.arguments(frame, statement)
        try:
            bound, outputs = model.bind(name, positional, named)
        except SqlFailure as failure:
            self.fail(frame, statement, line, name, failure.number, failure.message)
            return
        outcome = self.msdb.call(name, bound)
        if outcome.not_followed:
            self.find(frame.source, line, name, f"{outcome.not_followed}: the call is not followed (the importer goes "
                      "on as if it succeeded)", job=outcome.job_key)
            self.unknown_outputs(frame, statement, line)
            frame.error = 0
            self.set_return(frame, statement, 0, line)
            return
        if outcome.return_code != 0:
            self.find(frame.source, line, name, f"SQL Server refuses this call ({outcome.message}): it changes "
                      "nothing, here either", job=outcome.job_key, kind="failure")
        # OUTPUT parameters: the variable passed gets the value the procedure set.
        by_parameter = {}
        for index, argument in enumerate(statement.arguments):
            parameter = argument.name
            if parameter is None:
                signature = SIGNATURES[name]
                parameter = signature[index].name if index < len(signature) else None
            if argument.output and argument.variable is not None and parameter is not None:
                by_parameter[parameter] = argument.variable
        for parameter, variable in by_parameter.items():
            if parameter in outcome.outputs:
                var = self.variable(frame, variable, statement.start)
                frame.variables[variable] = Var(var.type, self.assigned(frame, outcome.outputs[parameter], var.type,
                                                                        statement.start, variable))
        frame.error = outcome.error
        self.set_return(frame, statement, outcome.return_code, line)
        if outcome.return_code != 0 and outcome.error and self.in_try(frame):
            raise Raised()

    def _execstring(self, frame: Frame, statement: ExecString) -> None:
        line = self.line(frame, statement.start)
        pieces = [self.value(frame, part, statement.start) for part in statement.parts]
        unknown = first_unknown(*pieces)
        if statement.at:
            self.find(frame.source, line, f"EXEC (...) AT {statement.at}",
                      "runs on another server: if it changes jobs there, that is not carried")
            frame.error = 0
            return
        if unknown is not None:
            self.find(frame.source, line, "EXEC (...)", f"runs SQL built at run time ({unknown.reason}): if it changes "
                      "jobs, that is not carried")
            frame.error = 0
            return
        text = "".join(p for p in (to_string(p) for p in pieces) if isinstance(p, str))
        self.dynamic(frame, text, line, {})

    def dynamic(self, frame: Frame, text: str, line: int, variables: dict[str, Var]) -> Frame | None:
        """Dynamic SQL: a batch of its own (its own variables; USE lasts only inside it)."""
        if frame.depth + 1 > MAX_NESTING:
            self.find(frame.source, line, "EXEC", "nested more than 32 levels: SQL Server fails it (error 217)")
            return None
        source = f"{frame.source} (dynamic SQL at line {line})"
        cached = self._dynamic.get(text)
        if cached is None:
            lines = Lines(text)
            try:
                cached = (lines, list(tokens(text, source, lines)))
            except ScriptError as error:
                cached = (lines, error)
            if len(self._dynamic) > 512:
                self._dynamic.clear()
            self._dynamic[text] = cached
        lines, batch_tokens = cached
        try:
            if isinstance(batch_tokens, ScriptError):
                raise batch_tokens
        except ScriptError as error:
            self.find(frame.source, line, "EXEC (...)", f"the SQL it runs does not parse ({error}): SQL Server fails "
                      "it, nothing in it runs", kind="failure")
            frame.error = 102
            return None
        if any(t.word() == "GO" for t in batch_tokens) and any(b.go_line is not None
                                                             for b in batches(text, source, lines)):
            self.find(frame.source, line, "EXEC (...)", "the SQL it runs has GO in it: GO is not T-SQL, SQL Server "
                      "fails it (Incorrect syntax near 'GO'), nothing in it runs", kind="failure")
            frame.error = 102
            return None
        database = self.session.database
        try:
            inner = self.run_batch(batch_tokens, text, lines, source, depth=frame.depth + 1, variables=variables,
                                   parent=frame)
        finally:
            self.session.database = database
        frame.error = inner.error if inner is not None else 0
        return inner

    def sp_executesql(self, frame: Frame, statement: Exec, line: int) -> None:
        """sp_executesql @stmt, @params, @p1 = ..., ...: dynamic SQL with parameters."""
        arguments = statement.arguments
        values = [None if isinstance(a.value, Lit) and a.value.value is DEFAULT else
                  self.value(frame, a.value, statement.start) for a in arguments]
        sql = definitions = None
        rest: list[tuple[int, Any]] = []
        for index, (argument, value) in enumerate(zip(arguments, values)):
            if argument.name == "stmt" or (argument.name is None and index == 0):
                sql = value
            elif argument.name == "params" or (argument.name is None and index == 1):
                definitions = value
            else:
                rest.append((index, value))
        for value in (sql, definitions):
            if isinstance(value, Unknown):
                self.find(frame.source, line, "sp_executesql", f"runs SQL built at run time ({value.reason}): if it "
                          "changes jobs, that is not carried")
                self.unknown_outputs(frame, statement, line)
                return
        if not isinstance(sql, str):
            frame.error = 0
            return
        params = _parameter_definitions(definitions if isinstance(definitions, str) else "")
        if params is None:
            self.find(frame.source, line, "sp_executesql", "its @params cannot be read: what it runs is not followed")
            self.unknown_outputs(frame, statement, line)
            return
        variables = {name: Var(type_, None) for name, type_, _ in params}
        outputs: dict[str, str] = {}
        positional = 0
        for index, value in rest:
            argument = arguments[index]
            if argument.name is None:
                if positional >= len(params):
                    self.fail(frame, statement, line, "sp_executesql", 8144, "too many arguments for its @params")
                    return
                name = params[positional][0]
                positional += 1
            else:
                name = argument.name
                if name not in variables:
                    self.fail(frame, statement, line, "sp_executesql", 8145, f"@{name} is not a parameter of its "
                              "@params")
                    return
            variables[name] = Var(variables[name].type, self.assigned(frame, value, variables[name].type,
                                                                      statement.start, name))
            if argument.output and argument.variable:
                outputs[name] = argument.variable
        inner = self.dynamic(frame, sql, line, variables)
        if inner is not None:
            self.copy_outputs(frame, statement, inner, outputs)
        self.set_return(frame, statement, 0 if inner is not None and not inner.error else 1, line)

    def copy_outputs(self, frame: Frame, statement: Exec, inner: Frame, outputs: dict[str, str]) -> None:
        for name, variable in outputs.items():
            var = self.variable(frame, variable, statement.start)
            value = inner.variables[name].value if name in inner.variables else None
            frame.variables[variable] = Var(var.type, self.assigned(frame, value, var.type, statement.start, variable))

    def run_procedure(self, frame: Frame, statement: Exec, procedure: UserProcedure, line: int) -> None:
        """A procedure the script created (CREATE PROCEDURE): its body runs with its parameters."""
        if frame.depth + 1 > MAX_NESTING:
            self.fail(frame, statement, line, procedure.name, 217, "Maximum stored procedure nesting level exceeded "
                      "(limit 32)")
            return
        params = procedure.params
        by_name = {name: index for index, (name, _, _, _) in enumerate(params)}
        given: dict[str, Value] = {}
        outputs: dict[str, str] = {}
        for index, argument in enumerate(statement.arguments):
            if argument.name is None:
                if index >= len(params):
                    self.fail(frame, statement, line, procedure.name, 8144,
                              f"Procedure or function {procedure.name} has too many arguments specified.")
                    return
                name = params[index][0]
            else:
                name = argument.name
                if name not in by_name:
                    self.fail(frame, statement, line, procedure.name, 8145,
                              f"@{name} is not a parameter for procedure {procedure.name}.")
                    return
            if isinstance(argument.value, Lit) and argument.value.value is DEFAULT:
                continue
            given[name] = self.value(frame, argument.value, statement.start)
            if argument.output and argument.variable:
                outputs[name] = argument.variable
        variables: dict[str, Var] = {}
        for name, type_, default, _ in params:
            if name in given:
                value = given[name]
            elif default is not None:
                value = self.value(frame, default, statement.start)
            else:
                self.fail(frame, statement, line, procedure.name, 201, f"Procedure or function '{procedure.name}' "
                          f"expects parameter '@{name}', which was not supplied.")
                return
            variables[name] = Var(type_, self.assigned(frame, value, type_, statement.start, name))
        source = f"{frame.source} (procedure {procedure.name}, run at line {line})"
        inner = self.run_batch(procedure.body, procedure.text, procedure.lines, source, depth=frame.depth + 1,
                               variables=variables, parent=frame)
        if inner is not None:
            self.copy_outputs(frame, statement, inner, outputs)
            self.set_return(frame, statement, inner.return_value, line)
        frame.error = inner.error if inner is not None else 0

    def _jump(self, frame: Frame, statement: Jump) -> None:
        if statement.kind == "RETURN":
            if statement.value is not None:
                frame.return_value = self.value(frame, statement.value, statement.start)
            raise Stop()
        raise AssertionError(statement.kind)

    # ------------------------------------------------------------ expressions

    def value(self, frame: Frame, expression: Expr, offset: int, *, row: dict | None = None) -> Value:
        try:
            return self.evaluate(frame, expression, row=row)
        except SqlFailure as failure:
            raise StatementFailed(failure, offset) from None
        except RecursionError:
            return Unknown("an expression nested too deeply")

    def evaluate(self, frame: Frame, e: Expr, *, boolean: bool = False, row: dict | None = None) -> Any:
        if isinstance(e, Lit):
            return e.value if e.value is not DEFAULT else None
        if isinstance(e, VarRef):
            var = frame.variables.get(e.name)
            if var is None:
                self.variable(frame, e.name, e.start)
                return None
            return var.value
        if isinstance(e, Global):
            return self.global_value(frame, e.name)
        if isinstance(e, Column):
            if row is not None and e.parts[-1].lower() in row:
                return row[e.parts[-1].lower()]
            return Unknown(f"the column {'.'.join(e.parts)}, known only when the script runs")
        if isinstance(e, Opaque):
            return Unknown(f"{e.reason}, known only when the script runs")
        if isinstance(e, Unary):
            operand = self.evaluate(frame, e.operand, row=row)
            if isinstance(operand, Unknown) or operand is None:
                return operand
            if e.op == "~":
                return ~to_int(operand, "bigint")
            number = operand if isinstance(operand, (int, Decimal, float)) else to_decimal(operand)
            return -number if e.op == "-" else number
        if isinstance(e, Binary):
            if e.op in ("=", "<>", "!=", "<", ">", "<=", ">=", "!<", "!>"):
                return compare(e.op, self.evaluate(frame, e.left, row=row), self.evaluate(frame, e.right, row=row))
            # a + b + c + ... is a left-deep tree as long as the text: walk it without recursion.
            chain = []
            node: Expr = e
            while isinstance(node, Binary) and node.op not in ("=", "<>", "!=", "<", ">", "<=", ">=", "!<", "!>"):
                chain.append(node)
                node = node.left
            value = self.evaluate(frame, node, row=row)
            for link in reversed(chain):
                value = self.binary(link.op, value, self.evaluate(frame, link.right, row=row))
            return value
        if isinstance(e, Logical):
            left = self.evaluate(frame, e.left, boolean=True, row=row)
            if e.op == "AND" and left is False:
                return False
            if e.op == "OR" and left is True:
                return True
            right = self.evaluate(frame, e.right, boolean=True, row=row)
            return logical(e.op, left, right)
        if isinstance(e, Not):
            operand = self.evaluate(frame, e.operand, boolean=True, row=row)
            return operand if operand is None or isinstance(operand, Unknown) else not operand
        if isinstance(e, IsNull):
            operand = self.evaluate(frame, e.operand, row=row)
            if isinstance(operand, Unknown):
                return operand
            return (operand is not None) if e.negated else (operand is None)
        if isinstance(e, InList):
            operand = self.evaluate(frame, e.operand, row=row)
            if e.items is None:
                return Unknown("IN (a subquery)")
            result: Any = False
            for item in e.items:
                outcome = compare("=", operand, self.evaluate(frame, item, row=row))
                result = logical("OR", result, outcome)
                if result is True:
                    break
            return result if result is None or isinstance(result, Unknown) or not e.negated else not result
        if isinstance(e, Like):
            operand = self.evaluate(frame, e.operand, row=row)
            pattern = self.evaluate(frame, e.pattern, row=row)
            escape = self.evaluate(frame, e.escape, row=row) if e.escape is not None else None
            unknown = first_unknown(operand, pattern, escape)
            if unknown is not None:
                return unknown
            if operand is None or pattern is None:
                return None
            matched = like(to_string(operand), to_string(pattern), escape)
            return (not matched) if e.negated else matched
        if isinstance(e, Between):
            operand = self.evaluate(frame, e.operand, row=row)
            low = compare(">=", operand, self.evaluate(frame, e.low, row=row))
            high = compare("<=", operand, self.evaluate(frame, e.high, row=row))
            result = logical("AND", low, high)
            return result if result is None or isinstance(result, Unknown) or not e.negated else not result
        if isinstance(e, Case):
            operand = self.evaluate(frame, e.operand, row=row) if e.operand is not None else None
            for condition, result in e.whens:
                if e.operand is not None:
                    test = compare("=", operand, self.evaluate(frame, condition, row=row))
                else:
                    test = self.evaluate(frame, condition, boolean=True, row=row)
                if isinstance(test, Unknown):
                    return test
                if test is True:
                    return self.evaluate(frame, result, row=row)
            return self.evaluate(frame, e.otherwise, row=row) if e.otherwise is not None else None
        if isinstance(e, Cast):
            operand = self.evaluate(frame, e.operand, row=row)
            if e.type is None:
                return Unknown("a conversion to a type this importer does not evaluate")
            try:
                return convert(operand, e.type)
            except SqlFailure:
                if e.try_:
                    return None
                raise
        if isinstance(e, Func):
            return self.function(frame, e, row)
        if isinstance(e, Subquery):
            rows = self.query_rows(frame, e.tokens, e.start, subquery=True)
            if e.exists:
                return rows if isinstance(rows, Unknown) else bool(rows)
            if isinstance(rows, Unknown):
                return rows
            if not rows:
                return None
            if len(rows) > 1:
                raise SqlFailure(512, "Subquery returned more than 1 value.")
            return next(iter(rows[0].values()), None) if "__value__" not in rows[0] else rows[0]["__value__"]
        return Unknown("an expression this importer does not evaluate")

    def binary(self, op: str, left: Value, right: Value) -> Value:
        unknown = first_unknown(left, right)
        if unknown is not None:
            return unknown
        if left is None or right is None:
            return None
        if op == "+" and isinstance(left, str) and isinstance(right, str):
            if len(left) + len(right) > MAX_TEXT:
                return Unknown(f"a string longer than {MAX_TEXT:,} characters")
            return left + right
        if op == "+" and isinstance(left, bytes) and isinstance(right, bytes):
            return left + right
        if isinstance(left, uuid.UUID) or isinstance(right, uuid.UUID):
            raise SqlFailure(8117, f"Operand data type uniqueidentifier is invalid for {op} operator.")
        left, right = _numeric_pair(left, right)
        try:
            if op == "+":
                return left + right
            if op == "-":
                return left - right
            if op == "*":
                return left * right
            if op == "/":
                if right == 0:
                    raise SqlFailure(8134, "Divide by zero error encountered.")
                if isinstance(left, int) and isinstance(right, int):
                    quotient = abs(left) // abs(right)
                    return quotient if (left >= 0) == (right >= 0) else -quotient
                return left / right
            if op == "%":
                if right == 0:
                    raise SqlFailure(8134, "Divide by zero error encountered.")
                if isinstance(left, int) and isinstance(right, int):
                    remainder = abs(left) % abs(right)
                    return remainder if left >= 0 else -remainder
                return Decimal(left) % Decimal(right)
            if op in ("&", "|", "^"):
                a, b = to_int(left, "bigint"), to_int(right, "bigint")
                return a & b if op == "&" else a | b if op == "|" else a ^ b
        except (InvalidOperation, DivisionByZero):
            raise SqlFailure(8115, "Arithmetic overflow or invalid operation.") from None
        return Unknown(f"the operator {op}")

    def global_value(self, frame: Frame, name: str) -> Value:
        if name == "error":
            return frame.error
        if name == "trancount":
            return self.session.trancount
        if name == "nestlevel":
            return frame.depth
        return Unknown(f"@@{name.upper()}")

    def function(self, frame: Frame, e: Func, row: dict | None) -> Value:
        name = e.name
        if e.qualified:
            return Unknown(f"the function {name.lower()}()")
        if name == "NEWID":
            return uuid.uuid4()
        if name == "DB_NAME" and not e.args:
            return self.session.database or Unknown("DB_NAME(): the database the script runs in")
        args = [self.evaluate(frame, a, row=row) for a in e.args]
        if name in ("ISNULL",) and len(args) == 2:
            if isinstance(args[0], Unknown):
                return args[0]
            return args[1] if args[0] is None else args[0]
        if name == "COALESCE":
            for value in args:
                if isinstance(value, Unknown):
                    return value
                if value is not None:
                    return value
            return None
        if name == "NULLIF" and len(args) == 2:
            equal = compare("=", args[0], args[1])
            return equal if isinstance(equal, Unknown) else (None if equal else args[0])
        if name == "IIF" and len(e.args) == 3:
            test = self.evaluate(frame, e.args[0], boolean=True, row=row)
            if isinstance(test, Unknown):
                return test
            return args[1] if test is True else args[2]
        if name == "CONCAT":
            unknown = first_unknown(*args)
            if unknown is not None:
                return unknown
            return "".join(to_string(a) for a in args if a is not None)
        if name == "CONCAT_WS" and args:
            unknown = first_unknown(*args)
            if unknown is not None:
                return unknown
            separator = to_string(args[0]) or ""
            return separator.join(to_string(a) for a in args[1:] if a is not None)
        unknown = first_unknown(*args)
        if unknown is not None:
            return unknown
        handler = STRING_FUNCTIONS.get(name)
        if handler is None:
            return Unknown(f"{name}()")
        if any(a is None for a in args):
            return None
        try:
            return handler(*args)
        except TypeError:
            raise SqlFailure(174, f"The {name.lower()} function was given {len(args)} argument(s): SQL Server refuses "
                                  "it") from None

    # ------------------------------------------------------------ reading msdb's tables

    def query_rows(self, frame: Frame, query: list[Token], offset: int, *, subquery: bool = False):
        """The rows of a query over msdb's job tables (as the model has them), or Unknown for any
        other source. query: a whole subquery (SELECT ... FROM ...), or the clauses after a
        SELECT's list (FROM ...)."""
        line = self.line(frame, offset)
        plan = self.query_plan(frame, query, subquery)
        if plan.value is not None:
            return [{"__value__": self.value(frame, plan.value, offset)}]
        if plan.problem is not None:
            return Unknown(plan.problem.format(line=line))
        parts = plan.parts
        if len(parts) < 3 and (self.session.database or "msdb").lower() != "msdb":
            return Unknown(f"a value read from a table or view at line {line}")
        rows = self.table(parts[-1])
        if isinstance(rows, Unknown):
            return rows
        selected = []
        for record in rows:
            if plan.alias:
                record = dict(record, **{f"{plan.alias}.{k}": v for k, v in record.items()})
            if plan.condition is not None:
                test = self.evaluate(frame, plan.condition, boolean=True, row=record)
                if isinstance(test, Unknown):
                    return Unknown(f"rows of the query at line {line} ({test.reason})")
                if test is not True:
                    continue
            selected.append(record)
        if plan.select is not None:
            if isinstance(plan.select, Func) and plan.select.name == "COUNT":
                return [{"__value__": len(selected)}]
            return [{"__value__": self.value(frame, plan.select, offset, row=r)} for r in selected]
        return selected

    def query_plan(self, frame: Frame, query: list[Token], subquery: bool) -> "QueryPlan":
        """A query read once (a loop may run it many times)."""
        key = ("query", id(query), subquery)
        cached = self._compiled.get(key)
        if cached is not None:
            return cached[1]
        plan = _read_query(query, subquery, frame)
        if len(self._compiled) > 512:
            self._compiled.clear()
        self._compiled[key] = (query, plan)
        return plan

    def table(self, name: str):
        msdb = self.msdb
        if name in ("sysjobs", "sysjobs_view"):
            return [{"job_id": j.job_id, "name": j.name, "enabled": j.enabled, "description": j.description,
                     "start_step_id": j.start_step_id, "notify_level_eventlog": j.notify_level_eventlog,
                     "delete_level": j.delete_level} for j in msdb.jobs.values()]
        if name in ("sysschedules", "sysschedules_localserver_view"):
            return [{"schedule_id": s.schedule_id, "schedule_uid": s.uid, "name": s.name, "enabled": s.enabled,
                     **{k: getattr(s, k) for k in model.SCHEDULE_FIELDS}} for s in msdb.schedules.values()]
        if name == "sysjobschedules":
            return [{"job_id": msdb.jobs[j].job_id, "schedule_id": s} for j, s in msdb.attachments]
        if name == "sysjobsteps":
            return [{"job_id": j.job_id, "step_id": s.step_id, "step_name": s.step_name, "subsystem": s.subsystem,
                     "command": s.command, "database_name": s.database_name} for j in msdb.jobs.values()
                    for s in j.steps]
        if name == "sysjobservers":
            return [{"job_id": j.job_id, "server_id": 0 if server == model.LOCAL else Unknown("a target server's id")}
                    for j in msdb.jobs.values() for server in j.servers]
        return Unknown(f"rows of msdb.dbo.{name}")


def differing_jobs(models: list[Msdb]) -> dict[int, str]:
    """The jobs on which models copied from one state disagree (only those some side touched
    are compared): key -> name."""
    candidates: set[int] = set()
    schedules: set[int] = set()
    for one in models:
        candidates |= one.touched_jobs
        schedules |= one.touched_schedules
    if schedules:
        for one in models:
            candidates |= {j for j, s in one.attachments if s in schedules}
    out: dict[int, str] = {}
    first = models[0]
    for other in models[1:]:
        for key in candidates:
            if first.job_view(key) != other.job_view(key):
                out[key] = (first.jobs.get(key) or other.jobs[key]).name
    return out


# ---------------------------------------------------------------- helpers


SQLCMD_COMMANDS = {"setvar", "r", "on", "connect", "out", "error", "exit", "quit", "listvar", "reset", "ed",
                   "serverlist", "xml", "perftrace", "help", "list"}


def _sqlcmd_command(batch_tokens: list[Token], lines: Lines) -> Token | None:
    """A sqlcmd command (:setvar, :r, ...) at the start of a line, outside strings and comments."""
    previous_line = 0
    for index, token in enumerate(batch_tokens[:-1]):
        line = lines.line(token.start)
        if token.kind == "operator" and token.value == ":" and line > previous_line:
            following = batch_tokens[index + 1]
            if following.kind == "name" and following.value.lower() in SQLCMD_COMMANDS \
                    and following.start == token.end:
                return following
        previous_line = lines.line(token.end - 1) if token.end > token.start else line
    return None


@dataclass
class QueryPlan:
    value: Expr | None = None           # (SELECT expression) without FROM
    problem: str | None = None          # why the rows are not known ({line} filled in)
    parts: list[str] = field(default_factory=list)
    alias: str | None = None
    condition: Expr | None = None
    select: Expr | None = None


def _read_query(query: list[Token], subquery: bool, frame: Frame) -> QueryPlan:
    unknown = "a value read from a table or view at line {line}"
    select_list: list[Token] = []
    if subquery:
        words = [t.word() for t in query]
        if "FROM" not in words:
            return QueryPlan(value=Parser(query[1:], frame.text, frame.lines).expression())
        select_list, query = query[1:words.index("FROM")], query[words.index("FROM"):]
    if not query or query[0].word() != "FROM":
        return QueryPlan(problem=unknown)
    reader = Parser(query[1:], frame.text, frame.lines)
    parts = [p.lower() for p in reader.multipart_name()]
    table = parts[-1] if parts else ""
    if table not in JOB_TABLES or len(parts) > 3 or (len(parts) >= 2 and parts[-2] not in ("dbo", "")) \
            or (len(parts) == 3 and parts[0] != "msdb"):
        return QueryPlan(problem=unknown)
    if reader.word() == "AS":
        reader.i += 1
    alias = None
    token = reader.peek()
    if token is not None and token.kind == "name" and token.word() not in (
            "WHERE", "WITH", "ORDER", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "OUTER", "GROUP", "OPTION"):
        alias = token.value.lower()
        reader.i += 1
    if reader.word() == "WITH" and reader.op(1) == "(":
        reader.i += 1
        reader.skip_parentheses()
    condition = None
    try:
        if reader.word() == "WHERE":
            reader.i += 1
            condition = reader.expression()
        if reader.word() == "ORDER":
            reader.skip_statement("ORDER")
    except BatchRefused:
        return QueryPlan(problem=unknown)
    if not reader.at_end() and reader.op() != ";":
        return QueryPlan(problem="rows of the query at line {line} (joins and groups are not evaluated)")
    select = None
    if select_list:
        chooser = Parser(select_list, frame.text, frame.lines)
        if chooser.word() == "TOP":
            chooser.i += 1
            if chooser.op() == "(":
                chooser.skip_parentheses()
            else:
                chooser.i += 1
        select = chooser.expression()
    return QueryPlan(parts=parts, alias=alias, condition=condition, select=select)


def _check_declared(parser: Parser, batch_tokens: list[Token], declared: set[str]) -> None:
    """T-SQL resolves variables when it compiles a batch: a variable used before any DECLARE of
    it (in the text, whatever the control flow) makes SQL Server refuse the whole batch."""
    for token in batch_tokens:
        if token.kind != "variable" or token.start in parser.parameter_names:
            continue
        if token.start in parser.declarations:
            declared.add(token.value)
        elif token.value not in declared:
            raise BatchRefused(token.start, f"{token.text} is used but not declared before it in the batch (SQL "
                                            f"Server's error 137, 'Must declare the scalar variable \"{token.text}\"')")


_JOB_PROCEDURE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, SIGNATURES), key=len, reverse=True)) + r")\b",
                            re.IGNORECASE)


def _job_procedures_named(text: str) -> list[str]:
    """The msdb job procedures ``text`` names (the importer's model), in order, once each."""
    return list(dict.fromkeys(match.group(1).lower() for match in _JOB_PROCEDURE.finditer(text)))


def _split_name(text: str) -> list[str]:
    """A procedure's name held in a variable: 'msdb.dbo.sp_add_job', '[msdb]..[x]'."""
    parts, current, i = [], "", 0
    while i < len(text):
        char = text[i]
        if char == "[":
            end = text.find("]", i + 1)
            while end != -1 and text[end + 1:end + 2] == "]":
                end = text.find("]", end + 2)
            current += text[i + 1:end].replace("]]", "]") if end != -1 else text[i + 1:]
            i = end + 1 if end != -1 else len(text)
            continue
        if char == ".":
            parts.append(current)
            current = ""
        else:
            current += char
        i += 1
    parts.append(current.strip())
    parts = parts[-4:]
    return [""] * (4 - len(parts)) + parts


def _parameter_definitions(text: str) -> list[tuple[str, SqlType | None, bool]] | None:
    if not text.strip():
        return []
    try:
        definition_tokens = list(tokens(text))
    except ScriptError:
        return None
    parser = Parser(definition_tokens, text, Lines(text))
    out = []
    while not parser.at_end():
        token = parser.peek()
        if token.kind != "variable":
            return None
        parser.i += 1
        if parser.word() == "AS":
            parser.i += 1
        type_ = parser.data_type()
        if parser.op() == "=":
            parser.i += 1
            parser.expression()
        output = False
        while parser.word() in ("OUT", "OUTPUT", "READONLY"):
            output = output or parser.word() != "READONLY"
            parser.i += 1
        out.append((token.value, type_, output))
        if parser.op() == ",":
            parser.i += 1
    return out


def _numeric_pair(left: Value, right: Value):
    def number(value):
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, (int, Decimal, float)):
            return value
        if isinstance(value, str):
            text = value.strip()
            if re.fullmatch(r"[+-]?\d+", text):
                return to_int(text, "bigint")
            try:
                return to_decimal(text)
            except SqlFailure:
                raise SqlFailure(245, f"Conversion failed when converting the nvarchar value {value!r} to data type "
                                      "int.") from None
        if isinstance(value, bytes):
            return int.from_bytes(value, "big")
        raise SqlFailure(8117, f"Operand data type {type(value).__name__} is invalid for this operator.")
    left, right = number(left), number(right)
    if isinstance(left, float) or isinstance(right, float):
        return to_float(left), to_float(right)
    if isinstance(left, Decimal) or isinstance(right, Decimal):
        return to_decimal(left), to_decimal(right)
    return left, right


def compare(op: str, left: Value, right: Value):
    unknown = first_unknown(left, right)
    if unknown is not None:
        return unknown
    if left is None or right is None:
        return None
    if isinstance(left, uuid.UUID) or isinstance(right, uuid.UUID):
        try:
            left, right = model.convert(left, model.GUID), model.convert(right, model.GUID)
        except SqlFailure:
            raise
        a, b = left.bytes, right.bytes
    elif isinstance(left, str) and isinstance(right, str):
        a, b = text_key(left), text_key(right)
    else:
        a, b = _numeric_pair(left, right)
    if op == "=":
        return a == b
    if op in ("<>", "!="):
        return a != b
    if op == "<":
        return a < b
    if op == ">":
        return a > b
    if op in ("<=", "!>"):
        return a <= b
    if op in (">=", "!<"):
        return a >= b
    raise AssertionError(op)


def logical(op: str, left, right):
    if op == "AND":
        if left is False or right is False:
            return False
        unknown = first_unknown(left, right)
        if unknown is not None:
            return unknown
        if left is None or right is None:
            return None
        return True
    if left is True or right is True:
        return True
    unknown = first_unknown(left, right)
    if unknown is not None:
        return unknown
    if left is None or right is None:
        return None
    return False


def like(value: str, pattern: str, escape: Any) -> bool:
    regex, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if escape and char == escape and i + 1 < len(pattern):
            regex += re.escape(pattern[i + 1])
            i += 2
            continue
        if char == "%":
            regex += ".*"
        elif char == "_":
            regex += "."
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                regex += re.escape(char)
            else:
                body = pattern[i + 1:end]
                regex += "[" + ("^" + re.escape(body[1:]) if body.startswith("^") else re.escape(body)) + "]"
                i = end
        else:
            regex += re.escape(char)
        i += 1
    return re.fullmatch(regex, value.rstrip(" "), re.IGNORECASE | re.DOTALL) is not None


def _replace(text: str, old: str, new: str) -> str:
    if old == "":
        return text
    return re.sub(re.escape(old), lambda _: new, text, flags=re.IGNORECASE)


def _substring(text: str, start: int, length: int) -> str:
    start, length = to_int(start), to_int(length)
    if length < 0:
        raise SqlFailure(537, "Invalid length parameter passed to the substring function.")
    first = max(start, 1)
    last = start + length
    return text[first - 1:max(last - 1, first - 1)] if last > 1 else ""


def _charindex(needle: str, haystack: str, start: int = 1) -> int:
    position = haystack.casefold().find(needle.casefold(), max(to_int(start), 1) - 1)
    return position + 1


def _quotename(text: str, quote: str = "[") -> Value:
    if len(text) > 128:
        return None
    quote = quote[:1]
    close = {"[": "]", "]": "]", "'": "'", '"': '"', "(": ")", ")": ")", "<": ">", ">": ">", "{": "}", "}": "}",
             "`": "`"}.get(quote)
    if close is None:
        return None
    opening = {"]": "[", ")": "(", ">": "<", "}": "{"}.get(quote, quote)
    return opening + text.replace(close, close * 2) + close


def _char(code: Any) -> Value:
    code = to_int(code)
    return chr(code) if 0 <= code <= 255 else None


def _nchar(code: Any) -> Value:
    code = to_int(code)
    return chr(code) if 0 <= code <= 0x10FFFF else None


STRING_FUNCTIONS: dict[str, Callable[..., Value]] = {
    "CHAR": _char,
    "NCHAR": _nchar,
    "ASCII": lambda s: ord(to_string(s)[0]) if to_string(s) else None,
    "UNICODE": lambda s: ord(to_string(s)[0]) if to_string(s) else None,
    "LEN": lambda s: len(to_string(s).rstrip(" ")),
    "DATALENGTH": lambda s: len(to_string(s)) * 2 if isinstance(s, str) else None,
    "UPPER": lambda s: to_string(s).upper(),
    "LOWER": lambda s: to_string(s).lower(),
    "LTRIM": lambda s, chars=" ": to_string(s).lstrip(to_string(chars)),
    "RTRIM": lambda s, chars=" ": to_string(s).rstrip(to_string(chars)),
    "TRIM": lambda s, chars=" ": to_string(s).strip(to_string(chars)),
    "REPLACE": lambda s, old, new: _replace(to_string(s), to_string(old), to_string(new)),
    "SUBSTRING": lambda s, start, length: _substring(to_string(s), start, length),
    "LEFT": lambda s, n: to_string(s)[:max(to_int(n), 0)],
    "RIGHT": lambda s, n: to_string(s)[-to_int(n):] if to_int(n) > 0 else "",
    "CHARINDEX": lambda needle, haystack, start=1: _charindex(to_string(needle), to_string(haystack), start),
    "REPLICATE": lambda s, n: to_string(s) * max(to_int(n), 0) if len(to_string(s)) * max(to_int(n), 0) <= MAX_TEXT
    else Unknown("a string too long"),
    "SPACE": lambda n: " " * max(to_int(n), 0) if to_int(n) <= 8000 else None,
    "REVERSE": lambda s: to_string(s)[::-1],
    "STUFF": lambda s, start, length, new: (to_string(s)[:to_int(start) - 1] + to_string(new)
                                            + to_string(s)[to_int(start) - 1 + to_int(length):])
    if 1 <= to_int(start) <= len(to_string(s)) else None,
    "QUOTENAME": lambda s, quote="[": _quotename(to_string(s), to_string(quote)),
    "ABS": lambda n: abs(n) if isinstance(n, (int, Decimal, float)) else abs(to_decimal(n)),
    "STR": lambda n, length=10, decimals=0: Unknown("STR()"),
}
