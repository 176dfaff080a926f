"""A job's SQL may not end the transaction the agent runs it in.

The agent runs a job (or a step) inside its own transaction: that is what rolls a failed
attempt's work back, and what commits a step's work in the control database together with the
move to the next step. A ``COMMIT`` in the job's SQL would commit its work before the agent
knows whether the attempt succeeded (a failing step's work committed once per attempt), and a
``ROLLBACK`` would let the statements after it run outside any transaction of the agent's.
Each dialect refuses it, before it can take effect:

* **SQLite**: the job's statements run under an authorizer that denies every transaction
  statement (``BEGIN``, ``COMMIT``/``END``, ``ROLLBACK``; a ``SAVEPOINT``, ``RELEASE`` or
  ``ROLLBACK TO`` stays allowed): SQLite's own parser decides, at prepare time.
* **PostgreSQL**: the script is read here, with PostgreSQL's lexical rules (comments, nested
  block comments, quoted strings and identifiers, ``E''`` strings, dollar quoting, and the
  ``BEGIN ATOMIC ... END`` bodies of SQL-standard functions), and a script with a top-level
  ``COMMIT``, ``END``, ``ROLLBACK`` (not ``ROLLBACK TO``), ``ABORT``, ``BEGIN``, ``START
  TRANSACTION``, or ``PREPARE TRANSACTION`` is refused before any of it runs. Procedures and
  ``DO`` blocks cannot end the transaction at all: PostgreSQL refuses a ``COMMIT`` in them
  inside a transaction block ("invalid transaction termination"). A way around this reader
  still fails the attempt: the batch that runs the job first takes its transaction's id, and the
  completion's batch (check_work_transaction) refuses to record a success in any other
  transaction (a chained one too: ``COMMIT AND CHAIN``), before its COMMIT.
* **SQL Server / Azure SQL**: the job runs through ``sp_executesql`` inside one more nested
  ``BEGIN TRANSACTION``, so a ``COMMIT`` in it only decrements ``@@TRANCOUNT`` and commits
  nothing; a changed ``@@TRANCOUNT`` afterwards (a ``COMMIT`` or ``ROLLBACK`` in the job) fails
  the attempt and the agent rolls everything back (shared/control/store.py).
"""

from __future__ import annotations

import re

_REFUSED = ("COMMIT", "END", "ROLLBACK", "ABORT", "BEGIN", "START", "PREPARE")
_WORD = re.compile(r"[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$")


def refused_message(statement: str) -> str:
    return (f"the job's SQL may not end the agent's transaction: {statement!r} is refused (the agent commits "
            "a job's work when the attempt succeeds and rolls it back when it fails; use SAVEPOINT / "
            "ROLLBACK TO SAVEPOINT inside a job, or split the work into steps)")


def postgres_transaction_statement(sql: str) -> str | None:
    """The first top-level transaction statement of a PostgreSQL script (its first words, as
    written), or None. Raises nothing: text it cannot read to the end (an unterminated quote)
    is left to the server, which refuses it."""
    words = _statement_words(sql)
    for statement in words:
        if not statement:
            continue
        first = statement[0].upper()
        second = statement[1].upper() if len(statement) > 1 else ""
        if first not in _REFUSED:
            continue
        if first == "ROLLBACK" and (second == "TO" or (second in ("WORK", "TRANSACTION")
                                                      and len(statement) > 2 and statement[2].upper() == "TO")):
            continue     # ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name: inside the transaction
        if first == "START" and second != "TRANSACTION":
            continue
        if first == "PREPARE" and second != "TRANSACTION":
            continue     # PREPARE name AS ...: a prepared statement
        return " ".join(statement[:3])
    return None


def _statement_words(sql: str) -> list[list[str]]:
    """Each top-level statement's first three words (keywords and bare identifiers)."""
    statements: list[list[str]] = [[]]
    # Inside CREATE FUNCTION/PROCEDURE ... BEGIN ATOMIC, semicolons do not end the statement
    # until the matching END (psql counts BEGIN/CASE against END the same way).
    depth = 0
    words_seen = 0
    first_word = ""
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if ch == "/" and sql.startswith("/*", i):
            level, i = 1, i + 2
            while i < n and level:
                if sql.startswith("/*", i):
                    level, i = level + 1, i + 2
                elif sql.startswith("*/", i):
                    level, i = level - 1, i + 2
                else:
                    i += 1
            continue
        if ch == "'":
            escapes = i > 0 and sql[i - 1] in "eE" and (i < 2 or not (sql[i - 2].isalnum() or sql[i - 2] == "_"))
            i += 1
            while i < n:
                if escapes and sql[i] == "\\":
                    i += 2
                    continue
                if sql[i] == "'":
                    if sql.startswith("''", i):
                        i += 2
                        continue
                    i += 1
                    break
                i += 1
            _note(statements, "'", words_seen)
            words_seen += 1
            continue
        if ch == '"':
            end = i + 1
            while True:
                end = sql.find('"', end)
                if end < 0:
                    end = n
                    break
                if sql.startswith('""', end):
                    end += 2
                    continue
                break
            _note(statements, '"', words_seen)
            words_seen += 1
            i = end + 1
            continue
        if ch == "$":
            match = _DOLLAR_TAG.match(sql, i)
            if match and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] == "_")):
                close = sql.find(match.group(0), match.end())
                i = n if close < 0 else close + len(match.group(0))
                _note(statements, "$", words_seen)
                words_seen += 1
                continue
            i += 1
            continue
        if ch == ";":
            if depth == 0:
                statements.append([])
                words_seen = 0
                first_word = ""
            i += 1
            continue
        match = _WORD.match(sql, i)
        if match and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] in "_$")):
            word = match.group(0)
            upper = word.upper()
            if words_seen == 0:
                first_word = upper
            if first_word == "CREATE" and upper in ("BEGIN", "CASE"):
                depth += 1
            elif upper == "END" and depth > 0:
                depth -= 1
            _note(statements, word, words_seen)
            words_seen += 1
            i = match.end()
            continue
        if not ch.isspace():
            _note(statements, ch, words_seen)
            words_seen += 1
        i += 1
    return statements


def _note(statements: list[list[str]], token: str, words_seen: int) -> None:
    if words_seen < 3:
        statements[-1].append(token)
