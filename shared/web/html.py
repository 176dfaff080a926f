"""HTML helpers of the monitor's pages: escaping, times, the outcome colours."""

from __future__ import annotations

import html
import unicodedata
from datetime import datetime, timezone
from typing import Any

UTC = timezone.utc

# Outcome colours of the timeline bars (fill attributes, not styles: the CSP forbids inline styles).
OUTCOME_COLOURS = {
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "poisoned": "#6a1b9a",
    "running": "#1565c0",
    "queued": "#f9a825",
    "pending": "#f9a825",
    "skipped": "#9e9e9e",
    "cancelled": "#616161",
}


def escape(value: Any) -> str:
    """Every value written into a page goes through here (or through when for times)."""
    return html.escape("" if value is None else str(value), quote=True)


def when(value: Any) -> str:
    if isinstance(value, datetime):
        if value.utcoffset():          # the store gives UTC already; anything else is converted
            value = value.astimezone(UTC)
        return value.isoformat(" ", "seconds")[:19]
    return "-" if value is None else escape(value)


def visible(value: Any) -> str:
    """escape(), and every invisible format character (Unicode category Cf: the bidirectional
    overrides and isolates, zero-width marks) shown as <U+XXXX>: a name that an operator or a
    script chose cannot pass for another ("\u202eexe.lmth" would read "html.exe")."""
    text = "" if value is None else str(value)
    return "".join(f'<span class="control">&lt;U+{ord(c):04X}&gt;</span>' if unicodedata.category(c) == "Cf"
                   else escape(c) for c in text)
