"""The values a script computes, as SQL Server computes them: NULL, strings, whole and exact
numbers, floats, binary, uniqueidentifiers, and Unknown (a value only the server knows when the
script runs: a column, GETDATE(), @@SERVERNAME, a cursor's row). Types truncate and convert as
T-SQL's do (nvarchar(10) keeps 10 characters, CAST(x AS nvarchar) keeps 30, a string that is
not a number does not become one), so what the importer computes is what msdb would store.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Union

INT_RANGES = {"tinyint": (0, 255), "smallint": (-2**15, 2**15 - 1), "int": (-2**31, 2**31 - 1),
              "bigint": (-2**63, 2**63 - 1)}
STRING_TYPES = {"char", "varchar", "nchar", "nvarchar", "text", "ntext", "sysname"}
EXACT_TYPES = {"decimal", "numeric", "money", "smallmoney"}
FLOAT_TYPES = {"float", "real"}
BINARY_TYPES = {"binary", "varbinary", "image", "rowversion", "timestamp"}
DATE_TYPES = {"date", "time", "datetime", "datetime2", "smalldatetime", "datetimeoffset"}


@dataclass(frozen=True)
class Unknown:
    """A value the importer cannot know before the script runs; reason says why (for the
    report: "@cmd is a value read from a table (line 12)")."""
    reason: str


class SqlFailure(Exception):
    """A run-time error SQL Server raises here (a conversion that fails, a division by zero):
    number and message as SQL Server's."""

    def __init__(self, number: int, message: str, severity: int = 16) -> None:
        super().__init__(message)
        self.number = number
        self.message = message
        self.severity = severity


Value = Union[None, str, int, Decimal, float, bytes, uuid.UUID, Unknown]


@dataclass(frozen=True)
class SqlType:
    name: str                       # lower case: nvarchar, int, uniqueidentifier, ...
    length: int | None = None       # characters (strings) or bytes (binary); None: max or not applicable

    @property
    def is_string(self) -> bool:
        return self.name in STRING_TYPES

    def __str__(self) -> str:
        if self.name in STRING_TYPES - {"sysname", "text", "ntext"} or self.name in BINARY_TYPES - {"image"}:
            return f"{self.name}({'max' if self.length is None else self.length})"
        return self.name


SYSNAME = SqlType("nvarchar", 128)
NVARCHAR_MAX = SqlType("nvarchar", None)


def sql_type(name: str, arguments: list[str] | None = None, *, in_cast: bool = False) -> SqlType:
    """The type a declaration names (name lower case; arguments as written, 'max' allowed). A
    character type without a length is 1 long in a declaration and 30 long in CAST/CONVERT, as in
    T-SQL."""
    name = name.lower()
    if name == "sysname":
        return SYSNAME
    if name in ("national",):
        name = "nvarchar"
    if name in STRING_TYPES - {"text", "ntext"} or name in BINARY_TYPES - {"image", "rowversion", "timestamp"}:
        if arguments:
            first = arguments[0].lower()
            return SqlType(name, None if first == "max" else int(first))
        return SqlType(name, 30 if in_cast else 1)
    if name in ("text", "ntext", "image", "xml"):
        return SqlType(name, None)
    return SqlType(name)


def first_unknown(*values: Any) -> Unknown | None:
    for value in values:
        if isinstance(value, Unknown):
            return value
    return None


def to_string(value: Value) -> Value:
    """A value as T-SQL turns it into a string (implicitly, or CAST without a length)."""
    if value is None or isinstance(value, (str, Unknown)):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value).upper()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return Unknown(f"the float {value!r} as text (T-SQL's float formatting is not reproduced)")
    return Unknown(f"{value!r} as text")


def to_int(value: Value, type_name: str = "int") -> Value:
    if value is None or isinstance(value, Unknown):
        return value
    if isinstance(value, bool):
        number = int(value)
    elif isinstance(value, int):
        number = value
    elif isinstance(value, (Decimal, float)):
        number = int(value)             # toward zero, as CAST does
    elif isinstance(value, str):
        text = value.strip(" \t\r\n")
        sign = text[:1] if text[:1] in "+-" else ""
        digits = text[len(sign):]
        if not digits.isdigit() or not digits.isascii():
            raise SqlFailure(245, f"Conversion failed when converting the nvarchar value {value!r} to data type "
                                  f"{type_name}.")
        number = int(text)
    elif isinstance(value, uuid.UUID):
        raise SqlFailure(529, f"Explicit conversion from data type uniqueidentifier to {type_name} is not allowed.")
    elif isinstance(value, bytes):
        number = int.from_bytes(value[-8:], "big", signed=False) if value else 0
    else:
        return Unknown(f"{value!r} as a number")
    if type_name == "bit":
        return 0 if number == 0 else 1
    low, high = INT_RANGES.get(type_name, INT_RANGES["bigint"])
    if not low <= number <= high:
        raise SqlFailure(8115, f"Arithmetic overflow error converting expression to data type {type_name} "
                               f"({number}).")
    return number


def to_bit(value: Value) -> Value:
    if isinstance(value, str) and value.strip().upper() in ("TRUE", "FALSE"):
        return 1 if value.strip().upper() == "TRUE" else 0
    return to_int(value, "bit")


def to_decimal(value: Value) -> Value:
    if value is None or isinstance(value, (Unknown, Decimal)):
        return value
    if isinstance(value, (int, float)):
        return Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    if isinstance(value, str):
        try:
            return Decimal(value.strip())
        except InvalidOperation:
            raise SqlFailure(8114, f"Error converting data type nvarchar to numeric ({value!r}).") from None
    return Unknown(f"{value!r} as a number")


def to_float(value: Value) -> Value:
    if value is None or isinstance(value, (Unknown, float)):
        return value
    if isinstance(value, (int, Decimal)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise SqlFailure(8114, f"Error converting data type nvarchar to float ({value!r}).") from None
    return Unknown(f"{value!r} as a float")


def to_guid(value: Value) -> Value:
    if value is None or isinstance(value, (Unknown, uuid.UUID)):
        return value
    if isinstance(value, bytes):
        if len(value) < 16:
            value = value + bytes(16 - len(value))
        return uuid.UUID(bytes_le=value[:16])
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{") and text.endswith("}"):
            text = text[1:-1]
        try:
            if len(text) < 36 or text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
                raise ValueError
            return uuid.UUID(text[:36])
        except ValueError:
            raise SqlFailure(8169, f"Conversion failed when converting from a character string to uniqueidentifier "
                                   f"({value!r}).") from None
    raise SqlFailure(206, f"Operand type clash: {type(value).__name__} is incompatible with uniqueidentifier")


def convert(value: Value, target: SqlType) -> Value:
    """value as a column, variable or parameter of type target holds it (T-SQL's implicit
    conversion on assignment: strings truncated to the length, numbers checked)."""
    if value is None or isinstance(value, Unknown):
        return value
    name = target.name
    if name in STRING_TYPES:
        if isinstance(value, int) and not isinstance(value, bool) and target.length is not None \
                and len(str(value)) > target.length:
            return "*"          # T-SQL: an int too long for a character type becomes '*'
        if isinstance(value, bytes) and name in ("nchar", "nvarchar", "sysname"):
            # Binary to a Unicode type: SQL Server reads the bytes as UTF-16 LE (0x4A00 is N'J');
            # an odd last byte is dropped, as there.
            text: Value = value[:len(value) - len(value) % 2].decode("utf-16-le", errors="replace")
        else:
            text = to_string(value)
        if isinstance(text, str) and target.length is not None:
            text = text[:target.length]
            if name in ("char", "nchar"):
                text = text.ljust(target.length)
        return text
    if name in INT_RANGES:
        return to_int(value, name)
    if name == "bit":
        return to_bit(value)
    if name in EXACT_TYPES:
        return to_decimal(value)
    if name in FLOAT_TYPES:
        return to_float(value)
    if name == "uniqueidentifier":
        return to_guid(value)
    if name in BINARY_TYPES:
        if isinstance(value, uuid.UUID):
            return value            # binary(16) holding a job_id: kept as the GUID it is
        if isinstance(value, bytes):
            return value if target.length is None else value[:target.length]
        if isinstance(value, str):
            data = value.encode("utf-16-le")
            return data if target.length is None else data[:target.length]
        if isinstance(value, int):
            return value.to_bytes(8, "big", signed=True)[-(target.length or 4):]
        return Unknown(f"{value!r} as binary")
    if name in DATE_TYPES:
        return Unknown(f"a {name} value (dates and times are not evaluated)")
    if name == "sql_variant":
        return value
    return Unknown(f"a value of type {name}")


def text_key(value: str) -> str:
    """How a case-insensitive collation compares strings: case folded, trailing spaces ignored
    (msdb's names compare so: 'Backup ' and 'BACKUP' are one job)."""
    return value.rstrip(" ").casefold()
