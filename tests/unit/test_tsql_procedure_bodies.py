"""The T-SQL procedures as the migrations leave them: no UPDATE ... OUTPUT in any body.

Babelfish 4.2 re-analyses a procedure's cached statement after an invalidation (an ANALYZE of a
table it reads, autovacuum's included) and then resolves an UPDATE's OUTPUT inserted.* through
the alias of the statement the session parsed last: the statement fails ("missing FROM-clause
entry for table ...") until the session ends. Migration 0025 rewrote every such UPDATE (pick the
rows, update them, read them back); this keeps a new one from coming back. CI has no Babelfish,
so the rule is checked on the text. INSERT ... OUTPUT is not affected and stays allowed."""
from __future__ import annotations

import re
from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parents[2] / "shared" / "control" / "sql" / "migrations" / "mssql"
RENAMES = re.compile(r"EXEC sp_rename N'agent\.(\w+)', N'(\w+)'")


def latest_procedure_bodies() -> dict[str, str]:
    """Each procedure's body as the last migration that created, altered or renamed it left it."""
    bodies: dict[str, str] = {}
    for path in sorted(MIGRATIONS.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        for chunk in re.split(r"^GO\s*$", text, flags=re.M):
            for old, new in RENAMES.findall(chunk):
                if f"agent.{old}" in bodies:
                    bodies[f"agent.{new}"] = bodies.pop(f"agent.{old}")
            found = re.search(r"^(?:CREATE|ALTER) PROCEDURE (agent\.\w+)", chunk, re.M)
            if found:
                bodies[found.group(1)] = chunk[found.start():]
    return bodies


def without_comments(sql: str) -> str:
    """The SQL without its comments and with every string literal emptied (a note's text may hold
    a ';' or the word OUTPUT)."""
    return re.sub(r"N?'(?:[^']|'')*'", "''", re.sub(r"--[^\n]*", "", sql))


def test_the_rule_reads_every_procedure_the_agent_calls():
    bodies = latest_procedure_bodies()
    for name in ("agent.claim_runs", "agent.start_run", "agent.dispatch_runs", "agent.finish_run",
                 "agent.stop_job_unaudited", "agent.cancel_run_unaudited", "agent.requeue_poison_unaudited",
                 "agent.exec_async_unaudited", "agent.start_job_unaudited"):
        assert name in bodies, name


def test_no_procedure_body_has_an_update_with_output():
    offenders = {}
    for name, body in latest_procedure_bodies().items():
        for statement in without_comments(body).split(";"):
            if re.search(r"^\s*UPDATE\b", statement, re.M | re.I) and re.search(r"\bOUTPUT\s+(inserted|deleted|N?'|@)",
                                                                                   statement, re.I):
                offenders[name] = statement.strip()[:120]
    assert not offenders, offenders


def test_the_rule_finds_an_update_with_output():
    body = "ALTER PROCEDURE agent.x AS BEGIN UPDATE agent.runs SET note = N'' OUTPUT inserted.run_id INTO @t WHERE 1 = 0; END"
    statements = [s for s in without_comments(body).split(";")
                  if re.search(r"^\s*UPDATE\b", s, re.M | re.I) or "UPDATE agent.runs" in s]
    assert any(re.search(r"\bOUTPUT\s+(inserted|deleted|N?'|@)", s, re.I) for s in statements)
