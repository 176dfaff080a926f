"""T-SQL statements and expressions, parsed from a batch's tokens into the few forms the
interpreter runs (declarations, assignments, EXEC, dynamic SQL, IF/WHILE/GOTO/TRY, transactions)
and one form for everything else (skipped: valid T-SQL that does not touch jobs).

The parser never refuses valid T-SQL: a statement it does not know is skipped up to the next
statement's first word, as SQL Server's grammar delimits it (a SET after UPDATE belongs to the
UPDATE, a SELECT after UNION or INSERT to the statement before, END closes a CASE before it
closes a block). What SQL Server itself refuses at compile time (an expression as a procedure's
argument) raises BatchRefused: the batch does not run, as on SQL Server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.ops.sqlagent.lexer import BINARY, GLOBAL, NAME, NUMBER, OPERATOR, STRING, VARIABLE, Lines, Token
from shared.ops.sqlagent.values import SqlType, Unknown, sql_type

MAX_NESTING = 120      # parentheses and blocks; SQL Server refuses deeper nesting too (error 191)

# Words that begin a statement (where skipping an unknown statement stops).
STATEMENT_WORDS = {
    "DECLARE", "SET", "EXEC", "EXECUTE", "IF", "ELSE", "WHILE", "BEGIN", "END", "GOTO", "RETURN", "PRINT",
    "RAISERROR", "THROW", "COMMIT", "ROLLBACK", "SAVE", "USE", "INSERT", "UPDATE", "DELETE", "MERGE", "CREATE",
    "ALTER", "DROP", "TRUNCATE", "FETCH", "OPEN", "CLOSE", "DEALLOCATE", "BREAK", "CONTINUE", "WAITFOR", "GRANT",
    "DENY", "REVOKE", "DBCC", "BACKUP", "RESTORE", "CHECKPOINT", "KILL", "RECONFIGURE", "SHUTDOWN", "SELECT", "WITH",
    "BULK", "READTEXT", "WRITETEXT", "UPDATETEXT", "REVERT", "SETUSER", "ENABLE", "DISABLE", "GET", "SEND",
    "RECEIVE", "MOVE",
}
# Reserved words: never an unquoted identifier (so never a bare-word procedure argument).
RESERVED = STATEMENT_WORDS | {
    "ADD", "ALL", "AND", "ANY", "AS", "ASC", "AUTHORIZATION", "BETWEEN", "BROWSE", "BY", "CASCADE", "CASE", "CHECK",
    "CLUSTERED", "COALESCE", "COLLATE", "COLUMN", "CONSTRAINT", "CONTAINS", "CONTAINSTABLE", "CONVERT", "CROSS",
    "CURRENT", "CURSOR", "DATABASE", "DEFAULT", "DESC", "DISTINCT", "DISTRIBUTED", "DOUBLE", "DUMP", "ERRLVL",
    "ESCAPE", "EXCEPT", "EXISTS", "EXIT", "EXTERNAL", "FILE", "FILLFACTOR", "FOR", "FOREIGN", "FREETEXT", "FROM",
    "FULL", "FUNCTION", "GROUP", "HAVING", "HOLDLOCK", "IDENTITY", "IN", "INDEX", "INNER", "INTERSECT", "INTO", "IS",
    "JOIN", "KEY", "LEFT", "LIKE", "LINENO", "LOAD", "NATIONAL", "NOCHECK", "NONCLUSTERED", "NOT", "NULL", "NULLIF",
    "OF", "OFF", "OFFSETS", "ON", "OPTION", "OR", "ORDER", "OUTER", "OVER", "PERCENT", "PIVOT", "PLAN", "PRIMARY",
    "PROC", "PROCEDURE", "PUBLIC", "READ", "REFERENCES", "REPLICATION", "RIGHT", "ROWCOUNT", "ROWGUIDCOL", "RULE",
    "SCHEMA", "SOME", "STATISTICS", "TABLE", "TEXTSIZE", "THEN", "TO", "TOP", "TRAN", "TRANSACTION", "TRIGGER",
    "UNION", "UNIQUE", "UNPIVOT", "USER", "VALUES", "VARYING", "VIEW", "WHEN", "WHERE", "WITHIN",
}
MODULES = {"PROC", "PROCEDURE", "FUNCTION", "TRIGGER", "VIEW"}


class BatchRefused(Exception):
    """SQL Server refuses to compile the batch (so none of it runs): the message says where and
    why."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


# ---------------------------------------------------------------- expressions


class Expr:
    start: int = 0


@dataclass
class Lit(Expr):
    value: Any


@dataclass
class VarRef(Expr):
    name: str
    start: int = 0


@dataclass
class Global(Expr):
    name: str


@dataclass
class Column(Expr):
    parts: list[str]


@dataclass
class Opaque(Expr):
    """Something whose value only the server knows when the script runs."""
    reason: str


@dataclass
class Unary(Expr):
    op: str
    operand: Expr


@dataclass
class Binary(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass
class Logical(Expr):
    op: str                     # AND, OR
    left: Expr
    right: Expr


@dataclass
class Not(Expr):
    operand: Expr


@dataclass
class IsNull(Expr):
    operand: Expr
    negated: bool


@dataclass
class InList(Expr):
    operand: Expr
    items: list[Expr] | None     # None: a subquery
    negated: bool


@dataclass
class Like(Expr):
    operand: Expr
    pattern: Expr
    escape: Expr | None
    negated: bool


@dataclass
class Between(Expr):
    operand: Expr
    low: Expr
    high: Expr
    negated: bool


@dataclass
class Func(Expr):
    name: str                   # upper case, last part
    args: list[Expr]
    qualified: bool = False     # schema.function(): a function of the database's, not a built-in


@dataclass
class Cast(Expr):
    operand: Expr
    type: SqlType | None        # None: a type this importer does not evaluate
    style: Expr | None
    try_: bool


@dataclass
class Case(Expr):
    operand: Expr | None
    whens: list[tuple[Expr, Expr]]
    otherwise: Expr | None


@dataclass
class Subquery(Expr):
    tokens: list[Token]
    exists: bool = False
    start: int = 0


# ---------------------------------------------------------------- statements


@dataclass
class Stmt:
    start: int                  # offset of its first token


@dataclass
class Declare(Stmt):
    items: list[tuple[str, SqlType | None, Expr | None, str]]     # (name, type, initial value, kind)


@dataclass
class Assign(Stmt):
    targets: list[tuple[str, str, Expr]]    # (variable, operator '=' '+=' ..., value)
    source: list[Token] | None = None       # a SELECT's FROM ... clause: rows from a table
    cursor: bool = False                    # SET @c = CURSOR FOR ...


@dataclass
class SetOption(Stmt):
    words: list[str]


@dataclass
class Argument:
    name: str | None            # the parameter (lower case, no @), None when positional
    value: Expr                 # Lit, VarRef or Lit(DEFAULT)
    output: bool
    variable: str | None        # the variable passed (for OUTPUT)


@dataclass
class Exec(Stmt):
    procedure: list[str] | VarRef    # [server, database, schema, name] (missing parts '') or a variable
    arguments: list[Argument]
    return_variable: str | None
    error: str | None = None         # a form SQL Server refuses when it runs the call (positional after named)


@dataclass
class ExecString(Stmt):
    parts: list[Expr]
    at: str | None


@dataclass
class Use(Stmt):
    database: str


@dataclass
class Transaction(Stmt):
    action: str                 # BEGIN, COMMIT, ROLLBACK, SAVE
    name: str | None


@dataclass
class Raise(Stmt):
    kind: str                   # RAISERROR, THROW
    args: list[Expr]
    with_log: bool


@dataclass
class Module(Stmt):
    kind: str                   # PROCEDURE, FUNCTION, TRIGGER, VIEW
    name: list[str]
    params: list[tuple[str, SqlType | None, Expr | None, bool]]   # (name, type, default, output)
    body: list[Token]
    alter: bool


@dataclass
class Fetch(Stmt):
    variables: list[str]


@dataclass
class Change(Stmt):
    """INSERT, UPDATE, DELETE, MERGE, TRUNCATE: tables it touches."""
    verb: str
    tokens: list[Token]


@dataclass
class Skipped(Stmt):
    word: str
    end: int = -1               # offset after its last token (-1: not known)


@dataclass
class Block(Stmt):
    body: list[Stmt]


@dataclass
class If(Stmt):
    condition: Expr
    then: Stmt
    otherwise: Stmt | None


@dataclass
class While(Stmt):
    condition: Expr
    body: Stmt


@dataclass
class Try(Stmt):
    body: list[Stmt]
    catch: list[Stmt]


@dataclass
class Jump(Stmt):
    kind: str                   # GOTO, BREAK, CONTINUE, RETURN
    label: str | None = None
    value: Expr | None = None


@dataclass
class Label(Stmt):
    name: str


@dataclass
class Parsed:
    statements: list[Stmt] = field(default_factory=list)


class Parser:
    def __init__(self, tokens: list[Token], text: str, lines: Lines, *, quoted_identifier: bool = True) -> None:
        self.t = tokens
        self.i = 0
        self.text = text
        self.lines = lines
        self.quoted_identifier = quoted_identifier
        self.depth = 0
        self.declarations: set[int] = set()     # offsets of the @names DECLARE declares
        self.parameter_names: set[int] = set()  # offsets of @param in EXEC p @param = value

    # ------------------------------------------------------------ token helpers

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.t[j] if j < len(self.t) else None

    def word(self, k: int = 0) -> str | None:
        token = self.peek(k)
        return token.word() if token is not None else None

    def op(self, k: int = 0) -> str | None:
        token = self.peek(k)
        return token.value if token is not None and token.kind == OPERATOR else None

    def take(self) -> Token:
        if self.i >= len(self.t):
            raise BatchRefused(self.offset(), "the batch ends in the middle of a statement")
        token = self.t[self.i]
        self.i += 1
        return token

    def at_end(self) -> bool:
        return self.i >= len(self.t)

    def offset(self) -> int:
        token = self.peek()
        return token.start if token is not None else (self.t[-1].end if self.t else 0)

    def refuse(self, message: str) -> BatchRefused:
        return BatchRefused(self.offset(), message)

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.refuse("some part of the batch is nested too deeply (SQL Server's error 191)")

    # ------------------------------------------------------------ statements

    def statements(self) -> list[Stmt]:
        out: list[Stmt] = []
        while not self.at_end():
            statement = self.statement()
            if statement is not None:
                out.append(statement)
        return out

    def statement(self) -> Stmt | None:
        token = self.peek()
        start = token.start
        if token.kind == OPERATOR and token.value == ";":
            self.i += 1
            return None
        word = token.word()
        if token.kind == NAME and self.op(1) == ":" and self.op(2) != ":" and word not in RESERVED:
            self.i += 2
            return Label(start, token.value.lower())
        handler = getattr(self, "_" + word.lower(), None) if word else None
        if handler is not None and word in STATEMENT_WORDS:
            return handler(start)
        if word == "ELSE" or word == "END":
            # A stray ELSE/END (the block it belongs to was not parsed as one): skip it.
            self.i += 1
            return Skipped(start, word)
        self.skip_statement(word or token.text)
        return Skipped(start, word or token.text, self.t[self.i - 1].end if self.i else -1)

    def _begin(self, start: int) -> Stmt:
        next_word = self.word(1)
        if next_word in ("TRAN", "TRANSACTION"):
            self.i += 2
            return Transaction(start, "BEGIN", self.transaction_name())
        if next_word == "DISTRIBUTED":
            self.i += 3
            return Transaction(start, "BEGIN", self.transaction_name())
        if next_word == "TRY":
            self.i += 2
            self.nest()
            body = self.block_until("END", "TRY")
            if self.word() != "BEGIN" or self.word(1) != "CATCH":
                raise self.refuse("BEGIN TRY ... END TRY without its BEGIN CATCH")
            self.i += 2
            catch = self.block_until("END", "CATCH")
            self.depth -= 1
            return Try(start, body, catch)
        if next_word in ("DIALOG", "CONVERSATION"):
            self.skip_statement("BEGIN")
            return Skipped(start, "BEGIN DIALOG")
        self.i += 1
        self.nest()
        body = []
        while not self.at_end() and self.word() != "END":
            statement = self.statement()
            if statement is not None:
                body.append(statement)
        if self.at_end():
            raise self.refuse("BEGIN without its END")
        self.i += 1
        self.depth -= 1
        return Block(start, body)

    def block_until(self, first: str, second: str) -> list[Stmt]:
        body = []
        while not self.at_end() and not (self.word() == first and self.word(1) == second):
            statement = self.statement()
            if statement is not None:
                body.append(statement)
        if self.at_end():
            raise self.refuse(f"no {first} {second}")
        self.i += 2
        return body

    def transaction_name(self) -> str | None:
        token = self.peek()
        if token is not None and (token.kind == VARIABLE or (token.kind == NAME and token.word() not in RESERVED
                                                             and self.op(1) != ":")):
            self.i += 1
            if self.word() == "WITH":          # WITH MARK 'description'
                self.i += 1
                if self.word() == "MARK":
                    self.i += 1
                    if self.peek() is not None and self.peek().kind == STRING:
                        self.i += 1
            return token.value.lower() if token.kind == NAME else "@" + token.value
        return None

    def _if(self, start: int) -> Stmt:
        self.i += 1
        self.nest()
        condition = self.expression()
        then = self.required_statement("IF")
        otherwise = None
        while self.op() == ";":
            self.i += 1
        if self.word() == "ELSE":
            self.i += 1
            otherwise = self.required_statement("ELSE")
        self.depth -= 1
        return If(start, condition, then, otherwise)

    def required_statement(self, after: str) -> Stmt:
        while self.op() == ";":
            self.i += 1
        if self.at_end():
            raise self.refuse(f"{after} without a statement after it")
        statement = self.statement()
        return statement if statement is not None else Skipped(self.offset(), ";")

    def _while(self, start: int) -> Stmt:
        self.i += 1
        self.nest()
        condition = self.expression()
        body = self.required_statement("WHILE")
        self.depth -= 1
        return While(start, condition, body)

    def _goto(self, start: int) -> Stmt:
        self.i += 1
        label = self.take()
        if label.kind != NAME:
            raise BatchRefused(label.start, f"GOTO {label.text}: a label is a name")
        return Jump(start, "GOTO", label.value.lower())

    def _break(self, start: int) -> Stmt:
        self.i += 1
        return Jump(start, "BREAK")

    def _continue(self, start: int) -> Stmt:
        self.i += 1
        return Jump(start, "CONTINUE")

    def _return(self, start: int) -> Stmt:
        self.i += 1
        value = None
        token = self.peek()
        if token is not None and (token.kind in (NUMBER, VARIABLE, GLOBAL) or self.op() in ("(", "-", "+")):
            value = self.expression()
        return Jump(start, "RETURN", value=value)

    def _declare(self, start: int) -> Stmt:
        self.i += 1
        items = []
        while True:
            token = self.peek()
            if token is None:
                break
            if token.kind == NAME and self.word(1) in ("CURSOR", "INSENSITIVE", "SCROLL"):
                # DECLARE name CURSOR ... FOR SELECT ...: a server-side cursor, rows known at run time.
                self.i += 1
                self.skip_cursor_definition()
                return Declare(start, items)
            if token.kind != VARIABLE:
                break
            self.i += 1
            self.declarations.add(token.start)
            if self.word() == "AS":
                self.i += 1
            if self.word() == "TABLE":
                self.i += 1
                self.skip_parentheses()
                items.append((token.value, None, None, "table"))
            elif self.word() == "CURSOR":
                self.i += 1
                items.append((token.value, None, None, "cursor"))
            else:
                type_ = self.data_type()
                initial = None
                if self.op() == "=":
                    self.i += 1
                    initial = self.expression()
                items.append((token.value, type_, initial, "scalar"))
            if self.op() == ",":
                self.i += 1
                continue
            break
        return Declare(start, items)

    def skip_cursor_definition(self) -> None:
        # ... CURSOR [options] FOR select [FOR UPDATE [OF cols]]
        while not self.at_end() and self.word() != "FOR":
            self.i += 1
        if not self.at_end():
            self.i += 1
            self.skip_statement("SELECT", consume_first=False)
            if self.word() == "FOR" and self.word(1) in ("UPDATE", "READ"):
                self.i += 2
                if self.word() == "ONLY":
                    self.i += 1
                if self.word() == "OF":
                    self.i += 1
                    while self.peek() is not None and (self.peek().kind == NAME or self.op() in (",", ".")) \
                            and self.word() not in STATEMENT_WORDS:
                        self.i += 1

    def data_type(self) -> SqlType | None:
        """A type name with its arguments; None for a type this importer does not evaluate."""
        parts = []
        while True:
            token = self.peek()
            if token is None or token.kind != NAME:
                break
            parts.append(token.value)
            self.i += 1
            if self.op() == ".":
                self.i += 1
                continue
            break
        if not parts:
            return None
        name = parts[-1].lower()
        if name == "national" and self.word() in ("CHAR", "CHARACTER"):
            self.i += 1
            name = "nchar"
            if self.word() == "VARYING":
                self.i += 1
                name = "nvarchar"
        if name in ("double",) and self.word() == "PRECISION":
            self.i += 1
            name = "float"
        if name in ("char", "character") and self.word() == "VARYING":
            self.i += 1
            name = "varchar"
        name = {"character": "char", "integer": "int", "dec": "decimal"}.get(name, name)
        arguments: list[str] = []
        if self.op() == "(":
            self.i += 1
            while not self.at_end() and self.op() != ")":
                token = self.take()
                if token.kind in (NUMBER, NAME):
                    arguments.append(str(token.value))
            self.i += 1
        try:
            return sql_type(name, arguments)
        except ValueError:
            return None

    def _set(self, start: int) -> Stmt:
        self.i += 1
        token = self.peek()
        if token is not None and token.kind == VARIABLE:
            self.i += 1
            operator = self.take().value if self.op() is not None else "="
            if self.word() == "CURSOR":
                self.skip_cursor_definition()
                return Assign(start, [(token.value, "=", Opaque("a cursor"))], cursor=True)
            value = self.expression()
            return Assign(start, [(token.value, operator, value)])
        # SET option[, option ...] {ON | OFF}, SET option value, SET TRANSACTION ISOLATION LEVEL ...
        words: list[str] = []
        if self.word() == "TRANSACTION":
            while not self.at_end() and self.word() in ("TRANSACTION", "ISOLATION", "LEVEL", "READ", "COMMITTED",
                                                        "UNCOMMITTED", "REPEATABLE", "SNAPSHOT", "SERIALIZABLE"):
                words.append(self.take().value.upper())
            return SetOption(start, words)
        while not self.at_end():
            token = self.peek()
            word = token.word()
            if word in ("ON", "OFF"):
                words.append(word)
                self.i += 1
                break
            if token.kind == NAME and (not words or self.op(-1) in (",", ".") or words[-1] in (
                    "STATISTICS", "IDENTITY_INSERT", "OFFSETS")) and word not in STATEMENT_WORDS:
                words.append(word or token.value)
                self.i += 1
                continue
            if token.kind == OPERATOR and token.value in (",", "."):
                self.i += 1
                continue
            if token.kind == OPERATOR and token.value == "-":
                self.i += 1
                continue
            if token.kind in (NUMBER, STRING, VARIABLE, BINARY, NAME) and words:
                words.append(str(token.value))
                self.i += 1
            break
        return SetOption(start, words)

    def _select(self, start: int) -> Stmt:
        self.i += 1
        while self.word() in ("ALL", "DISTINCT"):
            self.i += 1
        if self.word() == "TOP":
            self.i += 1
            if self.op() == "(":
                self.skip_parentheses()
            else:
                self.i += 1
            while self.word() in ("PERCENT", "WITH", "TIES"):
                self.i += 1
        targets = []
        assigns = False
        while not self.at_end():
            token = self.peek()
            if token.kind == VARIABLE and self.op(1) in ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^="):
                self.i += 1
                operator = self.take().value
                targets.append((token.value, operator, self.expression()))
                assigns = True
            elif token.kind == NAME and not token.quoted and self.op(1) == "=" and token.word() not in RESERVED:
                self.i += 2                     # alias = expression
                self.expression()
            else:
                self.expression()
                if self.word() == "AS":
                    self.i += 1
                if self.peek() is not None and (self.peek().kind == STRING or (
                        self.peek().kind == NAME and self.word() not in RESERVED and self.op(1) != ":")):
                    self.i += 1                 # column alias
            if self.op() == ",":
                self.i += 1
                continue
            break
        clause_start = self.i
        self.skip_statement("SELECT", consume_first=False)
        clause = self.t[clause_start:self.i]
        if not assigns:
            return Skipped(start, "SELECT", self.t[self.i - 1].end if self.i else -1)
        return Assign(start, targets, source=clause if clause else None)

    def _with(self, start: int) -> Stmt:
        # WITH cte [(columns)] AS (query) [, ...] statement: the statement reads the CTE, a
        # table of rows known at run time.
        self.i += 1
        if self.word() == "XMLNAMESPACES":
            self.i += 1
            self.skip_parentheses()
        while not self.at_end():
            self.i += 1                 # the CTE's name
            if self.op() == "(":
                self.skip_parentheses()
            if self.word() == "AS":
                self.i += 1
            if self.op() == "(":
                self.skip_parentheses()
            if self.op() == ",":
                self.i += 1
                continue
            break
        if self.at_end():
            return Skipped(start, "WITH")
        statement = self.statement()
        if isinstance(statement, Assign) and statement.source is None:
            statement.source = []
        return statement if statement is not None else Skipped(start, "WITH")

    def _exec(self, start: int) -> Stmt:
        return self._execute(start)

    def _execute(self, start: int) -> Stmt:
        self.i += 1
        if self.word() == "AS":                 # EXECUTE AS LOGIN = '...': a context switch
            self.skip_statement("EXECUTE", consume_first=False)
            return Skipped(start, "EXECUTE AS")
        if self.op() == "(":
            self.i += 1
            parts = [self.expression()]
            while self.op() == "+":
                self.i += 1
                parts.append(self.expression())
            if self.op() == ",":                 # EXEC ('...', @arg) ... AT server: parameters of a remote call
                while not self.at_end() and self.op() != ")":
                    self.i += 1
            if self.op() != ")":
                raise self.refuse("EXEC ( ... ) without its closing parenthesis")
            self.i += 1
            at = None
            if self.word() == "AS" and self.word(1) in ("LOGIN", "USER"):
                self.i += 2
                if self.op() == "=":
                    self.i += 1
                self.i += 1
            if self.word() == "AT":
                self.i += 1
                if self.word() == "DATA_SOURCE":
                    self.i += 1
                at = self.take().value
            return ExecString(start, parts, at)
        return_variable = None
        if self.peek() is not None and self.peek().kind == VARIABLE and self.op(1) == "=":
            return_variable = self.take().value
            self.i += 1
        token = self.peek()
        if token is None:
            raise self.refuse("EXEC without a procedure")
        if token.kind == VARIABLE:
            self.i += 1
            procedure: list[str] | VarRef = VarRef(token.value, token.start)
        else:
            procedure = self.multipart_name()
            if not procedure:
                raise self.refuse(f"EXEC of {token.text!r}: expected a procedure's name")
        if self.op() == ";" and self.peek(1) is not None and self.peek(1).kind == NUMBER \
                and self.peek(1).start == self.peek().end:
            self.i += 2                         # a numbered procedure: name;2
        arguments: list[Argument] = []
        error = None
        named_seen = False
        while self.starts_argument():
            argument = self.argument()
            if argument.name is None and named_seen and error is None:
                error = ("SQL Server's error 119: after the form '@name = value' has been used, all subsequent "
                         "parameters must be passed in the form '@name = value'")
            named_seen = named_seen or argument.name is not None
            arguments.append(argument)
            if self.op() != ",":
                break
            self.i += 1
            if not self.starts_argument():
                # SQL Server's "Incorrect syntax near ','": the batch does not compile (a file cut
                # after a comma, an argument left out), so nothing of it ran.
                raise self.refuse("an argument list that ends with ',' (SQL Server: incorrect syntax near ',')")
        if self.word() == "WITH":
            self.i += 1
            if self.word() == "RESULT" and self.word(1) == "SETS":
                self.i += 2
                if self.op() == "(":
                    self.skip_parentheses()
                else:
                    self.i += 1
            else:
                while self.word() in ("RECOMPILE",) or self.op() == ",":
                    self.i += 1
        return Exec(start, procedure if isinstance(procedure, VarRef) else _four_parts(procedure), arguments,
                    return_variable, error)

    def multipart_name(self) -> list[str]:
        """server.database.schema.name with any part left out (msdb..sp_add_job)."""
        parts: list[str] = []
        expecting = True
        while not self.at_end():
            token = self.peek()
            if token.kind == NAME and expecting and (token.quoted or token.word() not in RESERVED or not parts):
                parts.append(token.value)
                self.i += 1
                expecting = False
            elif token.kind == OPERATOR and token.value == ".":
                if expecting:
                    parts.append("")
                self.i += 1
                expecting = True
            else:
                break
        return parts

    def starts_argument(self) -> bool:
        token = self.peek()
        if token is None:
            return False
        if token.kind in (STRING, NUMBER, BINARY, VARIABLE):
            return True
        if token.kind == OPERATOR and token.value in ("-", "+") and self.peek(1) is not None \
                and self.peek(1).kind == NUMBER:
            return True
        if token.kind == NAME:
            if token.quoted:
                return True
            word = token.word()
            return word in ("NULL", "DEFAULT") or word not in RESERVED
        return False

    def argument(self) -> Argument:
        name = None
        token = self.peek()
        if token.kind == VARIABLE and self.op(1) == "=":
            name = token.value
            self.parameter_names.add(token.start)
            self.i += 2
        value_token = self.peek()
        if value_token is None:
            raise self.refuse(f"@{name} = without a value")
        variable = None
        if value_token.kind == VARIABLE:
            self.i += 1
            value: Expr = VarRef(value_token.value, value_token.start)
            variable = value_token.value
        elif value_token.kind in (STRING, BINARY):
            self.i += 1
            value = Lit(_string_literal(value_token) if value_token.kind == STRING else value_token.value)
        elif value_token.kind == NUMBER:
            self.i += 1
            value = Lit(value_token.value)
        elif value_token.kind == OPERATOR and value_token.value in ("-", "+"):
            self.i += 2
            number = self.peek(-1).value
            value = Lit(-number if value_token.value == "-" else number)
        elif value_token.kind == NAME:
            self.i += 1
            word = value_token.word()
            if word == "NULL":
                value = Lit(None)
            elif word == "DEFAULT":
                from shared.ops.sqlagent.msdb import DEFAULT
                value = Lit(DEFAULT)
            elif value_token.quoted and value_token.text.startswith('"') and not self.quoted_identifier:
                value = Lit(value_token.value)
            else:
                value = Lit(value_token.value)          # an unquoted word is a string argument
        else:
            raise self.refuse(f"{'@' + name + ' = ' if name else ''}{value_token.text!r}: a procedure's argument "
                              "must be a constant or a variable")
        output = False
        if self.word() in ("OUTPUT", "OUT"):
            self.i += 1
            output = True
        elif self.word() == "READONLY":
            self.i += 1
        following = self.peek()
        if following is not None and following.kind == OPERATOR and following.value not in (",", ";", ")"):
            label = f"@{name}" if name else "a positional argument"
            raise self.refuse(f"{label}: {following.text!r} after the value: a procedure's argument must be a "
                              "constant or a variable, not an expression (compute it into a variable first)")
        return Argument(name, value, output, variable)

    def _print(self, start: int) -> Stmt:
        self.i += 1
        self.expression()
        return Skipped(start, "PRINT")

    def _raiserror(self, start: int) -> Stmt:
        self.i += 1
        args = []
        if self.op() == "(":
            self.i += 1
            while not self.at_end() and self.op() != ")":
                args.append(self.expression())
                if self.op() == ",":
                    self.i += 1
            self.i += 1
        else:                                   # RAISERROR 50001 'message' (the old form)
            if self.peek() is not None and self.peek().kind == NUMBER:
                args.append(Lit(self.take().value))
            if self.peek() is not None and self.peek().kind in (STRING, VARIABLE):
                args.insert(0, self.expression())
        with_log = False
        if self.word() == "WITH":
            self.i += 1
            while self.word() in ("LOG", "NOWAIT", "SETERROR") or self.op() == ",":
                if self.word() == "LOG":
                    with_log = True
                self.i += 1
        return Raise(start, "RAISERROR", args, with_log)

    def _throw(self, start: int) -> Stmt:
        self.i += 1
        args = []
        token = self.peek()
        if token is not None and (token.kind in (NUMBER, VARIABLE) or self.op() == "-"):
            args.append(self.expression())
            while self.op() == ",":
                self.i += 1
                args.append(self.expression())
        return Raise(start, "THROW", args, False)

    def _use(self, start: int) -> Stmt:
        self.i += 1
        token = self.take()
        return Use(start, token.value)

    def _commit(self, start: int) -> Stmt:
        self.i += 1
        if self.word() in ("TRAN", "TRANSACTION", "WORK"):
            self.i += 1
        name = self.transaction_name() if self.word() not in ("WITH",) else None
        if self.word() == "WITH":
            self.i += 1
            self.skip_parentheses()
        return Transaction(start, "COMMIT", name)

    def _rollback(self, start: int) -> Stmt:
        self.i += 1
        if self.word() in ("TRAN", "TRANSACTION", "WORK"):
            self.i += 1
        return Transaction(start, "ROLLBACK", self.transaction_name())

    def _save(self, start: int) -> Stmt:
        self.i += 1
        if self.word() in ("TRAN", "TRANSACTION"):
            self.i += 1
        return Transaction(start, "SAVE", self.transaction_name())

    def _create(self, start: int) -> Stmt:
        return self.module_or_skip(start, alter=False)

    def _alter(self, start: int) -> Stmt:
        return self.module_or_skip(start, alter=True)

    def module_or_skip(self, start: int, *, alter: bool) -> Stmt:
        k = 1
        if self.word(k) == "OR" and self.word(k + 1) in ("ALTER", "REPLACE"):
            k += 2
        kind = self.word(k)
        if kind not in MODULES:
            self.skip_statement("CREATE")
            return Skipped(start, "CREATE", self.t[self.i - 1].end if self.i else -1)
        self.i += k + 1
        name = self.multipart_name()
        params: list[tuple[str, SqlType | None, Expr | None, bool]] = []
        if kind in ("PROC", "PROCEDURE"):
            if self.op() == ";" and self.peek(1) is not None and self.peek(1).kind == NUMBER:
                self.i += 2
            parenthesised = self.op() == "("
            if parenthesised:
                self.i += 1
            while self.peek() is not None and self.peek().kind == VARIABLE:
                param = self.take().value
                if self.word() == "AS":
                    self.i += 1
                type_ = self.data_type()
                if self.word() == "VARYING":
                    self.i += 1
                default = None
                if self.op() == "=":
                    self.i += 1
                    default = self.expression()
                output = False
                while self.word() in ("OUT", "OUTPUT", "READONLY", "NULL", "NOT"):
                    output = output or self.word() in ("OUT", "OUTPUT")
                    self.i += 1
                params.append((param, type_, default, output))
                if self.op() == ",":
                    self.i += 1
            if parenthesised and self.op() == ")":
                self.i += 1
        # WITH options ... FOR REPLICATION ... AS body (the body runs to the end of the batch)
        while not self.at_end() and self.word() != "AS":
            self.i += 1
        if not self.at_end():
            self.i += 1
        body = self.t[self.i:]
        self.i = len(self.t)
        return Module(start, "PROCEDURE" if kind == "PROC" else kind, name, params, body, alter)

    def _fetch(self, start: int) -> Stmt:
        self.i += 1
        variables = []
        while not self.at_end() and self.word() != "INTO" and self.word() not in STATEMENT_WORDS:
            self.i += 1
        if self.word() == "INTO":
            self.i += 1
            while self.peek() is not None and self.peek().kind == VARIABLE:
                variables.append(self.take().value)
                if self.op() == ",":
                    self.i += 1
        return Fetch(start, variables)

    def _insert(self, start: int) -> Stmt:
        return self.change(start)

    def _update(self, start: int) -> Stmt:
        return self.change(start)

    def _delete(self, start: int) -> Stmt:
        return self.change(start)

    def _merge(self, start: int) -> Stmt:
        return self.change(start)

    def _truncate(self, start: int) -> Stmt:
        return self.change(start)

    def change(self, start: int) -> Stmt:
        first = self.i
        verb = self.word()
        self.skip_statement(verb)
        return Change(start, verb, self.t[first:self.i])

    def _drop(self, start: int) -> Stmt:
        self.i += 1
        if self.peek() is not None:
            self.i += 1                         # TABLE, PROCEDURE, ...
        if self.word() == "IF" and self.word(1) == "EXISTS":
            self.i += 2
        self.skip_statement("DROP", consume_first=False)
        return Skipped(start, "DROP")

    def _grant(self, start: int) -> Stmt:
        # GRANT EXECUTE ON x TO y: EXECUTE here is a permission, not a statement.
        self.i += 1
        while not self.at_end() and self.word() not in ("TO", "FROM"):
            self.i += 1
        if not self.at_end():
            self.i += 1
            while not self.at_end():
                self.i += 1
                if self.op() == ",":
                    self.i += 1
                    continue
                break
            if self.word() in ("WITH", "AS", "CASCADE"):
                self.skip_statement("GRANT", consume_first=False)
        return Skipped(start, "GRANT")

    _deny = _grant
    _revoke = _grant

    # Statements skipped whole: nothing in them changes a job or a variable.
    def _plain(self, start: int) -> Stmt:
        word = self.word()
        self.skip_statement(word)
        return Skipped(start, word)

    _open = _close = _deallocate = _waitfor = _dbcc = _backup = _restore = _checkpoint = _kill = _plain
    _reconfigure = _shutdown = _bulk = _readtext = _writetext = _updatetext = _revert = _setuser = _plain
    _enable = _disable = _get = _send = _receive = _move = _plain

    def _else(self, start: int) -> Stmt:
        self.i += 1
        return Skipped(start, "ELSE")

    def _end(self, start: int) -> Stmt:
        self.i += 1
        return Skipped(start, "END")

    # ------------------------------------------------------------ skipping

    def skip_parentheses(self) -> None:
        if self.op() != "(":
            return
        depth = 0
        while not self.at_end():
            op = self.op()
            self.i += 1
            if op == "(":
                depth += 1
            elif op == ")":
                depth -= 1
                if depth == 0:
                    return

    def skip_statement(self, verb: str, *, consume_first: bool = True) -> None:
        """Skip one statement of SQL Server's grammar that begins with verb, up to the first
        word of the next statement."""
        if consume_first and not self.at_end():
            self.i += 1
        depth = case = 0
        set_allowed = verb in ("UPDATE", "MERGE")
        select_allowed = verb in ("INSERT",)
        values_seen = False
        while not self.at_end():
            token = self.peek()
            if token.kind == OPERATOR:
                if token.value == "(":
                    depth += 1
                elif token.value == ")":
                    if depth == 0:
                        return
                    depth -= 1
                elif token.value == ";" and depth == 0:
                    self.i += 1
                    return
                self.i += 1
                continue
            word = token.word()
            if depth == 0 and word is not None:
                previous = self.peek(-1).word() if self.i > 0 else None
                if word == "CASE":
                    case += 1
                elif word == "END" and case:
                    case -= 1
                elif verb == "MERGE":
                    pass                        # a MERGE ends with its semicolon
                elif word == "SET" and set_allowed:
                    set_allowed = False
                elif word == "SELECT" and (previous in ("UNION", "ALL", "EXCEPT", "INTERSECT") or
                                            (select_allowed and not values_seen)):
                    select_allowed = False
                elif word in ("INSERT", "UPDATE", "DELETE") and previous in ("ON", "FOR", "AFTER", "OF", ","):
                    pass                        # ON DELETE CASCADE, FOR INSERT, UPDATE
                elif word == "ELSE" and case:
                    pass
                elif word == "WITH" or (word == "IF" and self.word(1) == "EXISTS" and previous in MODULES | {
                        "TABLE", "INDEX", "SCHEMA", "TYPE", "SEQUENCE", "SYNONYM", "DATABASE", "USER", "ROLE"}):
                    pass
                elif word == "SET" and previous in ("ON", "OFF"):
                    pass
                elif word in STATEMENT_WORDS and not (word == "OPEN" and previous == "FOR"):
                    return
                if word == "VALUES":
                    values_seen = True
            self.i += 1

    # ------------------------------------------------------------ expressions

    def expression(self) -> Expr:
        self.nest()
        try:
            return self.or_expression()
        finally:
            self.depth -= 1

    def or_expression(self) -> Expr:
        left = self.and_expression()
        while self.word() == "OR":
            self.i += 1
            left = Logical("OR", left, self.and_expression())
        return left

    def and_expression(self) -> Expr:
        left = self.not_expression()
        while self.word() == "AND":
            self.i += 1
            left = Logical("AND", left, self.not_expression())
        return left

    def not_expression(self) -> Expr:
        if self.word() == "NOT":
            self.i += 1
            return Not(self.not_expression())
        return self.comparison()

    def comparison(self) -> Expr:
        left = self.additive()
        while True:
            op = self.op()
            if op in ("=", "<>", "!=", "<", ">", "<=", ">=", "!<", "!>"):
                self.i += 1
                if self.word() in ("ALL", "ANY", "SOME"):
                    self.i += 1
                    self.skip_parentheses()
                    left = Opaque("a comparison with a subquery")
                    continue
                left = Binary(op, left, self.additive())
                continue
            negated = False
            if self.word() == "NOT" and self.word(1) in ("IN", "LIKE", "BETWEEN"):
                negated = True
                self.i += 1
            word = self.word()
            if word == "IS":
                self.i += 1
                is_not = self.word() == "NOT"
                if is_not:
                    self.i += 1
                if self.word() == "NULL":
                    self.i += 1
                left = IsNull(left, is_not)
                continue
            if word == "IN":
                self.i += 1
                if self.op() != "(":
                    return Opaque("IN without a list")
                if self.word(1) in ("SELECT", "WITH"):
                    self.skip_parentheses()
                    left = InList(left, None, negated)
                    continue
                self.i += 1
                items = []
                while not self.at_end() and self.op() != ")":
                    items.append(self.expression())
                    if self.op() == ",":
                        self.i += 1
                    elif self.op() != ")":
                        break
                if self.op() == ")":
                    self.i += 1
                left = InList(left, items, negated)
                continue
            if word == "LIKE":
                self.i += 1
                pattern = self.additive()
                escape = None
                if self.word() == "ESCAPE":
                    self.i += 1
                    escape = self.additive()
                left = Like(left, pattern, escape, negated)
                continue
            if word == "BETWEEN":
                self.i += 1
                low = self.additive()
                if self.word() == "AND":
                    self.i += 1
                high = self.additive()
                left = Between(left, low, high, negated)
                continue
            return left

    def additive(self) -> Expr:
        left = self.multiplicative()
        while self.op() in ("+", "-", "&", "|", "^"):
            op = self.take().value
            left = Binary(op, left, self.multiplicative())
        return left

    def multiplicative(self) -> Expr:
        left = self.unary()
        while self.op() in ("*", "/", "%"):
            op = self.take().value
            left = Binary(op, left, self.unary())
        return left

    def unary(self) -> Expr:
        if self.op() in ("-", "+", "~"):
            op = self.take().value
            self.nest()
            try:
                return Unary(op, self.unary())
            finally:
                self.depth -= 1
        return self.postfix(self.primary())

    def postfix(self, value: Expr) -> Expr:
        while True:
            if self.word() == "COLLATE":
                self.i += 2
                continue
            if self.word() == "AT" and self.word(1) == "TIME" and self.word(2) == "ZONE":
                self.i += 3
                self.additive()
                value = Opaque("a time zone conversion")
                continue
            if self.op() == "::" or (self.op() == "." and isinstance(value, VarRef)):
                self.i += 1
                self.take()
                if self.op() == "(":
                    self.skip_parentheses()
                value = Opaque("a method call")
                continue
            return value

    def primary(self) -> Expr:
        token = self.peek()
        if token is None:
            return Opaque("nothing")
        kind = token.kind
        if kind == STRING:
            self.i += 1
            return Lit(_string_literal(token))
        if kind in (NUMBER, BINARY):
            self.i += 1
            return Lit(token.value)
        if kind == VARIABLE:
            self.i += 1
            return VarRef(token.value, token.start)
        if kind == GLOBAL:
            self.i += 1
            if self.op() == "(":
                self.skip_parentheses()
            return Global(token.value)
        if kind == OPERATOR:
            if token.value == "(":
                if self.word(1) in ("SELECT", "WITH"):
                    return self.subquery(exists=False)
                self.i += 1
                inner = self.expression()
                if self.op() == ",":            # a row constructor: (a, b)
                    while not self.at_end() and self.op() != ")":
                        self.i += 1
                if self.op() == ")":
                    self.i += 1
                return inner
            if token.value == "*":
                self.i += 1
                return Opaque("*")
            return Opaque(f"{token.text!r}")
        if kind != NAME:
            self.i += 1
            return Opaque(f"{token.text!r}")
        word = token.word()
        if word == "NULL":
            self.i += 1
            return Lit(None)
        if word == "CASE":
            return self.case()
        if word in ("CAST", "TRY_CAST", "CONVERT", "TRY_CONVERT", "PARSE", "TRY_PARSE") and self.op(1) == "(":
            return self.cast(word)
        if word == "EXISTS":
            self.i += 1
            return self.subquery(exists=True)
        if word == "NEXT" and self.word(1) == "VALUE":
            self.i += 3
            self.multipart_name()
            return Opaque("a sequence's next value")
        if word in STATEMENT_WORDS or word in ("FROM", "WHERE", "THEN", "WHEN", "AS", "ON", "INTO", "ORDER",
                                               "GROUP", "HAVING", "UNION", "EXCEPT", "INTERSECT"):
            return Opaque(f"{token.text}")      # not an expression: the caller goes on from here
        if token.quoted and token.text.startswith('"') and not self.quoted_identifier:
            self.i += 1
            return Lit(token.value)             # SET QUOTED_IDENTIFIER OFF: "..." is a string
        parts = self.multipart_name()
        if self.op() == "(":
            return self.function(parts)
        if self.op() == ".":                    # alias.*
            self.i += 2
        return Column(parts)

    def function(self, parts: list[str]) -> Expr:
        self.i += 1                             # (
        args: list[Expr] = []
        if self.word() in ("DISTINCT", "ALL"):
            self.i += 1
        while not self.at_end() and self.op() != ")":
            args.append(self.expression())
            if self.op() == ",":
                self.i += 1
            elif self.op() != ")":
                # Something a function's argument list may hold that is not an expression
                # (DATEADD(day, ...)'s datepart is one; USING, ORDER BY in STRING_AGG).
                while not self.at_end() and self.op() not in (",", ")"):
                    if self.op() == "(":
                        self.skip_parentheses()
                    else:
                        self.i += 1
                if self.op() == ",":
                    self.i += 1
        if self.op() == ")":
            self.i += 1
        call = Func(parts[-1].upper(), args, qualified=len(parts) > 1)
        if self.word() == "WITHIN" and self.word(1) == "GROUP":
            self.i += 2
            self.skip_parentheses()
        if self.word() == "OVER":
            self.i += 1
            self.skip_parentheses()
            return Opaque(f"the window function {parts[-1]}()")
        return call

    def cast(self, word: str) -> Expr:
        self.i += 2                             # CAST (
        if word in ("CAST", "TRY_CAST", "PARSE", "TRY_PARSE"):
            operand = self.expression()
            type_ = None
            if self.word() == "AS":
                self.i += 1
                type_ = self.cast_type()
            style = None
            if self.word() == "USING":
                self.i += 2
                type_ = None
        else:
            type_ = self.cast_type()
            if self.op() == ",":
                self.i += 1
            operand = self.expression()
            style = None
            if self.op() == ",":
                self.i += 1
                style = self.expression()
        while not self.at_end() and self.op() != ")":
            self.i += 1
        self.i += 1
        if word in ("PARSE", "TRY_PARSE"):
            return Opaque(f"{word}()")
        return Cast(operand, type_, style, word.startswith("TRY_"))

    def cast_type(self) -> SqlType | None:
        start = self.i
        parsed = self.data_type()
        if parsed is None:
            return None
        token_name = self.t[start].value.lower()
        arguments_given = self.t[self.i - 1].kind == OPERATOR if self.i > start + 1 else False
        if not arguments_given:
            return sql_type(parsed.name if token_name != "sysname" else "sysname", None, in_cast=True)
        return parsed

    def case(self) -> Expr:
        self.i += 1
        self.nest()
        operand = None if self.word() == "WHEN" else self.expression()
        whens = []
        while self.word() == "WHEN":
            self.i += 1
            condition = self.expression()
            if self.word() == "THEN":
                self.i += 1
            whens.append((condition, self.expression()))
        otherwise = None
        if self.word() == "ELSE":
            self.i += 1
            otherwise = self.expression()
        if self.word() == "END":
            self.i += 1
        self.depth -= 1
        return Case(operand, whens, otherwise)

    def subquery(self, *, exists: bool) -> Expr:
        start = self.i
        offset = self.offset()
        self.skip_parentheses()
        return Subquery(self.t[start + 1:self.i - 1], exists, offset)


def _string_literal(token: Token) -> Any:
    value = token.value
    if not token.national and not _fits_code_page(value):
        return Unknown("a '...' string without N holding characters outside Windows-1252: SQL Server stores it in "
                       "the server's code page (often as '?'); write N'...'")
    return value


def _fits_code_page(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("cp1252")
        return True
    except UnicodeEncodeError:
        return False


def _four_parts(parts: list[str]) -> list[str]:
    """[server, database, schema, name] from the parts written (msdb..x, dbo.x, x)."""
    parts = parts[-4:]
    return [""] * (4 - len(parts)) + parts
