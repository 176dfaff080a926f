"""The bytes of a script file as text: the encodings SQL Server scripts arrive in.

SSMS saves scripts as UTF-16 LE with a byte order mark (its default for a long time) or UTF-8
with or without one; other tools write UTF-16 without a mark, and files edited on Windows are
often Windows-1252. The order here: a byte order mark (UTF-32 before UTF-16, whose mark is a
prefix of UTF-32 LE's); else the pattern of NUL bytes that UTF-16/UTF-32 text of mostly ASCII
characters has; else UTF-8; else Windows-1252, with a warning. --encoding names it instead.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from shared.errors import ScriptError

BOMS = (  # longest first: UTF-32 LE's mark starts with UTF-16 LE's
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32 LE (byte order mark)", 4),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32 BE (byte order mark)", 4),
    (codecs.BOM_UTF8, "utf-8", "UTF-8 (byte order mark)", 1),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16 LE (byte order mark)", 2),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16 BE (byte order mark)", 2),
)
SAMPLE = 8192           # bytes looked at for the NUL pattern


@dataclass(frozen=True)
class ScriptText:
    text: str
    encoding: str                 # how it was read, for the report: "UTF-16 LE (no byte order mark)"
    warnings: tuple[str, ...] = ()


def check_encoding(name: str) -> str:
    """The codec --encoding names, or ValueError saying why not (unknown, or not a text encoding
    such as base64)."""
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise ValueError(f"{name!r} is not an encoding Python knows") from None
    if not getattr(info, "_is_text_encoding", True):
        raise ValueError(f"{name!r} is not a text encoding")
    return info.name


def decode_script(raw: bytes, source: str, encoding: str | None = None) -> ScriptText:
    """The text of a script file; ScriptError when its bytes cannot be the encoding found (or
    given), naming the file, the place and what was expected."""
    if encoding is not None:
        codec = check_encoding(encoding)
        try:
            text = raw.decode(codec)
        except UnicodeDecodeError as exc:
            raise ScriptError(f"{source}: not {encoding} at {_where(raw, exc.start)} (byte {raw[exc.start]:#04x}): "
                              "give the encoding the file is in (--encoding)") from None
        return ScriptText(_without_mark(text), encoding)
    for mark, codec, label, unit in BOMS:
        if raw.startswith(mark):
            return ScriptText(_decode_units(raw[len(mark):], codec, label, unit, source, len(mark)), label)
    guessed = _nul_pattern(raw)
    if guessed is not None:
        codec, label, unit = guessed
        return ScriptText(_decode_units(raw, codec, label, unit, source, 0), label)
    try:
        return ScriptText(raw.decode("utf-8"), "UTF-8")
    except UnicodeDecodeError as exc:
        warning = (f"{source}: not UTF-8 (byte {raw[exc.start]:#04x} at {_where(raw, exc.start)}): read as "
                   "Windows-1252; give --encoding if the file is in another encoding")
        return ScriptText(raw.decode("cp1252", errors="windows_1252_unmapped"), "Windows-1252", (warning,))


def _decode_units(raw: bytes, codec: str, label: str, unit: int, source: str, offset: int) -> str:
    if len(raw) % unit:
        raise ScriptError(f"{source}: {label} with an odd number of bytes ({len(raw) + offset}): the file is cut "
                          f"short or not {label.split(' (')[0]}; give --encoding if it is another encoding")
    try:
        return _without_mark(raw.decode(codec))
    except UnicodeDecodeError as exc:
        raise ScriptError(f"{source}: not valid {label} at byte {exc.start + offset} ({exc.reason}): the file is "
                          "damaged or in another encoding (--encoding)") from None


def _nul_pattern(raw: bytes) -> tuple[str, str, int] | None:
    """UTF-16/UTF-32 without a byte order mark, told by where the NUL bytes are: text that is
    mostly ASCII has a NUL in every high byte."""
    sample = raw[:SAMPLE]
    if b"\x00" not in sample or len(sample) < 4:
        return None
    by_position = [0, 0, 0, 0]
    for index, byte in enumerate(sample[: len(sample) // 4 * 4]):
        if byte == 0:
            by_position[index % 4] += 1
    quarter = len(sample) // 4
    mostly, rarely = 0.6 * quarter, 0.05 * quarter + 1
    if by_position[1] >= mostly and by_position[2] >= mostly and by_position[3] >= mostly and by_position[0] < rarely:
        return "utf-32-le", "UTF-32 LE (no byte order mark)", 4
    if by_position[0] >= mostly and by_position[1] >= mostly and by_position[2] >= mostly and by_position[3] < rarely:
        return "utf-32-be", "UTF-32 BE (no byte order mark)", 4
    even, odd = by_position[0] + by_position[2], by_position[1] + by_position[3]
    if odd >= 0.6 * 2 * quarter and even < 2 * rarely:
        return "utf-16-le", "UTF-16 LE (no byte order mark)", 2
    if even >= 0.6 * 2 * quarter and odd < 2 * rarely:
        return "utf-16-be", "UTF-16 BE (no byte order mark)", 2
    return None


def _without_mark(text: str) -> str:
    return text[1:] if text.startswith("\ufeff") else text


def _where(raw: bytes, position: int) -> str:
    line = raw.count(b"\n", 0, position) + 1
    column = position - (raw.rfind(b"\n", 0, position) + 1) + 1
    return f"line {line}, column {column}"


def _unmapped(error: UnicodeDecodeError):
    # The five bytes Windows-1252 leaves undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D): Windows reads
    # them as the C1 control characters of the same number, and so does this.
    return "".join(chr(b) for b in error.object[error.start:error.end]), error.end


codecs.register_error("windows_1252_unmapped", _unmapped)
