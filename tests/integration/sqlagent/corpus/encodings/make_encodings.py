"""Writes the encoded copies of source.sql (run it from this directory after changing it)."""

import codecs
from pathlib import Path

HERE = Path(__file__).parent
text = (HERE / "source.sql").read_text(encoding="utf-8")
crlf = text.replace("\n", "\r\n")
copies = {
    "utf8.sql": text.encode("utf-8"),
    "utf8_bom_crlf.sql": codecs.BOM_UTF8 + crlf.encode("utf-8"),
    "utf16le_bom_crlf.sql": codecs.BOM_UTF16_LE + crlf.encode("utf-16-le"),      # what SSMS saves
    "utf16be_bom.sql": codecs.BOM_UTF16_BE + text.encode("utf-16-be"),
    "utf16le_no_bom.sql": text.encode("utf-16-le"),
    "utf16be_no_bom.sql": text.encode("utf-16-be"),
    "utf32le_bom.sql": codecs.BOM_UTF32_LE + text.encode("utf-32-le"),
    "utf32be_no_bom.sql": text.encode("utf-32-be"),
    "windows1252_crlf.sql": crlf.encode("cp1252"),
}
for name, data in copies.items():
    (HERE / name).write_bytes(data)
# Broken ones.
(HERE / "broken_odd_utf16.sql").write_bytes(copies["utf16le_bom_crlf.sql"][:-1])
(HERE / "broken_truncated.sql").write_bytes(text[:text.index("déjà") + 2].encode("utf-8"))
(HERE / "empty.sql").write_bytes(b"")
(HERE / "only_comments_and_go.sql").write_bytes(b"\xef\xbb\xbf/* nothing */\r\n-- here\r\nGO\r\n\r\n")
