"""The operator's console, hardened (issue 32, from the attack): what a client sends cannot put
another address in the audit (F7); a one-time job's moment survives an edit of the monitor's
form unchanged, and a local time that is ambiguous or does not exist is refused in words (F3);
an operator's action whose connection is lost at its COMMIT leaves one honest audit row (F5)."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import (AZURE_HOST, OPERATORS, READERS, audit_rows,  # noqa: F401
                                                    azure, form_fields)


# ------------------------------------------------------------------ F7: X-Forwarded-For

@pytest.mark.parametrize("forwarded, expected", [
    # a client's own header first, the platform's entry appended last: the last one counts
    ("6.6.6.6, 203.0.113.7:51234", "203.0.113.7:51234"),
    ("6.6.6.6,10.1.2.3, 2001:db8::7", "2001:db8::7"),
    ("203.0.113.8", "203.0.113.8"),
    # an entry that is not an address (text forged into the audit) is left out, not recorded
    ("203.0.113.9, admin@evil (trusted)", None),
    ("", None),
])
def test_the_audit_records_the_last_hop_of_x_forwarded_for_not_the_clients_first_entry(
        scenario, azure, forwarded, expected):  # noqa: F811
    operator = azure(OPERATORS, "grace@example.com")
    fields = form_fields(operator.call("GET", "/jobs/nightly_ok").get_body().decode(), "start")
    reader = azure(READERS, f"xff-{len(forwarded)}-{abs(hash(forwarded)) % 10**8}@example.com")
    reader.cookie = operator.cookie
    headers = {"Origin": f"https://{AZURE_HOST}",
               "Content-Type": "application/x-www-form-urlencoded",
               # a forged scheme first, the platform's last: the session stays https (Secure)
               "X-Forwarded-Proto": "http, https"}
    if forwarded:
        headers["X-Forwarded-For"] = forwarded
    response = reader.call("POST", "/actions/start", urlencode(fields).encode(), headers)
    assert response.status_code == 403, response.get_body()
    (row,) = [r for r in audit_rows(scenario, "run-now") if r["principal"] == reader.name]
    assert row["client"] == f"monitor at {AZURE_HOST}" + (f" from {expected}" if expected else "")
    assert "6.6.6.6" not in row["client"] and "evil" not in row["client"]
