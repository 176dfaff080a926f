"""The migrations, as procrastinate tests its own: whatever version a control database was left at
by an earlier release, upgrading it gives exactly the schema a fresh `init-db` gives — the same
tables, columns (types, defaults, nullability, order), constraints, indexes, views and routines —
per dialect, on the real engines (SQLite, PostgreSQL; the T-SQL server when AGENT_TEST_MSSQL is
set). A migration that only works when applied together with the one before it (a column used
before the transaction that added it committed, a view over a table an older release lacks, a
default that differs between the CREATE and the ALTER path) fails here."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from shared.control.queries import load_migrations
from tests.support.harness import DIALECT_PARAMS, fresh_database, make_agent, mssql_server_is_babelfish

UTC = timezone.utc

SQLITE_SCHEMA = """
SELECT type, name, tbl_name, sql FROM sqlite_master
WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name
"""

POSTGRES_SCHEMA = [
    # Columns in their order: an ALTER TABLE ADD appends, so an upgrade may order them differently
    # from a fresh CREATE only if a migration recreated a table; either way it must match.
    """SELECT c.table_name, c.ordinal_position, c.column_name, c.data_type, c.character_maximum_length,
              c.numeric_precision, c.datetime_precision, c.column_default, c.is_nullable
       FROM information_schema.columns c WHERE c.table_schema = 'agent'
       ORDER BY c.table_name, c.ordinal_position""",
    """SELECT t.relname, con.conname, pg_get_constraintdef(con.oid)
       FROM pg_constraint con JOIN pg_class t ON t.oid = con.conrelid
       JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = 'agent'
       ORDER BY t.relname, con.conname""",
    """SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'agent'
       ORDER BY tablename, indexname""",
    """SELECT viewname, definition FROM pg_views WHERE schemaname = 'agent' ORDER BY viewname""",
    """SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'agent'
       ORDER BY p.proname, 2""",
    """SELECT r.rolname FROM pg_roles r WHERE r.rolname LIKE 'agent\\_%' ORDER BY r.rolname""",
    """SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = 'agent' AND NOT t.tgisinternal ORDER BY c.relname, t.tgname""",
]

MSSQL_SCHEMA = [
    """SELECT t.name, c.column_id, c.name, ty.name, c.max_length, c.precision, c.scale, c.is_nullable,
              OBJECT_DEFINITION(c.default_object_id)
       FROM sys.columns c JOIN sys.tables t ON t.object_id = c.object_id
       JOIN sys.types ty ON ty.user_type_id = c.user_type_id
       WHERE SCHEMA_NAME(t.schema_id) = N'agent' ORDER BY t.name, c.column_id""",
    """SELECT t.name, i.name, i.is_unique, i.is_primary_key, i.filter_definition,
              (SELECT STRING_AGG(COL_NAME(ic.object_id, ic.column_id), N',')
               FROM sys.index_columns ic WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id)
       FROM sys.indexes i JOIN sys.tables t ON t.object_id = i.object_id
       WHERE SCHEMA_NAME(t.schema_id) = N'agent' AND i.name IS NOT NULL ORDER BY t.name, i.name""",
    # Modules from sys.sql_modules (NVARCHAR(MAX); Babelfish's OBJECT_DEFINITION stops at 4000
    # characters), check constraints apart: Babelfish cannot print their definitions.
    """SELECT o.name, o.type, m.definition FROM sys.objects o JOIN sys.sql_modules m ON m.object_id = o.object_id
       WHERE SCHEMA_NAME(o.schema_id) = N'agent' AND o.type IN ('V', 'P', 'FN', 'IF', 'TF', 'TR')
       ORDER BY o.name""",
]
MSSQL_CHECKS = """SELECT o.name, OBJECT_DEFINITION(o.object_id) FROM sys.objects o
       WHERE SCHEMA_NAME(o.schema_id) = N'agent' AND o.type = 'C' ORDER BY o.name"""
BABELFISH_CHECKS = """SELECT o.name FROM sys.objects o
       WHERE SCHEMA_NAME(o.schema_id) = N'agent' AND o.type = 'C' ORDER BY o.name"""


def schema_of(agent) -> list[list[tuple]]:
    """The control schema as the engine's own catalog describes it (the recorded migration rows
    left out: when each was applied differs by design)."""
    store = agent.store()
    connection = store.connection
    queries = {"sqlite": [SQLITE_SCHEMA], "postgres": POSTGRES_SCHEMA,
               "mssql": MSSQL_SCHEMA + [BABELFISH_CHECKS if mssql_server_is_babelfish() else MSSQL_CHECKS]
               }[agent.target.dialect]
    described = []
    for sql in queries:
        cursor = connection.cursor()
        try:
            cursor.execute(sql)
            described.append([tuple(row) for row in cursor.fetchall()])
        finally:
            cursor.close()
    if agent.target.dialect == "postgres":
        connection.rollback()
    return described


def _versions() -> list[int]:
    return [m.version for m in load_migrations("sqlite")]


def test_every_dialect_has_the_same_migration_numbers():
    assert _versions() == [m.version for m in load_migrations("postgres")] == [
        m.version for m in load_migrations("mssql")]
    assert _versions() == list(range(1, len(_versions()) + 1))


@pytest.mark.parametrize("dialect", DIALECT_PARAMS)
def test_upgrading_from_every_earlier_version_gives_the_fresh_schema(dialect, tmp_path):
    """For each version k a release may have left: migrate to k, then (another process, as an
    upgrade does) to the latest; the schema equals the one `init-db` gives a fresh database."""
    now = datetime.now(UTC)
    (tmp_path / "fresh").mkdir()
    with fresh_database(dialect, tmp_path / "fresh") as url:
        agent = make_agent(url)
        try:
            expected = schema_of(agent)
        finally:
            agent.close()
    assert any(expected), "the fresh schema is empty: the catalog queries describe nothing"
    for version in _versions()[:-1]:
        folder = tmp_path / f"from_{version}"
        folder.mkdir()
        with fresh_database(dialect, folder) as url:
            from shared.engine.agent import Agent
            from shared.settings import load_settings

            old = Agent(load_settings({"AGENT_DB": url}))
            try:
                before, _ = old.store().migrate(now, up_to=version)
                assert before == 0 and old.store().schema_version() == version
            finally:
                old.close()
            upgraded = make_agent(url)      # init-db again, by the newer release
            try:
                assert upgraded.store().schema_version() == _versions()[-1]
                got = schema_of(upgraded)
            finally:
                upgraded.close()
        for part, (want, have) in enumerate(zip(expected, got)):
            assert have == want, (f"{dialect}: upgrading from version {version} gives another schema "
                                  f"(catalog query {part}): only in the upgrade {sorted(set(have) - set(want))[:5]}, "
                                  f"only in a fresh init-db {sorted(set(want) - set(have))[:5]}")
