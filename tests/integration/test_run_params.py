"""Run with parameters and SQL Agent's tokens at run time (issue 33 item 4), on SQLite and
PostgreSQL: a job declares its parameters (JOB__<name>__PARAMS__<k>__DEFAULT / __REQUIRED), run-now
gives values, the job's SQL reads them BOUND (SQLite @k, PostgreSQL current_setting('agent.param.k')),
the values are recorded with the run; hostile values are read exactly and nothing else runs; the
run-time tokens are replaced through their escape macros in the job's time zone."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.engine.operations import run_now
from shared.engine.views import history_view
from shared.errors import UsageError
from shared.jobs.tokens import job_id
from tests.support.harness import db_dialect, execute, query, work

UTC = timezone.utc

HOSTILE = {
    "quotes": "it's \"quoted\" ]] '' \\ \\' $1 %s ? :who @who",
    "injection": "x'); DROP TABLE seen; --",
    "dollar": "$$; DROP TABLE seen; $$ $(ESCAPE_NONE(JOBNAME))",
    "unicode": "żółć 漢字 🙂 \u202e right-to-left",
    "big": "é" * 10240,
    "empty": "",
    "newlines": "a\r\nGO\r\nDROP TABLE seen\n",
}


def read_param(dialect: str, name: str) -> str:
    return f"current_setting('agent.param.{name}')" if dialect == "postgres" else f"@{name}"


def build(agent_factory, jobs):
    agent = agent_factory(jobs)
    if agent.target.dialect == "sqlite":
        execute(agent, "CREATE TABLE seen (id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT, v TEXT)")
    elif agent.target.dialect == "mssql":
        # NVARCHAR: T-SQL's TEXT is in the database's code page and would lose what it cannot spell.
        execute(agent, "CREATE TABLE seen (id INT IDENTITY(1,1) PRIMARY KEY, label NVARCHAR(MAX), v NVARCHAR(MAX))")
    else:
        execute(agent, "CREATE TABLE seen (id SERIAL PRIMARY KEY, label TEXT, v TEXT)")
    agent.tick(datetime.now(UTC))
    return agent


def seen(agent) -> list[tuple[str, str]]:
    return [(label, v) for label, v in query(agent, "SELECT label, v FROM seen ORDER BY id")]


def params_job(dialect: str) -> dict[str, str]:
    # On demand (no schedule): it runs when started.
    return {"COMMAND": f"INSERT INTO seen (label, v) VALUES ({read_param(dialect, 'label')}, "
                       f"{read_param(dialect, 'who')})",
            "PARAMS__label__DEFAULT": "default label", "PARAMS__who__REQUIRED": "true"}


def test_hostile_values_are_read_exactly_and_nothing_else_runs(agent_factory, db_url):
    agent = build(agent_factory, {"p": params_job(db_dialect(db_url))})
    started = {}
    for label, value in HOSTILE.items():
        run = run_now(agent, "p", params=[f"label={label}", f"who={value}"])
        assert run.params == {"label": label, "who": value}
        started[run.run_id] = (label, value)
        work(agent)
    assert seen(agent) == list(HOSTILE.items())             # the table is there: no DROP ran
    history = {run["run_id"]: run for run in history_view(agent.store(), "p", 50)["runs"]}
    for run_id, (label, value) in started.items():
        assert history[run_id]["status"] == "succeeded", history[run_id]
        assert history[run_id]["params"] == {"label": label, "who": value}
    # The default fills in; a name in another letter case is the declared one.
    run = run_now(agent, "p", params=["WHO=w"])
    work(agent)
    assert seen(agent)[-1] == ("default label", "w")
    assert run.params == {"label": "default label", "who": "w"}


def test_bad_parameters_are_usage_errors_naming_what_is_wrong(agent_factory, db_url):
    agent = build(agent_factory, {"p": params_job(db_dialect(db_url))})
    cases = [
        (["who=a", "nobody=1"], "--param nobody", "a parameter job 'p' declares (label, who)"),
        ([], "--param who", "declares 'who' without a default"),
        (["who"], "--param", "NAME=VALUE"),
        (["1x=a", "who=b"], "--param", "NAME=VALUE with NAME a parameter name"),
        (["who=a\x00b"], "--param who", "without NUL"),
        (["who=a", "WHO=b"], "--param", "each parameter given once"),
    ]
    for given, setting, expected in cases:
        with pytest.raises(UsageError) as caught:
            run_now(agent, "p", params=given)
        assert caught.value.setting == setting, (given, caught.value)
        assert expected in str(caught.value), (given, str(caught.value))
    assert agent.store().execute("list_history", job_name="p", limit=10).rows == []   # no run was made


def test_a_scheduled_run_reads_the_defaults_and_one_without_a_value_fails_naming_it(agent_factory, db_url):
    dialect = db_dialect(db_url)
    now = datetime.now(UTC).isoformat()
    agent = build(agent_factory, {
        "d": {"SCHEDULE": "@once " + now, "PARAMS__who__DEFAULT": "o'default",
              "COMMAND": f"INSERT INTO seen (label, v) VALUES ('d', {read_param(dialect, 'who')})"},
        "r": {"SCHEDULE": "@once " + now, "PARAMS__who__REQUIRED": "true", "MAX_ATTEMPTS": "1",
              "COMMAND": f"INSERT INTO seen (label, v) VALUES ('r', {read_param(dialect, 'who')})"}})
    work(agent)
    assert seen(agent) == [("d", "o'default")]
    (failed,) = agent.store().execute("list_history", job_name="r", limit=5).rows
    assert failed["status"] == "failed" and "'who'" in failed["last_error"] and "without a default" in failed["last_error"]


def test_jobs_without_parameters_bind_nothing(agent_factory, db_url):
    # A job without declarations keeps its text as it is: a :name or @name in it is the SQL's own.
    agent = build(agent_factory, {"n": {"COMMAND": "INSERT INTO seen (label, v) VALUES ('n', '@who :x $(notatoken)')"}})
    run_now(agent, "n")
    work(agent)
    assert seen(agent) == [("n", "@who :x $(notatoken)")]
    (run,) = agent.store().execute("list_history", job_name="n", limit=5).rows
    assert run["params"] is None


def test_run_time_tokens_are_replaced_through_their_macros_in_the_job_time_zone(agent_factory, db_url):
    zone = "Pacific/Kiritimati"      # UTC+14: the local date differs from UTC's half the day
    agent = build(agent_factory, {
        "tok": {"TIMEZONE": zone,
                "STEPS__1__COMMAND": "INSERT INTO seen (label, v) VALUES ('1', "
                                     "'$(ESCAPE_SQUOTE(JOBNAME))|$(ESCAPE_NONE(STEPID))|$(ESCAPE_SQUOTE(STRTDT))|"
                                     "$(ESCAPE_SQUOTE(STRTTM))|$(ESCAPE_SQUOTE(JOBID))|$(ESCAPE_SQUOTE(DATE))')",
                "STEPS__2__COMMAND": "INSERT INTO seen (label, v) VALUES ('2', '$(ESCAPE_NONE(STEPID))')"},
        "bare": {"COMMAND": "INSERT INTO seen (label, v) VALUES ('bare', '$(JOBNAME)')", "MAX_ATTEMPTS": "1"},
        "srvr": {"COMMAND": "INSERT INTO seen (label, v) VALUES ('srvr', '$(ESCAPE_SQUOTE(SRVR))')",
                 "MAX_ATTEMPTS": "1"}})
    for name in ("tok", "bare", "srvr"):
        run_now(agent, name)
    work(agent)
    rows = dict(seen(agent))
    assert set(rows) == {"1", "2"}
    (run,) = agent.store().execute("list_history", job_name="tok", limit=5).rows
    local = run["started_at"].replace(tzinfo=UTC).astimezone(ZoneInfo(zone))
    name, step, strtdt, strttm, jobid, date = rows["1"].split("|")
    assert (name, step, strtdt, strttm, jobid) == ("tok", "1", local.strftime("%Y%m%d"), local.strftime("%H%M%S"),
                                                  job_id("tok"))
    assert date in (local.strftime("%Y%m%d"), datetime.now(ZoneInfo(zone)).strftime("%Y%m%d"))
    assert rows["2"] == "2"
    for name, expected in (("bare", "a token without an escape macro"), ("srvr", "@@SERVERNAME")):
        (failed,) = agent.store().execute("list_history", job_name=name, limit=5).rows
        assert failed["status"] == "failed" and expected in failed["last_error"], failed


def test_a_tasks_sql_is_run_as_written_tokens_and_all(agent_factory, db_url):
    """SQL Agent replaces tokens in a job step's command only: a task (submit, agent.exec_async)
    is ad-hoc SQL, and text in it that looks like a token is the SQL's own (an attack: a quoted
    'user wrote: $(ESCAPE_SQUOTE(JOBNAME))' was stored as 'user wrote: ', and a task holding
    $(ESCAPE_SQUOTE(SRVR)) failed)."""
    from shared.engine.operations import submit

    agent = build(agent_factory, {})
    text = "user wrote: $(ESCAPE_SQUOTE(JOBNAME)) / $(ESCAPE_NONE(DATE)) / $(ESCAPE_SQUOTE(SRVR)) / $(JOBNAME)"
    submit(agent, f"INSERT INTO seen (label, v) VALUES ('task', '{text}')", order=None, max_attempts=1,
           timeout_seconds=60)
    work(agent)
    assert seen(agent) == [("task", text)]


# ---------------------------------------------------------------- from T-SQL / PL/pgSQL (PostgreSQL)

from tests.integration.test_job_owner import operator  # noqa: E402,F401  (the fixture)
from tests.support.tsql_caller import CallError, call  # noqa: E402


def test_start_job_with_params_runs_as_the_owner_reading_them_bound(operator):
    """agent.set_job_params declares, agent.start_job @params gives: the job, run as its owner
    (inside the owner's security-definer function), reads them with current_setting, exactly."""
    name, as_operator, agent = operator
    call(as_operator, "add_scheduled_job", name="owned", max_attempts=1,
         sql="INSERT INTO owned_work SELECT current_setting('agent.param.who'), "
             "current_setting('agent.param.Label') || ':' || current_user")
    call(as_operator, "set_job_params", job_name="owned", params=json.dumps({"who": None, "Label": "lbl"}))
    agent.tick(agent.clock())
    value = HOSTILE["injection"] + HOSTILE["quotes"] + HOSTILE["unicode"]
    (started,) = call(as_operator, "start_job", job_name="owned", params=json.dumps({"WHO": value}))
    work(agent, concurrency=1)
    run = agent.store().execute("get_run", run_id=started["run_id"]).one()
    assert run["status"] == "succeeded", run
    assert json.loads(run["params"]) == {"who": value, "Label": "lbl"}
    assert query(agent, "SELECT who, login FROM owned_work") == [(value, f"lbl:{name}")]
    # Both calls are audited (0017's way), the values with the call.
    audit = query(agent, "SELECT action, arguments FROM agent.audit WHERE action IN ('run-now', 'set-params') "
                         "ORDER BY audit_id")
    assert [row[0] for row in audit] == ["set-params", "run-now"]
    assert json.loads(json.loads(audit[1][1])["params"]) == {"WHO": value}


@pytest.mark.parametrize("params, expected", [
    ('{"nobody": "x"}', "expected a parameter job 'owned' declares (who)"),
    ("{}", "declares 'who' without a default"),
    (None, "declares 'who' without a default"),
    ('{"who": 1}', "expected a JSON string"),
    ('{"who": "a\\u0000b"}', "without NUL"),
    ("[1]", "expected a JSON object"),
    ("not json", "expected a JSON object"),
    ('{"who": "a", "WHO": "b"}', "each parameter given once"),
    # A lone surrogate escape is JSON, but no Unicode: PostgreSQL's raw 22P02 came out (0031).
    ('{"who": "\\ud800"}', "agent.start_job: @params = "),
    ('{"who": "\\udc00x"}', "a \\uD800-\\uDFFF escape is half of a surrogate pair"),
    ('{"\\ud83d": "a"}', "expected JSON text whose \\u escapes are Unicode characters"),
])
def test_start_job_refuses_bad_params_naming_them(operator, params, expected):
    name, as_operator, agent = operator
    call(as_operator, "add_scheduled_job", name="owned", sql="SELECT 1")
    call(as_operator, "set_job_params", job_name="owned", params='{"who": null}')
    with pytest.raises(CallError) as caught:
        call(as_operator, "start_job", job_name="owned", params=params)
    assert caught.value.code == "22023" and expected in caught.value.message, caught.value
    assert query(agent, "SELECT COUNT(*) FROM agent.runs") == [(0,)]


@pytest.mark.parametrize("params, expected", [
    ('{"1x": null}', "expected a parameter name"),
    ('{"a": 1}', "expected a JSON string (the default) or null"),
    ('{"a": null, "A": "x"}', "differ by more than letter case"),
    ('{"STMT": null}', "not stmt or params"),
    ("[]", "expected a JSON object"),
    ('{"a": "\\ud800"}', "agent.set_job_params: @params = "),
    ('{"a": null, "b": "x\\udfff"}', "half of a surrogate pair"),
])
def test_set_job_params_refuses_bad_declarations(operator, params, expected):
    name, as_operator, agent = operator
    call(as_operator, "add_scheduled_job", name="owned", sql="SELECT 1")
    with pytest.raises(CallError) as caught:
        call(as_operator, "set_job_params", job_name="owned", params=params)
    assert caught.value.code == "22023" and expected in caught.value.message, caught.value
    with pytest.raises(CallError) as caught:
        call(as_operator, "set_job_params", job_name="not_a_database_job", params="{}")
    assert caught.value.code == "P0002"


@pytest.mark.parametrize("names", [[], ["k"], ["who", "Label", "agent_job", "agent_param_1"]])
def test_the_sql_server_batch_binds_params_and_parses(names):
    """On SQL Server the job's SQL reads @k: sp_executesql declares each NVARCHAR(MAX); only the
    names (identifiers) are in the text, every value a ? of its own after the job's SQL."""
    from sqlfluff.core import FluffConfig, Linter

    from shared.control.store import mssql_job_batch

    params = {name: "x'; DROP TABLE t; --" for name in names}
    batch = mssql_job_batch(None, params)
    assert batch.count("?") == 1 + len(names) and "DROP" not in batch
    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))
    parsed = linter.parse_string(batch.replace("?", "N'SELECT 1'"))
    assert not parsed.violations and "unparsable" not in parsed.tree.stringify(), parsed.tree.stringify()
    for n, name in enumerate(names, 1):
        assert f"@{name} NVARCHAR(MAX)" in batch and f"@{name} = @agent_param_{n}" in batch
    with pytest.raises(Exception, match="parameter name"):
        mssql_job_batch(None, {"x = 1; DROP TABLE t; --": "v"})


def test_the_run_page_shows_the_params_escaped(agent_factory, db_url):
    import contextlib
    import html

    from shared.web.app import Monitor, MonitorSettings

    agent = build(agent_factory, {"p": params_job(db_dialect(db_url))})
    hostile = "<script>alert('x')</script> & \"q\""
    run = run_now(agent, "p", params=[f"who={hostile}"])
    store = agent.new_store()

    @contextlib.contextmanager
    def lend():
        try:
            yield store
        finally:
            store.close()

    monitor = Monitor(lend, clock=lambda: datetime.now(UTC), settings=lambda: MonitorSettings())
    response = monitor.handle("GET", f"/runs/{run.run_id}", "", "")
    assert response.status == 200
    body = response.body.decode()
    assert "<dt>Parameters</dt>" in body and "<script>" not in body
    assert f"<dt>who</dt><dd><pre>{html.escape(hostile)}</pre></dd>" in body or html.escape(hostile, quote=False) in body


def test_every_step_of_a_run_reads_its_params(agent_factory, db_url):
    """Each step runs in a transaction of its own: the values are bound in each."""
    dialect = db_dialect(db_url)
    read = read_param(dialect, "who")
    agent = build(agent_factory, {"s": {"STEPS__1__COMMAND": f"INSERT INTO seen (label, v) VALUES ('1', {read})",
                                        "STEPS__2__COMMAND": f"INSERT INTO seen (label, v) VALUES ('2', {read})",
                                        "PARAMS__who__DEFAULT": "d"}})
    run_now(agent, "s", params=["who=it's"])
    work(agent)
    assert seen(agent) == [("1", "it's"), ("2", "it's")]


def test_jobs_shows_the_declared_parameters_and_defaults(agent_factory, db_url, capsys):
    from shared.cli.commands import cmd_jobs
    agent = build(agent_factory, {"p": params_job(db_dialect(db_url)),
                                  "n": {"COMMAND": "SELECT 1"}})

    class Args:
        json = True

    assert cmd_jobs(agent, Args()) == 0
    rows = {row["job_name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["p"]["params"] == {"label": "default label", "who": None}
    assert rows["n"]["params"] is None
    Args.json = False
    assert cmd_jobs(agent, Args()) == 0
    out = capsys.readouterr().out
    assert "PARAMS" in out and "label=default label, who (required)" in out
