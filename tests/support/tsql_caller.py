"""Calling the T-SQL interface as a user would, through pyodbc: ``EXEC agent.p @a = ?`` on SQL
Server, ``SELECT * FROM agent.p(a => ?)`` on PostgreSQL (named notation, the arguments cast to the
parameters' types, as psql would type literals), on a connection of the user's own in autocommit
(a DBA in SSMS or psql, not the agent's store).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The PostgreSQL type of each parameter of the interface (pyodbc binds a Python int as a bigint,
# which PostgreSQL does not narrow to int by itself).
PG_TYPES = {
    "sql": "text", "execution_order": "int", "database": "varchar", "run_at": "timestamptz",
    "max_attempts": "int", "timeout_seconds": "int", "name": "varchar", "schedule": "varchar",
    "timezone": "varchar", "enabled": "int", "overlap": "varchar", "misfire": "varchar",
    "grace_seconds": "int", "lease_seconds": "int", "job_name": "varchar", "run_id": "bigint",
    "poison_id": "bigint", "targets": "varchar", "target_parallelism": "int", "target_stagger_seconds": "int",
    "catchup_seconds": "int", "until": "timestamptz",
    "reason": "varchar", "after": "varchar", "after_outcome": "varchar",
    "dates": "text", "weekly": "text", "exclude_calendars": "varchar", "only_calendars": "varchar",
    "on_excluded": "varchar", "jitter_seconds": "int", "params": "text", "steps": "text",
    # agent.add_alert (issue 32 item 3)
    "query": "text", "errors": "varchar", "delay_between_responses_seconds": "int", "notify": "int",
    "response_job": "varchar",
}


@dataclass
class CallError(Exception):
    """A procedure refused: its SQLSTATE (PostgreSQL) or error number (SQL Server) and message."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


def connect(url: str):
    import pyodbc

    from shared.control.db import parse_database_url

    return pyodbc.connect(parse_database_url(url).location, autocommit=True, timeout=10)


def dialect_of(connection) -> str:
    import pyodbc

    name = connection.getinfo(pyodbc.SQL_DBMS_NAME).lower()
    return "postgres" if "postgres" in name else "mssql"


def call(connection, procedure: str, **arguments: Any) -> list[dict[str, Any]]:
    """Call agent.<procedure> with named arguments; the rows it returns, as dicts."""
    import pyodbc

    dialect = dialect_of(connection)
    names = list(arguments)
    # A point in time goes as ISO-8601 text with its offset (pyodbc drops a datetime's tzinfo),
    # read as timestamptz / DATETIMEOFFSET by the server.
    values = [arguments[name].isoformat() if isinstance(arguments[name], datetime) else arguments[name]
              for name in names]
    if dialect == "postgres":
        listed = ", ".join(f'"{name}" => CAST(? AS {PG_TYPES[name]})' for name in names)
        sql = f"SELECT * FROM agent.{procedure}({listed})"
    else:
        # A point in time is declared DATETIMEOFFSET first, as a user's script would: Babelfish
        # does not convert a text argument of EXEC to a DATETIMEOFFSET parameter by itself.
        moments = [name for name in names if isinstance(arguments[name], datetime)]
        declared = "".join(f"DECLARE @agent_arg_{name} DATETIMEOFFSET(7) = ?; " for name in moments)
        values = [values[names.index(name)] for name in moments] + [
            value for name, value in zip(names, values) if name not in moments]
        listed = ", ".join(f"@{name} = @agent_arg_{name}" for name in moments)
        listed = ", ".join(filter(None, [listed, ", ".join(f"@{name} = ?" for name in names if name not in moments)]))
        sql = f"SET NOCOUNT ON; {declared}EXEC agent.{procedure} " + listed
    cursor = connection.cursor()
    try:
        cursor.execute(sql, values) if values else cursor.execute(sql)
        rows: list[dict[str, Any]] = []
        while True:
            if cursor.description:
                columns = [column[0].lower() for column in cursor.description]
                rows += [dict(zip(columns, row)) for row in cursor.fetchall()]
            if not cursor.nextset():
                break
        return rows
    except pyodbc.Error as exc:
        raise error_of(exc) from None
    finally:
        cursor.close()


def select(connection, sql: str) -> list[dict[str, Any]]:
    import pyodbc

    cursor = connection.cursor()
    try:
        cursor.execute(sql)
        columns = [column[0].lower() for column in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]
    except pyodbc.Error as exc:
        raise error_of(exc) from None
    finally:
        cursor.close()


def error_of(exc: Exception) -> CallError:
    state = str(exc.args[0]) if exc.args else ""
    text = str(exc.args[-1]) if exc.args else str(exc)
    number = re.search(r"\((5140\d)\)", text)
    message = re.sub(r"^\[[^\]]*\]\s*(ERROR:\s*)?", "", text)
    # Microsoft's driver says [Microsoft][ODBC Driver 18 for SQL Server][SQL Server], FreeTDS [FreeTDS][SQL Server].
    message = re.sub(r"(?:\[Microsoft\]\[ODBC Driver \d+ for SQL Server\]|\[FreeTDS\])\[SQL Server\]", "", message)
    message = re.split(r";\nError while executing the query|\s*\(\d+\) \(SQLExecDirectW\)$", message)[0].strip()
    return CallError(number.group(1) if number else state, message)
