"""grant-sql: least-privilege T-SQL for the function app's managed identity, names quoted safely.

sqlglot (30.30) parses GRANT on an object but not the two statements this script is made of
(``CREATE USER [x] FROM EXTERNAL PROVIDER`` and ``GRANT ... ON SCHEMA::[s] TO [x]``): it falls
back to an opaque Command. The narrowest honest check: parse with sqlglot what it understands
(the IF around CREATE USER), and match every statement token by token, with sqlglot's own T-SQL
tokenizer, against the exact statement shapes the module may produce. A name that escaped its
brackets would show up as extra tokens; a correctly quoted one is a single identifier token
whose value is the name itself.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.dialects.tsql import TSQL

from shared.cli.commands import main as cli
from shared.control.queries import split_statements
from shared.errors import UsageError
from shared.ops.grants import grant_scripts, grant_sql, quote_name, quote_string, render

TRICKY_NAMES = [
    "func-agent-prod",
    "app]; DROP TABLE agent.runs; --",
    "it's [quoted]] already",
    "Ünïcode app 名前",
    "a" * 128,
]


def _tokens(statement: str) -> list[tuple[str, str]]:
    return [(token.token_type.name, token.text) for token in TSQL().tokenize(statement)]


def _ident(tokens, index) -> tuple[str, int]:
    kind, text = tokens[index]
    assert kind == "IDENTIFIER", f"expected a [quoted] name at token {index}, got {tokens[index]}"
    return text, index + 1


def _words(tokens, index, *words) -> int:
    for word in words:
        assert tokens[index][1].upper() == word, f"expected {word} at token {index}, got {tokens[index]}"
        index += 1
    return index


def parse_grant_statement(statement: str) -> tuple:
    """The statement's shape and names, or AssertionError when it is not one the module may emit."""
    tokens = _tokens(statement)
    assert tokens[-1] == ("SEMICOLON", ";"), statement
    tokens = tokens[:-1]
    if tokens[0][1].upper() == "IF" and tokens[1][1].upper() == "DATABASE_PRINCIPAL_ID":
        # IF DATABASE_PRINCIPAL_ID(N'<name>') IS NULL CREATE USER [<name>] FROM EXTERNAL PROVIDER
        (tree,) = sqlglot.parse(statement, read="tsql")
        assert isinstance(tree, exp.IfBlock)
        condition = tree.this
        assert isinstance(condition, exp.Is) and isinstance(condition.expression, exp.Null)
        function = condition.this
        assert function.name.upper() == "DATABASE_PRINCIPAL_ID" and len(function.expressions) == 1
        literal = function.expressions[0]
        assert isinstance(literal, exp.National)
        index = _words(tokens, 0, "IF", "DATABASE_PRINCIPAL_ID", "(")
        assert tokens[index][0] == "NATIONAL_STRING" and tokens[index][1] == literal.name
        index = _words(tokens, index + 1, ")", "IS", "NULL", "CREATE", "USER")
        user, index = _ident(tokens, index)
        index = _words(tokens, index, "FROM", "EXTERNAL", "PROVIDER")
        assert index == len(tokens), statement
        assert literal.name == user, "the existence check and CREATE USER name different principals"
        return ("create_user", user)
    if tokens[0][1].upper() == "IF" and tokens[1][1].upper() == "IS_ROLEMEMBER":
        # IF IS_ROLEMEMBER(N'<role>', N'<name>') = 1 ALTER ROLE [<role>] DROP MEMBER [<name>]
        index = _words(tokens, 0, "IF", "IS_ROLEMEMBER", "(")
        assert tokens[index][0] == "NATIONAL_STRING" and tokens[index + 2][0] == "NATIONAL_STRING", statement
        role_literal, name_literal = tokens[index][1], tokens[index + 2][1]
        index = _words(tokens, index + 1, ",")
        index = _words(tokens, index + 1, ")", "=", "1", "ALTER", "ROLE")
        role, index = _ident(tokens, index)
        index = _words(tokens, index, "DROP", "MEMBER")
        user, index = _ident(tokens, index)
        assert index == len(tokens), statement
        assert (role_literal, name_literal) == (role, user), "the check and the ALTER ROLE name different principals"
        return ("drop_member", role, user)
    if tokens[0][1].upper() == "IF":
        raise AssertionError(f"not a statement the module may emit: {statement}")
    # GRANT <permission>[, <permission>]* ON SCHEMA::[<schema>] TO [<name>]
    index = _words(tokens, 0, "GRANT")
    permissions = []
    while True:
        permissions.append(tokens[index][1].upper())
        index += 1
        if tokens[index][1] != ",":
            break
        index += 1
    index = _words(tokens, index, "ON", "SCHEMA", "::")
    schema, index = _ident(tokens, index)
    index = _words(tokens, index, "TO")
    user, index = _ident(tokens, index)
    assert index == len(tokens), statement
    return ("grant", tuple(permissions), schema, user)


def statements_of(sql: str) -> list[str]:
    """Executable statements (comments dropped), as --apply would send them."""
    out = []
    for chunk in split_statements(sql):
        code = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("--")).strip()
        if code:
            out.append(code if code.endswith(";") else code + ";")
    return out


def agent_user_shapes(app: str) -> list[tuple]:
    """The agent's user in the control database: created, the rows and routines of schema agent,
    out of the fixed roles that are more (docs/deploying.md, "What the agent's identity can do")."""
    return [("create_user", app), ("grant", ("SELECT", "INSERT", "UPDATE", "DELETE", "EXECUTE"), "agent", app),
            ("drop_member", "db_owner", app), ("drop_member", "db_securityadmin", app),
            ("drop_member", "db_accessadmin", app)]


@pytest.mark.parametrize("app", TRICKY_NAMES)
def test_control_database_script_is_least_privilege_and_quotes_the_name(app):
    (control,) = grant_scripts(app)
    assert control.database is None
    shapes = [parse_grant_statement(s) for s in control.statements]
    assert shapes == agent_user_shapes(app)
    # The printed script is made of exactly these statements.
    assert [parse_grant_statement(s) for s in statements_of(grant_sql(app))] == shapes


def test_job_databases_get_a_user_of_their_own_and_execute_grants_go_everywhere():
    scripts = grant_scripts("func-agent", job_databases=["reporting", "archive", "reporting"],
                            execute_schemas=["dbo", "maint]x"])
    assert [s.database for s in scripts] == [None, "archive", "reporting"]
    control, *targets = scripts
    assert [parse_grant_statement(s) for s in control.statements] == [
        *agent_user_shapes("func-agent"),
        ("grant", ("EXECUTE",), "dbo", "func-agent"),
        ("grant", ("EXECUTE",), "maint]x", "func-agent"),
    ]
    for script in targets:
        shapes = [parse_grant_statement(s) for s in script.statements]
        # No DML on the agent schema outside the control database: it is not there.
        assert shapes == [("create_user", "func-agent"), ("grant", ("EXECUTE",), "dbo", "func-agent"),
                          ("grant", ("EXECUTE",), "maint]x", "func-agent")]
        assert "[" + script.database + "]" in script.comment and "connect to it" in script.comment
    text = render(scripts)
    assert text.count("\nGO\n") == 2
    assert "at-least-once" in text and "Job commands run as this user" in text


@pytest.mark.parametrize("bad,setting", [
    ("", "--app-name"), ("  app", "--app-name"), ("app\n; DROP", "--app-name"), ("a\x00b", "--app-name"),
    ("a" * 129, "--app-name"), (None, "--app-name"),
])
def test_bad_app_names_are_refused_naming_the_setting(bad, setting):
    with pytest.raises(UsageError) as caught:        # an argument: exit 2, kind usage
        grant_sql(bad)
    assert caught.value.setting == setting and "128 characters" in str(caught.value)


def test_bad_job_database_and_schema_names_are_refused():
    with pytest.raises(UsageError, match="--job-database"):
        grant_sql("app", job_databases=["bad\tname"])
    with pytest.raises(UsageError, match="--execute-schema"):
        grant_sql("app", execute_schemas=[""])


def test_quoting_follows_quotename_rules():
    assert quote_name("a]b") == "[a]]b]"
    assert quote_name("[x]") == "[[x]]]"
    assert quote_string("it's") == "N'it''s'"
    for name in TRICKY_NAMES:
        assert _tokens(quote_name(name)) == [("IDENTIFIER", name)]
        assert _tokens(quote_string(name)) == [("NATIONAL_STRING", name)]


def test_cli_prints_the_script_for_the_configured_job_databases(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JOB__nightly__SCHEDULE", "0 0 2 * * *")
    monkeypatch.setenv("JOB__nightly__COMMAND", "EXEC dbo.purge")
    monkeypatch.setenv("JOB__nightly__DATABASE", "reporting")
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    assert cli(["--db", db, "grant-sql", "--app-name", "func-agent-prod"]) == 0
    out = capsys.readouterr().out
    assert out == grant_sql("func-agent-prod", job_databases=["reporting"])
    assert not (tmp_path / "agent.db").exists()      # printing touches no database
    assert cli(["--db", db, "grant-sql", "--app-name", "func-agent-prod", "--job-database", "other"]) == 0
    assert "[other]" in capsys.readouterr().out


def test_cli_apply_needs_a_sql_server_control_database(capsys, tmp_path):
    assert cli(["--db", f"sqlite:///{tmp_path / 'agent.db'}", "grant-sql", "--app-name", "app", "--apply"]) == 2
    err = capsys.readouterr().err
    assert "--apply needs an Azure SQL / SQL Server control database" in err and "SQLite" in err


def test_cli_refuses_a_bad_app_name(capsys, tmp_path):
    assert cli(["--db", f"sqlite:///{tmp_path / 'agent.db'}", "grant-sql", "--app-name", "x\ny"]) == 2
    assert "--app-name" in capsys.readouterr().err


# ---------------------------------------------------------------- grant-sql --agent-login

@pytest.mark.parametrize("app", TRICKY_NAMES)
def test_the_agents_tsql_user_gets_the_rows_and_routines_of_schema_agent_and_no_fixed_role(app):
    from shared.ops.grants import agent_login_tsql

    script = agent_login_tsql(app)
    assert script.database is None
    assert [parse_grant_statement(s) for s in script.statements] == agent_user_shapes(app)
    assert [parse_grant_statement(s) for s in statements_of(render([script]))] == agent_user_shapes(app)
    # Those statements and no other: nothing server-level, nothing in master, no role added.


def test_the_agents_tsql_script_parses_as_tsql():
    """sqlfluff's T-SQL grammar over the whole script, names that need no ]] (its lexer does not
    take ]] inside brackets; the token test above covers those)."""
    from sqlfluff.core import FluffConfig, Linter

    from shared.ops.grants import agent_login_tsql

    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))
    for script in (agent_login_tsql("func-agent prod"), agent_login_tsql("func-agent", job_principal="job runner")):
        parsed = linter.parse_string(render([script]))
        assert not parsed.violations and "unparsable" not in parsed.tree.stringify(), parsed.tree.stringify()
    assert "GRANT IMPERSONATE ON USER::[job runner] TO [func-agent];" in agent_login_tsql(
        "func-agent", job_principal="job runner").statements


@pytest.mark.parametrize("login", ['sql_agent', 'a"b; DROP ROLE root; --', "it's \\ $agent_grant$", "Ünïcode 名前"])
def test_the_postgres_script_quotes_the_login_wherever_it_appears(login):
    """The name appears as a quoted identifier (ALTER ROLE, CREATE SCHEMA ... AUTHORIZATION) and as
    one E'' literal (set_config), never inside a DO body (those read current_setting)."""
    from sqlglot.dialects.postgres import Postgres

    from shared.ops.grants import agent_login_postgres, quote_pg_literal, quote_pg_name

    def code_of(name: str) -> list[str]:
        return [line for line in agent_login_postgres(name).splitlines() if not line.startswith("--")]

    code = code_of(login)
    named = [line for line in code if quote_pg_name(login) in line or quote_pg_literal(login) in line]
    assert len(named) == 3, named
    # Every other line is the same for any name: the DO bodies hold none.
    assert [line for line in code if line not in named] == [
        line for line in code_of("placeholder") if '"placeholder"' not in line and "'placeholder'" not in line]
    tokens = [[(t.token_type.name, t.text) for t in Postgres().tokenize(line)] for line in named]
    assert [t for t in tokens[0] if t[0] in ("STRING", "BYTE_STRING")] == [("STRING", "agent.grant_login"),
                                                                           ("BYTE_STRING", login)]
    assert [t[1].upper() for t in tokens[1][:2]] == ["ALTER", "ROLE"] and tokens[1][2] == ("IDENTIFIER", login)
    assert [t[1].upper() for t in tokens[1][3:]] == ["NOCREATEDB", "NOCREATEROLE", "INHERIT", ";"]
    assert tokens[2][-3:] == [("VAR", "AUTHORIZATION"), ("IDENTIFIER", login), ("SEMICOLON", ";")] or \
        [t[1].upper() for t in tokens[2][-3:-1]] == ["AUTHORIZATION", login.upper()]
    assert code[0] == "BEGIN;" and code[-1] == "COMMIT;"


@pytest.mark.parametrize("bad", ["", " agent", "agent\n; DROP ROLE root", "a\x00b", "a" * 64, "é" * 32, None])
def test_a_bad_postgres_login_name_is_refused_naming_the_option(bad):
    from shared.ops.grants import agent_login_postgres

    with pytest.raises(UsageError) as caught:
        agent_login_postgres(bad)
    assert caught.value.setting == "--agent-login" and "63 bytes" in str(caught.value)
    agent_login_postgres("é" * 31)          # 62 bytes: PostgreSQL keeps it whole


def test_cli_agent_login_prints_tsql_for_sqlite_and_refuses_to_apply_there(capsys, tmp_path):
    import json

    from shared.ops.grants import agent_login_tsql

    db = f"sqlite:///{tmp_path / 'agent.db'}"
    assert cli(["--db", db, "grant-sql", "--agent-login", "func-agent"]) == 0
    assert capsys.readouterr().out == render([agent_login_tsql("func-agent")])
    assert cli(["--db", db, "grant-sql", "--agent-login", "func-agent", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["dialect"] == "mssql" and document["applied"] is False and "EXECUTE ON SCHEMA" in document["sql"]
    assert cli(["--db", db, "grant-sql", "--agent-login", "func-agent", "--apply"]) == 2
    assert "SQLite has no logins" in capsys.readouterr().err
    assert cli(["--db", db, "grant-sql", "--agent-login", "x", "--targets", "nightly"]) == 2
    assert "takes no --targets" in capsys.readouterr().err
    assert cli(["--db", db, "grant-sql", "--agent-login", "x\ny"]) == 2
    assert "--agent-login" in capsys.readouterr().err
    assert not (tmp_path / "agent.db").exists()      # printing touches no database
