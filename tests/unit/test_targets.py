"""Fleet targets as text (shared/jobs/targets.py): the members a TARGETS value names, and what they
resolve to given the servers' listings. The listings themselves come from real servers in
tests/integration/test_fleet.py; here the rules that turn them into databases, for both server dialects
(SQL Server's case-insensitive names cannot be met on PostgreSQL)."""

from __future__ import annotations

import pytest

from shared.control.connection_strings import with_server
from shared.errors import ConfigError
from shared.jobs.targets import Target, TargetMember, describe_members, needs_listing, parse_targets, resolve, user_databases


@pytest.mark.parametrize("raw, members", [
    ("db:sales", [TargetMember("db", None, "sales")]),
    ("db:tenant_*, -db:tenant_test", [TargetMember("db", None, "tenant_*"),
                                      TargetMember("db", None, "tenant_test", exclude=True)]),
    ("server:myserver.database.windows.net", [TargetMember("server", "myserver.database.windows.net", None)]),
    ("pool:srv.database.windows.net/Pool 1", [TargetMember("pool", "srv.database.windows.net", "Pool 1")]),
    # SQL Server addresses carry a comma: host,port and tcp:host,port stay one member.
    ("db:tcp:sql01,1433/app", [TargetMember("db", "tcp:sql01,1433", "app")]),
    ("server:sql01, 1433", [TargetMember("server", "sql01,1433", None)]),
    ("db:a, server:sql01,1433, -db:sql01,1433/b*, db:c", [
        TargetMember("db", None, "a"), TargetMember("server", "sql01,1433", None),
        TargetMember("db", "sql01,1433", "b*", exclude=True), TargetMember("db", None, "c")]),
    ("DB:x", [TargetMember("db", None, "x")]),
    (" db : x ,\tdb:y\n", [TargetMember("db", None, "x"), TargetMember("db", None, "y")]),
    ("db:127.0.0.1:5432/t_[0-9]", [TargetMember("db", "127.0.0.1:5432", "t_[0-9]")]),
])
def test_members_parse_and_their_normal_text_parses_back_to_them(raw, members):
    parsed = parse_targets("JOB__j__TARGETS", raw)
    assert list(parsed) == members
    assert parse_targets("JOB__j__TARGETS", describe_members(parsed)) == parsed


@pytest.mark.parametrize("raw, expected", [
    ("", "a comma list"),
    (" , ", "a comma list"),
    ("db:a, ,db:b", "empty member"),
    ("db:a,5", "'db:a,5'"),                      # a port after a database name, not a server
    ("db:tenänt", "letters, digits"),
    ("db:a\x00b", "letters, digits"),
    ("db:" + "x" * 129, "letters, digits"),
    ("server:", "server:<server>"),
    ("pool:srv/", "pool name"),
    ("db:srv/", "db:<name>"),
    ("table:x", "has no known kind"),
    (",".join(f"db:t{i}" for i in range(201)), "at most 200 members"),
])
def test_bad_values_are_refused_naming_the_setting_and_what_is_expected(raw, expected):
    with pytest.raises(ConfigError) as caught:
        parse_targets("JOB__j__TARGETS", raw)
    message = str(caught.value)
    assert message.startswith("JOB__j__TARGETS=") and expected in message, message


def test_sql_server_names_compare_without_case_and_system_databases_never_come():
    members = parse_targets("T", "server:other, db:Tenant_*, -db:TENANT_TEST, pool:srv/P1, -db:srv/old_*")
    assert needs_listing(members) == [("server", "other", None), ("server", None, None), ("pool", "srv", "P1")]
    listings = {
        ("server", "other", None): user_databases(["master", "tempdb", "model", "msdb", "crm"], "mssql"),
        ("server", None, None): user_databases(["MASTER", "tenant_a", "TENANT_B", "tenant_test", "other"], "mssql"),
        ("pool", "srv", "P1"): ["old_x", "new_y"],
    }
    assert resolve(members, listings, dialect="mssql") == [
        Target(None, "TENANT_B"), Target(None, "tenant_a"), Target("other", "crm"), Target("srv", "new_y")]


def test_postgresql_names_compare_exactly_and_a_plain_name_is_always_tried():
    members = parse_targets("T", "db:tenant_*, -db:tenant_b, db:missing, db:tenant_a")
    listings = {("server", None, None): ["Tenant_C", "tenant_a", "tenant_b", "template_like"]}
    assert resolve(members, listings, dialect="postgres") == [Target(None, "missing"), Target(None, "tenant_a")]
    # An exclusion names what it matches on its own server only.
    members = parse_targets("T", "db:h:5433/x, db:x, -db:h:5433/x")
    assert resolve(members, {}, dialect="postgres") == [Target(None, "x")]


@pytest.mark.parametrize("dialect, own, spellings", [
    ("postgres", "127.0.0.1:5432", ["db:c", "db:127.0.0.1/c", "db:127.0.0.1:5432/c", "db:127.0.0.1:05432/c",
                                    "db:c*"]),
    ("mssql", "tcp:sql01.example.com,1433", ["db:C", "db:sql01.example.com/c", "db:SQL01.EXAMPLE.COM./c",
                                              "db:tcp:sql01.example.com,1433/c", "db:sql01.example.com,01433/c"]),
])
def test_one_database_is_one_target_however_its_server_is_spelled(dialect, own, spellings):
    """An attack: db:c, db:127.0.0.1/c and db:127.0.0.1:5432/c ran three executions in one database
    (fleet.md: one execution per database; spellings of one address compare equal, the control
    database's own server the same as none written)."""
    members = parse_targets("T", ", ".join(spellings))
    listings = {key: ["c", "d"] for key in needs_listing(members)}
    (target,) = resolve(members, listings, dialect=dialect, own_server=own)
    assert target.database.casefold() == "c"
    # Another server's database of the same name is another target; an exclusion spelled otherwise still excludes.
    assert len(resolve(parse_targets("T", "db:c, db:other/c"), {}, dialect=dialect, own_server=own)) == 2
    excluded = spellings[2].replace("db:", "-db:")
    assert resolve(parse_targets("T", f"db:c, {excluded}"), {}, dialect=dialect, own_server=own) == []


@pytest.mark.parametrize("raw", ["db:127.0.0.1,5432/a", "db:127.0.0.1:0/a", "db:127.0.0.1:99999/a", "server:h:0"])
def test_a_server_the_connection_would_refuse_makes_the_job_invalid_at_sync(raw):
    from shared.jobs.targets import dialect_problem

    problem = dialect_problem(parse_targets("T", raw), "postgres")
    assert problem is not None and "its server must be host or host:port (PostgreSQL)" in problem, problem
    assert dialect_problem(parse_targets("T", "db:127.0.0.1:5432/a, server:h"), "postgres") is None


def test_another_server_keeps_the_driver_and_credentials_and_changes_only_the_address():
    sql = "Driver={ODBC Driver 18 for SQL Server};Server=tcp:a.database.windows.net,1433;Database=ctl;Uid=u;Pwd={p;w};"
    assert with_server(sql, "tcp:b,1433", "mssql") == (
        "Driver={ODBC Driver 18 for SQL Server};Database=ctl;Uid=u;Pwd={p;w};Server=b,1433;")
    pg = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;Database=ctl;"
    assert with_server(pg, "10.0.0.5:5433", "postgres") == (
        "Driver={PostgreSQL Unicode};Uid=root;Database=ctl;Servername=10.0.0.5;Port=5433;")
    assert with_server(pg, "db.internal", "postgres") == (
        "Driver={PostgreSQL Unicode};Uid=root;Database=ctl;Servername=db.internal;Port=5432;")
