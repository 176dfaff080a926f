"""grant-sql: the scripts that give the app's identity (and operators) their rights, printed or
applied, on the control database and on fleet targets."""

from __future__ import annotations

from typing import Sequence

from shared.cli.output import EXIT_OK, print_json, warn
from shared.engine.audit import AuditAction, command_line_actor, record_refusal
from shared.engine.fleet import resolve_fleet
from shared.engine.operations import (
    apply_grant_scripts,
    apply_operator_grant,
    apply_postgres_script,
)
from shared.errors import AgentError, UsageError
from shared.ops.fleet import job_fleet
from shared.ops.grants import (
    OPERATOR_WARNING,
    agent_login_postgres,
    agent_login_tsql,
    fleet_grant_scripts,
    fleet_postgres_scripts,
    grant_scripts,
    name_problem,
    operator_sql,
    render,
    render_fleet,
)


def cmd_grant_sql(agent, args) -> int:
    """grant-sql; with --apply an audited action: refused before it ran (a bad combination of
    options, a control database that cannot take it) is recorded refused too."""
    try:
        return _grant_sql(agent, args)
    except (AgentError, OSError) as exc:
        if args.apply:
            record_refusal(agent.store(), command_line_actor(), AuditAction.GRANT, clock=agent.clock, error=exc,
                           arguments={"app_name": args.app_name, "operator": args.operator, "targets": args.targets,
                                      "agent_login": args.agent_login,
                                      "job_database": args.job_database, "execute_schema": args.execute_schema,
                                      "job_principal": args.job_principal})
        raise


def _grant_sql(agent, args) -> int:

    if args.agent_login is not None:
        others = [flag for flag, given in (("--operator", args.operator is not None), ("--targets", args.targets),
                                           ("--job-database", args.job_database), ("--execute-schema",
                                                                                   args.execute_schema),
                                           ("--app-name", args.app_name)) if given]
        if others:
            raise UsageError(f"grant-sql --agent-login NAME takes no {', '.join(others)}: it grants the agent's own "
                             "identity its rights on the control database; run the others as commands of their own")
        return _grant_agent_login(agent, args)
    if args.operator is not None:
        if args.job_database or args.execute_schema or args.job_principal or args.targets:
            raise UsageError("grant-sql --operator PRINCIPAL takes no --job-database, --execute-schema, "
                             "--job-principal or --targets: run the app's grants and the operator's membership as "
                             "two commands")
        return _grant_operator(agent, args)
    if not args.app_name:
        raise UsageError("grant-sql: --app-name NAME is required (or --operator PRINCIPAL for the T-SQL interface's role)")
    if args.targets is not None:
        if args.job_database is not None:
            raise UsageError(f"grant-sql --targets {args.targets} takes no --job-database (the job's targets are "
                             "the databases): run the JOB__<name>__DATABASE grants as a command of their own")
        return _grant_targets(agent, args)

    databases = args.job_database
    if databases is None:
        databases = sorted({job.database for job in agent.settings.jobs if job.database})
    principal = args.job_principal or agent.settings.agent.job_principal
    scripts = grant_scripts(args.app_name, job_databases=databases, execute_schemas=args.execute_schema,
                            job_principal=principal)
    if not args.apply:
        if args.json:
            print_json(_scripts_document(scripts, render(scripts), applied_to=None))
        else:
            print(render(scripts), end="")
        return EXIT_OK
    target = agent.target
    if target.dialect != "mssql":
        raise UsageError(f"grant-sql --apply needs an Azure SQL / SQL Server control database "
                         f"(AGENT_SQL_SERVER and AGENT_SQL_DATABASE, or --db with a SQL Server ODBC driver); "
                         f"the control database is {target.display}", setting="--db", value=target.display,
                         expected="an Azure SQL / SQL Server control database")
    applied = _apply_scripts(agent, target, scripts, args)
    if args.json:
        print_json(_scripts_document(scripts, render(scripts), applied_to=applied))
    return EXIT_OK


def _scripts_document(scripts, sql: str, *, applied_to: list[str] | None, warnings: Sequence[str] = ()) -> dict:
    """grant-sql --json: the scripts (each database's statements), the whole text as printed
    without --json, where they were applied (null: printed only) and the warnings."""
    return {"scripts": [{"database": script.database, "server": getattr(script, "server", None),
                         "comment": script.comment, "statements": list(script.statements)} for script in scripts],
            "sql": sql, "applied": applied_to is not None, "applied_to": applied_to or [],
            "warnings": list(warnings)}


def _apply_scripts(agent, target, scripts, args) -> list[str]:
    """grant-sql --apply: each script in its own transaction, in its database (on its server);
    without --json, each one as it is applied."""
    def show(where: str, script) -> None:
        print(f"applied to {where}: " + " ".join(script.statements))

    return apply_grant_scripts(target, scripts, on_applied=None if args.json else show, store=agent.store(),
                               now=agent.clock(), actor=command_line_actor())


def _grant_targets(agent, args) -> int:
    """grant-sql --targets JOB: the job's fleet targets resolved now (one listing per server or
    pool), then per server the script for its master (when its databases are listed) and one
    per target database; printed, or with --apply run on each. PostgreSQL: CONNECT on each
    target database, one script per server."""

    target = agent.target
    steps = job_fleet(agent, args.targets)         # UsageError: unknown job, no fleet step, SQLite, pool: on PG
    if target.dialect == "postgres" and args.execute_schema:
        raise UsageError(f"grant-sql --targets {args.targets} --execute-schema: on PostgreSQL the command grants "
                         "CONNECT on each target database only; grant what the jobs use inside each database "
                         "yourself (GRANT USAGE ON SCHEMA ..., GRANT EXECUTE ON ALL ROUTINES IN SCHEMA ...)")
    resolution = resolve_fleet(steps, dialect=target.dialect, control_store=agent.store,
                               target_store=agent.target_store)
    pairs, warnings = [], []
    for server, database in [(t.server, t.database) for t in resolution.targets()]:
        problem = name_problem(database)
        if problem:     # a listed name no script can hold: named and left out, the others go on
            where = f"server {server}" if server else "the agent's server"
            warn(args, warnings, f"job {args.targets!r}: database {database!r} on {where} is left out: expected "
                                  f"{problem}")
        else:
            pairs.append((server, database))
    if target.dialect == "postgres":
        scripts = fleet_postgres_scripts(args.app_name, pairs, job_name=args.targets)
    else:
        principal = args.job_principal or agent.settings.agent.job_principal
        scripts = fleet_grant_scripts(args.app_name, pairs, resolution.listed, execute_schemas=args.execute_schema,
                                      job_principal=principal, job_name=args.targets)
    if not pairs:
        warn(args, warnings, f"job {args.targets!r}: its targets resolve to no database now")
    text = render_fleet(scripts, separator="GO\n" if target.dialect == "mssql" else "\n")
    if not args.apply:
        if args.json:
            print_json(_scripts_document(scripts, text, applied_to=None, warnings=warnings))
        else:
            print(text, end="")
        return EXIT_OK
    applied = _apply_scripts(agent, target, scripts, args)
    if args.json:
        print_json(_scripts_document(scripts, text, applied_to=applied, warnings=warnings))
    return EXIT_OK


def _grant_operator(agent, args) -> int:
    """grant-sql --operator: the membership in agent_operator, printed (T-SQL, or PostgreSQL's GRANT
    when the control database is PostgreSQL) or, with --apply, run on the control database."""

    target = agent.target
    if target.dialect == "sqlite" and args.apply:
        raise UsageError(f"grant-sql --operator --apply: the control database is {target.display}; SQLite has no "
                         "roles or procedures (the command line is its way in). Apply it to an Azure SQL / SQL Server "
                         "or PostgreSQL control database (AGENT_SQL_SERVER, or --db with an ODBC connection string)",
                         setting="--db", value=target.display,
                         expected="an Azure SQL / SQL Server or PostgreSQL control database")
    # Printed for SQLite too: the T-SQL to run once the control database is Azure SQL.
    script = operator_sql(args.operator, dialect=target.dialect, app=args.app_name)
    warnings: list[str] = []
    warn(args, warnings, OPERATOR_WARNING)

    def document(applied: bool) -> dict:
        return {"operator": args.operator, "app_name": args.app_name, "dialect": target.dialect, "sql": script,
                "applied": applied, "applied_to": ["the control database"] if applied else [], "warnings": warnings}

    if not args.apply:
        if args.json:
            print_json(document(False))
        else:
            print(script, end="")
        return EXIT_OK
    apply_operator_grant(target, script, operator=args.operator, store=agent.store(), now=agent.clock(),
                         actor=command_line_actor())
    if args.json:
        print_json(document(True))
    else:
        print(f"applied to the control database: {args.operator} is a member of agent_operator")
    return EXIT_OK


def _grant_agent_login(agent, args) -> int:
    """grant-sql --agent-login NAME: the agent's own identity with the rights it needs on the
    control database and no more (docs/deploying.md, "What the agent's identity can do"):
    PostgreSQL's script when the control database is PostgreSQL, T-SQL otherwise (printed for
    SQLite: the T-SQL to run once the control database is Azure SQL). --apply runs it on the
    control database as the --db login, which must be an admin."""
    target = agent.target
    principal = args.job_principal or agent.settings.agent.job_principal
    source = "--job-principal" if args.job_principal else "AGENT_JOB_PRINCIPAL"
    if target.dialect == "postgres":
        dialect, sql = "postgres", agent_login_postgres(args.agent_login, job_principal=principal,
                                                        principal_setting=source)
        script = None
    else:
        script = agent_login_tsql(args.agent_login, job_principal=principal, principal_setting=source)
        dialect, sql = "mssql", render([script])
    if args.apply and target.dialect == "sqlite":
        raise UsageError(f"grant-sql --agent-login --apply: the control database is {target.display}; SQLite has no "
                         "logins or rights (whoever can open the file can do everything). Apply it to an Azure SQL / "
                         "SQL Server or PostgreSQL control database (AGENT_SQL_SERVER, or --db with an ODBC "
                         "connection string)", setting="--db", value=target.display,
                         expected="an Azure SQL / SQL Server or PostgreSQL control database")

    def document(applied: bool) -> dict:
        return {"agent_login": args.agent_login, "dialect": dialect, "sql": sql, "applied": applied,
                "applied_to": ["the control database"] if applied else [], "warnings": []}

    if not args.apply:
        if args.json:
            print_json(document(False))
        else:
            print(sql, end="")
        return EXIT_OK
    if script is None:
        apply_postgres_script(target, sql, store=agent.store(), now=agent.clock(), actor=command_line_actor(),
                              arguments={"agent_login": args.agent_login, "statements": sql},
                              detail=f"{args.agent_login} has the agent's rights and no more")
    else:
        apply_grant_scripts(target, [script], store=agent.store(), now=agent.clock(), actor=command_line_actor())
    if args.json:
        print_json(document(True))
    else:
        print(f"applied to the control database: {args.agent_login} has the agent's rights and no more")
    return EXIT_OK
