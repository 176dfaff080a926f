"""Import SQL Server Agent jobs: the T-SQL that SSMS writes for "Script Job as -> CREATE To"
turned into this agent's JOB__<name>__* app settings (or agent.add_scheduled_job calls).

The scripts are read with sqlglot's T-SQL tokenizer (strings with doubled quotes, N'...',
comments, brackets): the EXEC statements of msdb's job procedures are picked out of the token
stream with their named arguments, variables are followed (@jobId OUTPUT, DECLARE @x = ...), and
everything else (BEGIN TRANSACTION, IF ... GOTO QuitWithRollback, GO) is skipped.

What cannot be carried over exactly is listed per job with the reason, never dropped silently.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any, Iterable

from shared.errors import ScriptError
from shared.jobs.from_settings import parse_jobs
from shared.jobs.schedules import validate_timezone
from shared.values import DATABASE_NAME_PATTERN

SYSTEM_DATABASES = {"master", "msdb", "model", "tempdb"}
JOB_PROCEDURES = {"sp_add_job", "sp_update_job", "sp_add_jobstep", "sp_update_jobstep", "sp_add_jobschedule",
                  "sp_add_schedule", "sp_attach_schedule", "sp_add_jobserver", "sp_add_category",
                  "sp_add_notification", "sp_add_alert", "sp_add_operator", "sp_update_schedule"}
ACTIONS = {1: "quit_success", 2: "quit_failure", 3: "next"}
DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MAX_NAME = 64
SECONDS_PER_DAY = 86400


# ---------------------------------------------------------------- reading the script


@dataclass
class Call:
    procedure: str                  # last part of the name, lower case: sp_add_job
    arguments: dict[str, Any]       # lower-case parameter name (no @) -> value (str, int, None, Var)
    line: int


@dataclass(frozen=True)
class Var:
    name: str                       # lower case, no @


def read_calls(text: str, source: str = "<script>") -> list[Call]:
    """The msdb job procedure calls of a script, in order, with variables resolved where they
    hold a literal (DECLARE @x ... = literal, SET @x = literal); OUTPUT variables stay Var."""
    try:
        # sqlglot loads only for import-sqlagent (the engine never needs it)
        from sqlglot.dialects.tsql import TSQL

        # sqlglot loads only for import-sqlagent (the engine never needs it)
        from sqlglot.errors import TokenError

        # sqlglot loads only for import-sqlagent (the engine never needs it)
        from sqlglot.tokens import TokenType
    except ModuleNotFoundError:
        raise ScriptError("import-sqlagent reads T-SQL with sqlglot's tokenizer, which is not installed here: "
                           "install the command line's requirements (pip install -r requirements-cli.txt; "
                           "pip install . and pipx install . include them; the function app does not need them)") from None

    try:
        tokens = TSQL().tokenizer().tokenize(text)
    except TokenError as exc:
        raise ScriptError(f"{source}: not T-SQL the tokenizer can read: {exc}") from None
    values: dict[str, Any] = {}
    calls: list[Call] = []
    i, n = 0, len(tokens)

    def is_param(k: int) -> bool:
        """A variable or parameter name starts at token k: '@' then a name."""
        return k + 1 < n and tokens[k].token_type == TokenType.PARAMETER and _word(tokens[k + 1])

    def literal(k: int) -> tuple[Any, int] | None:
        """The literal (or variable) starting at token k and the index after it."""
        if k >= n:
            return None
        tok = tokens[k]
        kind = tok.token_type
        if kind in (TokenType.STRING, TokenType.NATIONAL_STRING):
            return tok.text, k + 1
        if kind == TokenType.NUMBER:
            return _number(tok.text), k + 1
        if kind == TokenType.DASH and k + 1 < n and tokens[k + 1].token_type == TokenType.NUMBER:
            return -_number(tokens[k + 1].text), k + 2
        if kind == TokenType.NULL:
            return None, k + 1
        if kind == TokenType.HEX_STRING:
            return "0x" + tok.text, k + 1
        if is_param(k):
            name = tokens[k + 1].text.lower()
            return (values[name] if name in values else Var(name)), k + 2
        return None

    while i < n:
        tok = tokens[i]
        kind = tok.token_type
        if kind == TokenType.DECLARE or (kind in (TokenType.SET, TokenType.COMMAND) and tok.text.upper() == "SET"):
            # DECLARE @a type [= literal] [, @b type [= literal]] / SET @a = literal
            i += 1
            while i < n and is_param(i):
                name = tokens[i + 1].text.lower()
                i += 2
                while i < n and tokens[i].token_type not in (TokenType.EQ, TokenType.COMMA, TokenType.SEMICOLON) \
                        and not is_param(i) and tokens[i].token_type != TokenType.COMMAND \
                        and tokens[i].text.upper() not in ("IF", "EXEC", "EXECUTE", "SELECT", "BEGIN", "DECLARE", "SET"):
                    i += 1          # the type: BINARY(16), sysname, INT, NVARCHAR(MAX)
                if i < n and tokens[i].token_type == TokenType.EQ:
                    found = literal(i + 1)
                    if found is not None:
                        values[name], i = found
                    else:
                        values.pop(name, None)
                        i += 1
                if i < n and tokens[i].token_type == TokenType.COMMA:
                    i += 1
            continue
        if kind == TokenType.EXECUTE or (kind in (TokenType.VAR, TokenType.COMMAND) and tok.text.upper() == "EXEC"):
            line = tok.line
            i += 1
            if is_param(i) and i + 2 < n and tokens[i + 2].token_type == TokenType.EQ:
                i += 3      # EXEC @ReturnCode = ...
            parts: list[str] = []
            while i < n and _word(tokens[i]):
                parts.append(tokens[i].text)
                i += 1
                if i < n and tokens[i].token_type == TokenType.DOT:
                    i += 1
                    continue
                break
            procedure = parts[-1].lower() if parts else ""
            arguments: dict[str, Any] = {}
            while is_param(i) and i + 2 < n and tokens[i + 2].token_type == TokenType.EQ:
                name = tokens[i + 1].text.lower()
                variable = tokens[i + 4].text.lower() if is_param(i + 3) else None
                found = literal(i + 3)
                if found is None:
                    raise ScriptError(f"{source}, line {tokens[i].line}: @{name} of {procedure}: expected a "
                                       f"literal or a variable, found {tokens[i + 3].text if i + 3 < n else 'the end'!r}")
                value, i = found
                if i < n and (tokens[i].token_type == TokenType.RETURNING or tokens[i].text.upper() in ("OUTPUT", "OUT")):
                    if variable is not None:
                        value = Var(variable)       # set by the call: it names the object created
                    i += 1
                if i < n and tokens[i].token_type in (TokenType.PLUS, TokenType.DASH, TokenType.STAR, TokenType.SLASH,
                                                      TokenType.L_PAREN, TokenType.DOT, TokenType.DPIPE):
                    # An expression (N'a' + @b, CAST(...)): its value is not known until run time.
                    raise ScriptError(f"{source}, line {tokens[i].line}: @{name} of {procedure}: expected a literal "
                                      f"or a variable, found an expression ({tokens[i].text!r} after the value): "
                                      "give the value itself")
                arguments[name] = value
                if i < n and tokens[i].token_type == TokenType.COMMA:
                    i += 1
            if procedure in JOB_PROCEDURES:
                calls.append(Call(procedure, arguments, line))
            continue
        i += 1
    return calls


def _word(tok) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_#][A-Za-z0-9_$#@]*", tok.text)) or tok.token_type.name == "IDENTIFIER"


def _number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return int(float(text))


# ---------------------------------------------------------------- the jobs as SQL Agent has them


# A step that starts another job (how SQL Agent chains jobs): EXEC [msdb.dbo.]sp_start_job (its
# return code assigned or not), with the job's name as a literal (@job_name = N'...' or the first
# argument; None for any other form, a variable or @job_id).
START_JOB = re.compile(r"\bEXEC(?:UTE)?\s+(?:@\w+\s*=\s*)?(?:\[?msdb\]?\s*\.\s*(?:\[?dbo\]?)?\s*\.\s*)?"
                       r"\[?sp_start_job\]?(?![\w$#@])(?:\s+(?:@job_name\s*=\s*)?N?'((?:[^']|'')*)')?", re.IGNORECASE)


@dataclass
class AgentStep:
    step_id: int
    name: str
    arguments: dict[str, Any]


@dataclass
class AgentSchedule:
    name: str
    arguments: dict[str, Any]


@dataclass
class AgentJob:
    name: str
    arguments: dict[str, Any]
    steps: list[AgentStep] = field(default_factory=list)
    schedules: list[AgentSchedule] = field(default_factory=list)
    extra: list[tuple[str, str]] = field(default_factory=list)      # (what, reason) found while reading
    start_step_id: int = 1


def collect_jobs(calls: list[Call], source: str = "<script>") -> list[AgentJob]:
    jobs: list[AgentJob] = []
    by_var: dict[str, AgentJob] = {}
    by_name: dict[str, AgentJob] = {}
    shared: dict[Any, AgentSchedule] = {}          # sp_add_schedule by @schedule_id variable and by name
    current: AgentJob | None = None

    def job_of(call: Call) -> AgentJob:
        ref = call.arguments.get("job_id")
        if isinstance(ref, Var) and ref.name in by_var:
            return by_var[ref.name]
        name = call.arguments.get("job_name")
        if isinstance(name, str) and name.casefold() in by_name:
            return by_name[name.casefold()]
        if current is not None and ref is None and name is None:
            return current
        raise ScriptError(f"{source}, line {call.line}: {call.procedure} names a job this script does not create "
                           f"(@job_id={_show(ref)}, @job_name={_show(name)})")

    for call in calls:
        a = call.arguments
        if call.procedure == "sp_add_job":
            name = a.get("job_name")
            if not isinstance(name, str) or not name.strip():
                raise ScriptError(f"{source}, line {call.line}: sp_add_job without @job_name")
            current = AgentJob(name=name, arguments=a, start_step_id=_int(a.get("start_step_id"), 1))
            jobs.append(current)
            by_name[name.casefold()] = current
            if isinstance(a.get("job_id"), Var):
                by_var[a["job_id"].name] = current
        elif call.procedure == "sp_update_job":
            job = job_of(call)
            if "start_step_id" in a:
                job.start_step_id = _int(a["start_step_id"], 1)
            for key, value in a.items():
                if key not in ("job_id", "job_name", "start_step_id"):
                    job.arguments[key] = value
        elif call.procedure in ("sp_add_jobstep", "sp_update_jobstep"):
            job = job_of(call)
            step_id = _int(a.get("step_id"), len(job.steps) + 1)
            existing = next((s for s in job.steps if s.step_id == step_id), None)
            if existing is not None and call.procedure == "sp_update_jobstep":
                existing.arguments.update(a)
            else:
                job.steps.append(AgentStep(step_id, str(a.get("step_name") or f"step {step_id}"), dict(a)))
        elif call.procedure == "sp_add_jobschedule":
            job = job_of(call)
            job.schedules.append(AgentSchedule(str(a.get("name") or f"schedule {len(job.schedules) + 1}"), a))
        elif call.procedure == "sp_add_schedule":
            schedule = AgentSchedule(str(a.get("schedule_name") or "schedule"), a)
            if isinstance(a.get("schedule_id"), Var):
                shared[("var", a["schedule_id"].name)] = schedule
            if isinstance(a.get("schedule_uid"), Var):
                shared[("var", a["schedule_uid"].name)] = schedule
            shared[("name", schedule.name.casefold())] = schedule
        elif call.procedure == "sp_attach_schedule":
            job = job_of(call)
            ref = a.get("schedule_id")
            schedule = shared.get(("var", ref.name)) if isinstance(ref, Var) else None
            if schedule is None and isinstance(a.get("schedule_name"), str):
                schedule = shared.get(("name", a["schedule_name"].casefold()))
            if schedule is None:
                job.extra.append((f"schedule {_show(a.get('schedule_name') or ref)}",
                                  "attached with sp_attach_schedule but not created in this script (script the "
                                  "schedule too, or add JOB__<name>__SCHEDULE by hand)"))
            else:
                job.schedules.append(schedule)
        elif call.procedure == "sp_add_jobserver":
            job = job_of(call)
            server = a.get("server_name")
            if isinstance(server, str) and server.strip() and server.strip().lower() != "(local)":
                job.extra.append((f"target server {server!r}",
                                  "a multi-server (MSX/TSX) target: the job runs where the agent's settings are"))
        elif call.procedure == "sp_add_notification":
            job = job_of(call) if ("job_id" in a or "job_name" in a) else current
            if job is not None:
                job.extra.append(("notification", "sp_add_notification (an alert's operator): alerts are not carried"))
        elif call.procedure == "sp_add_alert":
            name = a.get("name")
            job = None
            if "job_id" in a or "job_name" in a:
                try:
                    job = job_of(call)
                except ScriptError:
                    job = None
            if job is not None:
                job.extra.append((f"alert {name!r}", "SQL Agent alerts (on an error number, severity or "
                                  "performance condition) have no equivalent; use Azure Monitor alerts"))
    return jobs


# ---------------------------------------------------------------- the conversion


@dataclass
class Converted:
    sql_agent_name: str
    job: str                                   # the JOB__<job>__ name
    settings: dict[str, str]                   # JOB__<job>__SETTING -> value
    emitted: bool                              # False: settings incomplete (no schedule) or invalid
    not_carried: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps: int = 0
    apply: dict[str, Any] | None = None        # agent.add_scheduled_job arguments, when one call expresses it
    on_demand: bool = False                    # no SCHEDULE: run only when started

    def as_json(self) -> dict[str, Any]:
        return {"sql_agent_name": self.sql_agent_name, "job": self.job, "emitted": self.emitted,
                "settings": self.settings, "not_carried": self.not_carried, "notes": self.notes}


def setting_name(name: str, taken: set[str]) -> str:
    """A SQL Agent job name as a JOB__<name>__ name valid everywhere (Linux App Service too):
    accents dropped, every run of other characters one '_', no leading/trailing '_', at most 64
    characters, made unique case-insensitively with _2, _3, ..."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    base = re.sub(r"[^A-Za-z0-9]+", "_", ascii_name).strip("_")[:MAX_NAME].strip("_") or "job"
    candidate, counter = base, 1
    while candidate.casefold() in taken:
        counter += 1
        suffix = f"_{counter}"
        candidate = base[:MAX_NAME - len(suffix)].rstrip("_") + suffix
    taken.add(candidate.casefold())
    return candidate


def convert_script(texts: Iterable[tuple[str, str]], timezone: str = "UTC", *,
                   today: date | None = None) -> list[Converted]:
    """(source, text) pairs -> one Converted per job (per schedule that could not share the job's)."""

    validate_timezone(timezone)
    today = today or datetime.now(validate_timezone(timezone)).date()
    jobs: list[AgentJob] = []
    for source, text in texts:
        jobs.extend(collect_jobs(read_calls(text, source), source))
    taken: set[str] = set()
    out: list[Converted] = []
    for job in jobs:
        out.extend(_convert_job(job, timezone, today, taken))
    return out


def _convert_job(job: AgentJob, timezone: str, today: date, taken: set[str]) -> list[Converted]:

    name = setting_name(job.name, taken)
    missing: list[dict[str, str]] = [{"what": what, "reason": reason} for what, reason in job.extra]
    notes: list[str] = []
    if name != job.name:
        notes.append(f"job {job.name!r} is JOB__{name}__* (setting names take letters, digits and '_')")

    def left_out(what: str, reason: str) -> None:
        missing.append({"what": what, "reason": reason})

    a = job.arguments
    notify_levels: set[int] = set()     # SQL Agent's 1 on success, 2 on failure, 3 on completion
    for level, operator in (("notify_level_email", "notify_email_operator_name"),
                            ("notify_level_netsend", "notify_netsend_operator_name"),
                            ("notify_level_page", "notify_page_operator_name")):
        if _int(a.get(level), 0) != 0 and a.get(operator):
            notify_levels.add(_int(a.get(level), 0))
            left_out(f"@{level}={a.get(level)} to operator {a.get(operator)!r}",
                     "operators are not carried: NOTIFY says when, give it a webhook (NOTIFY_WEBHOOK_URL or "
                     "AGENT_NOTIFY_WEBHOOK_URL, docs/steps.md#notifications)")
    if _int(a.get("notify_level_eventlog"), 0) != 0:
        left_out(f"@notify_level_eventlog={a.get('notify_level_eventlog')}",
                 "there is no Windows event log: every run is in the history and in Application Insights")
    if _int(a.get("delete_level"), 0) != 0:
        left_out(f"@delete_level={a.get('delete_level')}", "jobs that delete themselves are not supported")

    prefix = f"JOB__{name}__"
    settings: dict[str, str] = {}
    steps = sorted(job.steps, key=lambda s: s.step_id)
    kept: list[AgentStep] = []
    for step in steps:
        s = step.arguments
        label = f"step {step.step_id} ({step.name!r})"
        subsystem = str(s.get("subsystem") or "TSQL")
        if subsystem.upper() != "TSQL":
            left_out(label, f"subsystem {subsystem}: only T-SQL steps run here (CmdExec, PowerShell, SSIS and the "
                            "replication/Analysis Services subsystems have no equivalent in Azure SQL)")
            continue
        if s.get("proxy_name") or s.get("proxy_id"):
            left_out(f"{label} proxy {_show(s.get('proxy_name') or s.get('proxy_id'))}",
                     "proxies are not carried: the step runs as the agent's job principal")
        if s.get("database_user_name"):
            left_out(f"{label} @database_user_name={s['database_user_name']!r}",
                     "the step runs as the agent's job principal (AGENT_JOB_PRINCIPAL), not as another user")
        if s.get("output_file_name"):
            left_out(f"{label} @output_file_name={s['output_file_name']!r}",
                     "there is no file system: the step's output is kept in the history (history --output)")
        if s.get("server"):
            left_out(f"{label} @server={s['server']!r}", "steps run on the control database's server")
        if not isinstance(s.get("command"), str) or not s["command"].strip():
            left_out(label, "no @command")
            continue
        started = START_JOB.search(s["command"])
        if started:
            # A chain: SQL Agent jobs start the next job from a step. There is no msdb in Azure SQL
            # Database, so the step would fail; here the started job follows this one (AFTER).
            whom = f"job {started.group(1).replace(chr(39) * 2, chr(39))!r}" if started.group(1) is not None \
                else "the job it starts"
            left_out(f"{label} EXEC sp_start_job",
                     f"msdb.dbo.sp_start_job does not exist in Azure SQL Database (the step would fail): make {whom} "
                     f"follow this one instead, JOB__<its name>__AFTER={name} (with AFTER_OUTCOME=failed or "
                     "completed when the step is reached on failure too), and remove the step "
                     "(docs/moving-from-sql-agent.md, Chains)")
        kept.append(step)

    step_numbers = {step.step_id: k + 1 for k, step in enumerate(kept)}
    if kept and job.start_step_id != kept[0].step_id:
        left_out(f"@start_step_id={job.start_step_id}",
                 f"a run starts at step 1 here; SQL Agent started at step {job.start_step_id}")
    moved = [f"{old}->{new}" for old, new in step_numbers.items() if old != new]
    if moved:
        notes.append("steps renumbered after the steps left out: " + ", ".join(moved))

    def action(step: AgentStep, which: str) -> str | None:
        code = _int(step.arguments.get(f"on_{which}_action"), 1 if which == "success" else 2)
        if code in ACTIONS:
            return ACTIONS[code]
        if code == 4:
            target = _int(step.arguments.get(f"on_{which}_step_id"), 0)
            if target in step_numbers:
                return f"goto:{step_numbers[target]}"
            left_out(f"step {step.step_id} @on_{'fail' if which == 'fail' else which}_action=4",
                     f"goes to step {target}, which is not carried; the flow quits with failure instead")
            return "quit_failure"
        left_out(f"step {step.step_id} @on_{which}_action={code}", "unknown action; expected 1 to 4")
        return None

    apply: dict[str, Any] | None = {}
    one_step = len(kept) == 1
    for step in kept:
        s = step.arguments
        number = step_numbers[step.step_id]
        success, failure = action(step, "success"), action(step, "fail")
        attempts = _int(s.get("retry_attempts"), 0) + 1
        if attempts > 100:
            left_out(f"step {step.step_id} @retry_attempts={attempts - 1}", "at most 99 retries (MAX_ATTEMPTS 100)")
            attempts = 100
        interval = _int(s.get("retry_interval"), 0) * 60
        if interval > SECONDS_PER_DAY:
            left_out(f"step {step.step_id} @retry_interval={interval // 60}", "at most 1440 minutes (one day)")
            interval = SECONDS_PER_DAY
        database = s.get("database_name")
        db_value = None
        if isinstance(database, str) and database.strip():
            if database.strip().lower() in SYSTEM_DATABASES:
                left_out(f"step {step.step_id} @database_name={database!r}",
                         "a system database: the step runs in the control database instead (check it)")
            elif not DATABASE_NAME_PATTERN.match(database.strip()):
                left_out(f"step {step.step_id} @database_name={database!r}",
                         "not a database name the agent accepts (1-128 letters, digits, '_' or '-'): "
                         "the step runs in the control database instead")
            else:
                db_value = database.strip()
        simple = one_step and success in ("quit_success", "next") and failure in ("quit_failure", "next") \
            and interval == 0
        if simple:
            settings[prefix + "COMMAND"] = s["command"]
            settings[prefix + "MAX_ATTEMPTS"] = str(attempts)
            if db_value:
                settings[prefix + "DATABASE"] = db_value
            apply = {"sql": s["command"], "max_attempts": attempts, "database": db_value}
        else:
            apply = None
            sp = f"{prefix}STEPS__{number}__"
            settings[sp + "COMMAND"] = s["command"]
            settings[sp + "MAX_ATTEMPTS"] = str(attempts)
            if interval:
                settings[sp + "RETRY_INTERVAL_SECONDS"] = str(interval)
            if db_value:
                settings[sp + "DATABASE"] = db_value
            if success:
                settings[sp + "ON_SUCCESS"] = success
            if failure:
                settings[sp + "ON_FAILURE"] = failure
    if not kept:
        apply = None
    settings[prefix + "TIMEZONE"] = timezone
    if notify_levels:
        settings[prefix + "NOTIFY"] = ("on_completion" if 3 in notify_levels or {1, 2} <= notify_levels
                                       else "on_success" if 1 in notify_levels else "on_failure")
    enabled = _int(a.get("enabled"), 1) != 0
    settings[prefix + "ENABLED"] = "true" if enabled else "false"

    # Schedules: each becomes (day spec, times of day); schedules with the same day spec share one
    # NCRONTAB when their times together are still one; the others become jobs of their own.
    groups: list[tuple[tuple, set[int], list[str], str | None]] = []  # (days, times, names, once)
    for schedule in job.schedules:
        result = schedule_to_parts(schedule, today)
        if isinstance(result, str):
            left_out(f"schedule {schedule.name!r}", result)
            continue
        days, times, once, caveats = result
        for caveat in caveats:
            left_out(f"schedule {schedule.name!r}", caveat)
        if once is not None:
            groups.append((("once",), set(), [schedule.name], once))
            continue
        for k, (g_days, g_times, g_names, g_once) in enumerate(groups):
            if g_once is None and g_days == days and _time_fields(g_times | times) is not None:
                groups[k] = (g_days, g_times | times, g_names + [schedule.name], None)
                break
        else:
            groups.append((days, set(times), [schedule.name], None))

    results: list[Converted] = []
    if not groups:
        # SQL Agent runs a job without a schedule only when started: here, an on-demand job.
        notes.append("no schedule carried over: an on-demand job (no SCHEDULE), run only when started "
                     "(run-now, agent.start_job)" + (" - its schedules are listed above" if job.schedules else ""))
    for k, (days, times, names, once) in enumerate(groups):
        if k == 0:
            job_name, job_settings = name, dict(settings)
        else:
            job_name = setting_name(f"{name}_{k + 1}", taken)
            job_settings = {f"JOB__{job_name}__" + key[len(prefix):]: value for key, value in settings.items()}
            notes.append(f"schedule(s) {', '.join(map(repr, names))} became job JOB__{job_name}__* (a copy of the "
                         "steps): their times do not fit one NCRONTAB with the others; the two jobs do not share "
                         "the overlap policy")
        expression = once if once is not None else render_cron(days, times)
        job_settings[f"JOB__{job_name}__SCHEDULE"] = expression
        job_apply = None
        if apply is not None:
            job_apply = dict(apply, name=job_name, timezone=timezone, enabled=1 if enabled else 0)
            if once is not None:
                job_apply["run_at"] = once[len("@once "):]
            else:
                job_apply["schedule"] = expression
        results.append(Converted(job.name, job_name, job_settings, True, [], [], len(kept), job_apply))
    if not results:
        results.append(Converted(job.name, name, settings, True, [], [], len(kept), None, on_demand=True))
    if not kept:
        left_out("steps", "no T-SQL step to run: the job is not emitted")
        for result in results:
            result.emitted = False
    # The engine's own validation of each emitted job.

    for result in results:
        if result.emitted:
            _valid, invalid = parse_jobs(result.settings)
            for bad in invalid:
                result.emitted = False
                for error in bad.errors:
                    left_out(f"job {result.job}", f"the agent refuses the converted settings: {error}")
    for result in results:
        result.not_carried = missing
        result.notes = notes
    return results


# ---------------------------------------------------------------- schedules


def _int(value: Any, default: int) -> int:
    if value is None or isinstance(value, Var):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _show(value: Any) -> str:
    return f"@{value.name}" if isinstance(value, Var) else repr(value)


def _hhmmss(value: int) -> int:
    """HHMMSS (an int, as SQL Agent stores it) -> seconds since midnight."""
    value = max(0, min(int(value), 235959))
    return (value // 10000) * 3600 + (value // 100 % 100) * 60 + value % 100


def _yyyymmdd(value: int) -> date | None:
    try:
        return date(value // 10000, value // 100 % 100, value % 100)
    except ValueError:
        return None


def schedule_to_parts(schedule: AgentSchedule, today: date):
    """(day spec, set of seconds-of-day, '@once ...' or None, caveats) or a reason (str)."""
    a = schedule.arguments
    if _int(a.get("enabled"), 1) == 0:
        return "disabled in SQL Agent: not carried (enable it there first, or add it by hand)"
    freq_type = _int(a.get("freq_type"), 0)
    interval = _int(a.get("freq_interval"), 0)
    subday_type = _int(a.get("freq_subday_type"), 1)
    subday_interval = _int(a.get("freq_subday_interval"), 0)
    relative = _int(a.get("freq_relative_interval"), 0)
    factor = _int(a.get("freq_recurrence_factor"), 0)
    start_time = _hhmmss(_int(a.get("active_start_time"), 0))
    end_time = _hhmmss(_int(a.get("active_end_time"), 235959))
    start_date = _yyyymmdd(_int(a.get("active_start_date"), 0)) if a.get("active_start_date") else None
    end_date = _yyyymmdd(_int(a.get("active_end_date"), 99991231))
    caveats: list[str] = []
    if freq_type == 64:
        return "@freq_type=64 (when SQL Server Agent starts): there is no such event here"
    if freq_type == 128:
        return "@freq_type=128 (when the CPU is idle): there is no such event here"
    if freq_type == 1:
        if start_date is None:
            return "@freq_type=1 (once) without a valid @active_start_date"
        moment = datetime.combine(start_date, time()) + timedelta(seconds=start_time)
        if start_date < today:
            return f"@freq_type=1 (once) on {moment.isoformat()}: already past, SQL Agent will not run it again"
        return ("once",), set(), f"@once {moment.isoformat()}", caveats
    if end_date is not None and end_date < date(9999, 12, 31):
        if end_date < today:
            return f"@active_end_date={end_date:%Y%m%d} is past: the schedule has ended"
        caveats.append(f"@active_end_date={end_date:%Y%m%d}: there is no end date here; the schedule carries on "
                       "(disable or remove the job then)")
    if start_date is not None and start_date > today:
        caveats.append(f"@active_start_date={start_date:%Y%m%d} is in the future: there is no start date here; "
                       "the schedule starts at once")

    # Times of day.
    if subday_type == 1:
        times = {start_time}
    elif subday_type in (2, 4, 8):
        step = subday_interval * {2: 1, 4: 60, 8: 3600}[subday_type]
        if step <= 0:
            return f"@freq_subday_type={subday_type} with @freq_subday_interval={subday_interval}: expected 1 or more"
        if end_time < start_time:
            return (f"@active_start_time={a.get('active_start_time')} after @active_end_time="
                    f"{a.get('active_end_time')} (a window across midnight): not one NCRONTAB")
        times = set(range(start_time, end_time + 1, step))
    else:
        return f"@freq_subday_type={subday_type}: expected 1, 2, 4 or 8"
    if _time_fields(times) is None:
        unit = {2: "second(s)", 4: "minute(s)", 8: "hour(s)"}.get(subday_type, "")
        return (f"every {subday_interval} {unit} from {_clock(start_time)} to {_clock(end_time)}: these times are not "
                "one NCRONTAB (the interval does not divide the hour or day evenly, or the window does not end on "
                "a whole step); split it by hand into schedules that are")

    # Days.
    if freq_type == 4:
        if interval > 1:
            return (f"every {interval} days (@freq_interval={interval}): NCRONTAB counts days within a month, "
                    "not from a start date")
        return ("*", "*", "*"), times, None, caveats
    if freq_type == 8:
        if factor > 1:
            return f"every {factor} weeks (@freq_recurrence_factor={factor}): NCRONTAB has no week count"
        days = [str(k) for k in range(7) if interval & (1 << k)]
        if not days:
            return f"weekly with @freq_interval={interval}: no day of the week"
        return ("*", "*", ",".join(days)), times, None, caveats
    if freq_type in (16, 32):
        months = "*"
        if factor > 1:
            if 12 % factor:
                return f"every {factor} months (@freq_recurrence_factor={factor}): not a fixed set of months"
            anchor = start_date or today
            if start_date is None:
                caveats.append(f"every {factor} months without @active_start_date: counted from this month")
            day_of_month = interval if freq_type == 16 else {1: 1, 2: 2, 4: 3, 8: 4}.get(relative, 1)
            # SQL Agent's first run is the first such day on or after @active_start_date; then every N months.
            first = anchor.month if day_of_month >= anchor.day else anchor.month % 12 + 1
            months = ",".join(str(m) for m in sorted((first - 1 + k * factor) % 12 + 1 for k in range(12 // factor)))
        if freq_type == 16:
            if not 1 <= interval <= 31:
                return f"monthly on day @freq_interval={interval}: expected 1 to 31"
            if interval > 28:
                caveats.append(f"day {interval}: NCRONTAB runs only in months that have a day {interval}")
            return (str(interval), months, "*"), times, None, caveats
        ordinal = {1: 1, 2: 2, 4: 3, 8: 4}.get(relative)
        if interval == 8 and ordinal is not None:
            return (str(ordinal), months, "*"), times, None, caveats
        which = {1: "first", 2: "second", 4: "third", 8: "fourth", 16: "last"}.get(relative, f"#{relative}")
        what = DAY_NAMES[interval - 1] if 1 <= interval <= 7 else {8: "day", 9: "weekday", 10: "weekend day"}.get(
            interval, f"@freq_interval={interval}")
        return (f"the {which} {what} of the month (@freq_type=32): the agent's NCRONTAB has no L or #, and a day "
                "range with a day of the week means either one, not both")
    return f"@freq_type={freq_type}: expected 1, 4, 8, 16, 32, 64 or 128"


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _time_fields(times: set[int]) -> tuple[str, str, str] | None:
    """The (second, minute, hour) fields whose product is exactly these times of day, or None."""
    if not times:
        return None
    seconds = {t % 60 for t in times}
    minutes = {t // 60 % 60 for t in times}
    hours = {t // 3600 for t in times}
    if len(seconds) * len(minutes) * len(hours) != len(times):
        return None
    return _field(seconds, 60), _field(minutes, 60), _field(hours, 24)


def _field(values: set[int], size: int) -> str:
    ordered = sorted(values)
    if len(ordered) == size:
        return "*"
    if len(ordered) > 2:
        step = ordered[1] - ordered[0]
        if all(b - a == step for a, b in zip(ordered, ordered[1:])):
            if ordered[0] == 0 and ordered[-1] + step >= size and size % step == 0:
                return f"*/{step}"
            if step == 1:
                return f"{ordered[0]}-{ordered[-1]}"
            return f"{ordered[0]}-{ordered[-1]}/{step}"
    return ",".join(map(str, ordered))


def render_cron(days: tuple, times: set[int]) -> str:
    fields = _time_fields(times)
    assert fields is not None
    day, month, weekday = days
    return " ".join((*fields, day, month, weekday))


# ---------------------------------------------------------------- output and --apply


def report(converted: list[Converted], timezone: str) -> dict[str, Any]:
    settings: dict[str, str] = {}
    for item in converted:
        if item.emitted:
            settings.update(item.settings)
    return {"timezone": timezone, "settings": settings, "jobs": [item.as_json() for item in converted],
            "complete": all(item.emitted and not item.not_carried for item in converted)}


def apply_calls(converted: list[Converted]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The agent.add_scheduled_job arguments of the jobs one call expresses (a one-step job), and
    the jobs it cannot (steps, a retry interval), with the reason."""
    calls: list[dict[str, Any]] = []
    refused: list[dict[str, str]] = []
    for item in converted:
        if not item.emitted:
            continue
        if item.on_demand:
            refused.append({"job": item.job, "reason": "agent.add_scheduled_job needs @schedule or @run_at: an "
                            "on-demand job goes in the app settings printed here"})
        elif item.apply is None:
            refused.append({"job": item.job, "reason": "agent.add_scheduled_job takes one command: a job with "
                            "steps (or a step's retry interval) goes in the app settings printed here"})
        else:
            calls.append({k: v for k, v in item.apply.items() if v is not None})
    return calls, refused
