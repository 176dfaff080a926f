"""Import SQL Server Agent jobs: a T-SQL script that creates them (SSMS's "Script Job as ->
CREATE To", dbatools' exports, an installer such as Ola Hallengren's, or one written by hand)
turned into this agent's JOB__<name>__* and ALERT__<name>__* app settings (or agent.add_scheduled_job,
agent.set_job_steps and agent.add_alert calls: import-sqlagent --apply).

The script is run, not pattern-matched: shared/ops/sqlagent/ interprets it statement by
statement over a model of msdb (interpreter.py, msdb.py), so what comes out is what SQL Server
would have in msdb after running it. This module turns those jobs into settings. What cannot be
carried over exactly is listed, per job and property or for the script, never dropped silently.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any, Iterable

from shared.errors import ScriptError
from shared.engine.operations import add_alert_refusal
from shared.jobs.alert_definitions import KNOWN_SEVERITY, AlertDefinition, parse_alerts
from shared.jobs.from_settings import parse_jobs
from shared.jobs.schedules import pinned_once, schedule_from_sqlagent, validate_timezone
from shared.jobs.steps import STEP_JSON_FIELDS
from shared.ops.sqlagent import msdb as model
from shared.ops.sqlagent.interpreter import Finding, Interpreter
from shared.jobs.tokens import OLD_SYNTAX, RUN_TIME, replace_tokens, token_uses
from shared.ops.sqlagent.steps import split_batches
from shared.values import DATABASE_NAME_PATTERN

__all__ = ["ScriptError", "Converted", "ConvertedAlert", "Imported", "convert_script", "report", "apply_calls",
           "alert_apply_calls", "setting_name"]

SYSTEM_DATABASES = {"master", "msdb", "model", "tempdb"}
ACTIONS = {1: "quit_success", 2: "quit_failure", 3: "next"}
DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MAX_NAME = 64
SECONDS_PER_DAY = 86400
# Step properties whose value must be known to carry the step (an Unknown one is listed and the
# job is not emitted); the others (owner, category, description, flags...) are not carried anyway.
STEP_PROPERTIES = ("subsystem", "command", "database_name", "on_success_action", "on_success_step_id",
                   "on_fail_action", "on_fail_step_id", "retry_attempts", "retry_interval", "proxy_id", "proxy_name",
                   "database_user_name", "output_file_name", "server")
JOB_PROPERTIES = ("enabled", "start_step_id", "notify_level_eventlog", "notify_level_email", "notify_level_netsend",
                  "notify_level_page", "notify_email_operator_name", "notify_netsend_operator_name",
                  "notify_page_operator_name", "delete_level", "new_name")

# A step that starts another job (how SQL Agent chains jobs): EXEC [msdb.dbo.]sp_start_job (its
# return code assigned or not), with the job's name as a literal (@job_name = N'...' or the first
# argument; None for any other form, a variable or @job_id).
START_JOB = re.compile(r"\bEXEC(?:UTE)?\s+(?:@\w+\s*=\s*)?(?:\[?msdb\]?\s*\.\s*(?:\[?dbo\]?)?\s*\.\s*)?"
                       r"\[?sp_start_job\]?(?![\w$#@])(?:\s+(?:@job_name\s*=\s*)?N?'((?:[^']|'')*)')?", re.IGNORECASE)


@dataclass
class Converted:
    sql_agent_name: str
    job: str                                   # the JOB__<job>__ name
    settings: dict[str, str]                   # JOB__<job>__SETTING -> value
    emitted: bool                              # False: the job cannot run here as it ran in SQL Agent
    not_carried: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps: int = 0
    # agent.add_scheduled_job arguments (and "steps": agent.set_job_steps @steps, the JSON array
    # of the job's STEPS__<n>__* settings), None when the procedures cannot define the job
    apply: dict[str, Any] | None = None
    on_demand: bool = False                    # no SCHEDULE: run only when started

    def as_json(self) -> dict[str, Any]:
        return {"sql_agent_name": self.sql_agent_name, "job": self.job, "emitted": self.emitted,
                "settings": self.settings, "not_carried": self.not_carried, "notes": self.notes}


@dataclass
class ConvertedAlert:
    """One sp_add_alert as ALERT__<alert>__* settings (issue 32 item 3)."""
    sql_agent_name: str
    alert: str                                 # the ALERT__<alert>__ name
    settings: dict[str, str]
    emitted: bool
    not_carried: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"sql_agent_name": self.sql_agent_name, "alert": self.alert, "emitted": self.emitted,
                "settings": self.settings, "not_carried": self.not_carried, "notes": self.notes}


class Imported(list):
    """The jobs converted (one Converted per job, per schedule that could not share the job's),
    with what the scripts did that belongs to no job: not_carried (each a dict with source, line,
    what, reason), notes, and per script file its statistics."""

    def __init__(self, jobs=(), *, not_carried=None, notes=None, sources=None) -> None:
        super().__init__(jobs)
        self.not_carried: list[dict[str, Any]] = not_carried or []
        self.notes: list[str] = notes or []
        self.sources: list[dict[str, Any]] = sources or []
        self.alerts: list[ConvertedAlert] = []


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


def convert_script(texts: Iterable[tuple[str, str]], timezone: str = "UTC", *, today: date | None = None,
                   now: datetime | None = None) -> Imported:
    """(source, text) pairs, run in order over one msdb (a later script may change the jobs of
    an earlier one) -> the jobs as settings, and what was not carried. now: the moment the
    import stands for (a one-time schedule before it is past); default the current time in
    timezone (or the start of today)."""
    zone = validate_timezone(timezone)
    if now is None:
        now = datetime.combine(today, time()) if today is not None else datetime.now(zone).replace(tzinfo=None)
    msdb = model.Msdb(now.date())
    interpreter = Interpreter(msdb)
    sources = []
    for source, text in texts:
        stats = interpreter.run_file(text, source)
        sources.append({"file": source, "batches": stats.batches, "job_procedure_calls": stats.calls})
        if stats.batches == 0 or not text.strip():
            interpreter.findings.append(Finding(source, 1, source, "the file is empty (or only comments and GO): "
                                                "nothing to import"))
        elif stats.calls == 0:
            interpreter.findings.append(Finding(source, 1, source, "no call to msdb's job procedures (sp_add_job, "
                                                "sp_add_jobstep, ...) is run by this script: nothing to import"))
    msdb = interpreter.msdb
    by_job: dict[int, list[Finding]] = {}
    script_level: list[dict[str, Any]] = []
    for finding in interpreter.findings:
        if finding.job is not None and finding.job in msdb.jobs:
            by_job.setdefault(finding.job, []).append(finding)
        else:
            what = finding.what if finding.job_name is None or finding.job_name in finding.what \
                else f"job {finding.job_name!r}: {finding.what}"
            script_level.append({"source": finding.source, "line": finding.line, "what": what,
                                 "reason": finding.reason})
    notes = [f"{n.source}, line {n.line}: {n.what}: {n.reason}" for n in interpreter.notes]
    taken: set[str] = set()
    out = Imported(not_carried=script_level, notes=notes, sources=sources)
    for job in msdb.jobs.values():
        out.extend(_convert_job(job, msdb, by_job.get(job.key, []), timezone, now, taken))
    job_names = {}
    for item in out:
        if item.emitted:
            job_names.setdefault(item.sql_agent_name, item.job)
    alert_names: set[str] = set()
    for alert in msdb.alerts.values():
        out.alerts.append(_convert_alert(alert, msdb, job_names, alert_names))
    return out


def _convert_alert(alert: dict[str, Any], msdb: model.Msdb, job_names: dict[str, str],
                   taken: set[str]) -> ConvertedAlert:
    """sp_add_alert (+ sp_add_notification) as ALERT__<name>__*: @message_id becomes ERRORS=<n>,
    @severity (at most 16) ERRORS=severity>=<n>; @delay_between_responses, @enabled, @job_name
    (RESPONSE_JOB) and the operators notified (NOTIFY) carry over. A performance condition, a WMI
    event, a severity above 16, a database or keyword filter and a custom message do not: each is
    listed, and what cannot fire here is not emitted."""
    name = setting_name(alert["name"], taken)
    key = f"ALERT__{name}__"
    settings: dict[str, str] = {}
    missing: list[dict[str, Any]] = []
    notes: list[str] = []
    emitted = True

    def left_out(what: str, reason: str, *, block: bool = False) -> None:
        nonlocal emitted
        missing.append({"what": what, "reason": reason})
        emitted = emitted and not block

    if name != alert["name"]:
        notes.append(f"alert {alert['name']!r} is ALERT__{name}__* (setting names take letters, digits and '_')")
    for prop, reason in alert.get("unknown", {}).items():
        left_out(f"@{prop}", f"not known before the script runs ({reason})", block=True)
    message_id, severity = alert.get("message_id") or 0, alert.get("severity") or 0
    if alert.get("performance_condition"):
        left_out("@performance_condition", f"{alert['performance_condition']!r}: a performance counter alert has no "
                 "equivalent here; an ALERT__<name>__QUERY probe on sys.dm_os_performance_counters (or an Azure "
                 "Monitor metric alert) is the way", block=True)
    elif alert.get("wmi_query") or alert.get("wmi_namespace"):
        left_out("@wmi_query", "a WMI event alert has no equivalent here (Azure SQL has no WMI)", block=True)
    elif isinstance(message_id, int) and message_id > 0:
        settings[key + "ERRORS"] = str(message_id)
        notes.append(f"@message_id {message_id}: fires when a run of a job this agent runs fails with error "
                     f"{message_id}, not on every error the server raises or logs")
    elif isinstance(severity, int) and 0 < severity <= KNOWN_SEVERITY:
        settings[key + "ERRORS"] = f"severity>={severity}"
        left_out("@severity", f"severity {severity}: the drivers do not report an error's severity and the agent counts "
                 f"every failure as severity {KNOWN_SEVERITY}, so ERRORS=severity>={severity} fires on every failed run "
                 f"of its jobs (not on severity {severity} exactly, nor on errors outside its jobs)")
    elif isinstance(severity, int) and severity > KNOWN_SEVERITY:
        left_out("@severity", f"severity {severity} (resource and system errors): the agent cannot tell an error's "
                 f"severity above {KNOWN_SEVERITY}; use Azure Monitor's alerts on the database", block=True)
    else:
        left_out("@message_id / @severity", "the alert names no error number and no severity", block=True)
    if alert.get("database_name"):
        left_out("@database_name", f"{alert['database_name']!r}: the alert here watches the failures of every job, "
                 "in any database")
    if alert.get("event_description_keyword"):
        left_out("@event_description_keyword", f"{alert['event_description_keyword']!r}: the message text is not "
                 "filtered here")
    if alert.get("notification_message"):
        left_out("@notification_message", "a custom message: the notification's body is the agent's (it names the "
                 "alert and carries the failures)")
    if alert.get("enabled") == 0:
        settings[key + "ENABLED"] = "false"
    delay = alert.get("delay_between_responses")
    if isinstance(delay, int) and delay > 0:
        settings[key + "DELAY_BETWEEN_RESPONSES_SECONDS"] = str(min(delay, 31_536_000))
    else:
        settings[key + "DELAY_BETWEEN_RESPONSES_SECONDS"] = "0"
    job_key = alert.get("job_key")
    if job_key is not None:
        job = msdb.jobs.get(job_key)
        target = job_names.get(job.name) if job is not None else None
        if target is None:
            left_out("@job_name", f"the job it starts ({job.name if job else job_key!r}) is not carried itself")
        else:
            settings[key + "RESPONSE_JOB"] = target
    operators = [o for o in alert.get("operators", ()) if o]
    if operators:
        settings[key + "NOTIFY"] = "true"
        notes.append(f"operators {', '.join(operators)} (sp_add_notification): told through the agent's webhook or "
                     "Action Group (AGENT_NOTIFY_WEBHOOK_URL), not by e-mail or pager from here")
    elif key + "RESPONSE_JOB" in settings:
        settings[key + "NOTIFY"] = "false"
    else:
        settings[key + "NOTIFY"] = "true"
        notes.append("no operator and no job: SQL Server Agent only counted it; here it notifies (a response is needed)")
    return ConvertedAlert(sql_agent_name=alert["name"], alert=name, settings=settings if emitted else {},
                          emitted=emitted, not_carried=missing, notes=notes)


def _unknown(msdb: model.Msdb, kind: str, key: Any) -> dict[str, str]:
    return {prop: reason for (k, where, prop), reason in msdb.unknown.items() if k == kind and where == key}


def _convert_job(job: model.Job, msdb: model.Msdb, findings: list[Finding], timezone: str, now: datetime,
                 taken: set[str]) -> list[Converted]:
    name = setting_name(job.name, taken)
    missing: list[dict[str, Any]] = [{"what": f.what, "reason": f.reason, "source": f.source, "line": f.line}
                                     for f in findings]
    notes: list[str] = []
    blocked = False                 # something SQL Agent did that a job here would not: not emitted
    if name != job.name:
        notes.append(f"job {job.name!r} is JOB__{name}__* (setting names take letters, digits and '_')")

    def left_out(what: str, reason: str, *, block: bool = False) -> None:
        nonlocal blocked
        missing.append({"what": what, "reason": reason})
        blocked = blocked or block

    for prop, reason in _unknown(msdb, "job", job.key).items():
        if prop in JOB_PROPERTIES:
            left_out(f"@{prop}", f"not known before the script runs ({reason}): the job is not emitted", block=True)
    for what, reason in job.alerts:
        left_out(what, reason)
    if not job.servers:
        left_out("target server", "the job has no target server (sp_add_jobserver): SQL Server Agent does not run it "
                 "(on its schedule or by sp_start_job) until one is added; the job is not emitted", block=True)
    for server in job.servers:
        if server != model.LOCAL:
            left_out(f"target server {server!r}",
                     "a multi-server (MSX/TSX) target or this server under its name: the job runs where the agent's "
                     "settings are")

    notify_levels: set[int] = set()     # SQL Agent's 1 on success, 2 on failure, 3 on completion
    for kind in ("email", "netsend", "page"):
        level, operator = getattr(job, f"notify_level_{kind}"), getattr(job, f"notify_{kind}_operator_name")
        if isinstance(level, int) and level != 0 and operator:
            notify_levels.add(level)
            left_out(f"@notify_level_{kind}={level} to operator {operator!r}",
                     "operators are not carried: NOTIFY says when, give it a webhook (NOTIFY_WEBHOOK_URL or "
                     "AGENT_NOTIFY_WEBHOOK_URL, docs/steps.md#notifications)")
    if isinstance(job.notify_level_eventlog, int) and job.notify_level_eventlog != 0:
        left_out(f"@notify_level_eventlog={job.notify_level_eventlog}",
                 "there is no Windows event log: every run is in the history and in Application Insights"
                 + (" (2, on failure, is also sp_add_job's default when the parameter is not given)"
                    if job.notify_level_eventlog == 2 else ""))
    if isinstance(job.delete_level, int) and job.delete_level != 0:
        left_out(f"@delete_level={job.delete_level}", "jobs that delete themselves are not supported")

    prefix = f"JOB__{name}__"
    settings: dict[str, str] = {}

    # The steps SQL Agent runs: T-SQL ones, their tokens replaced, each batch (GO) a step here.
    @dataclass
    class Piece:
        origin: model.Step
        command: str
        database: str | None
        first: bool
        last: bool

    pieces: list[Piece] = []
    kept_steps: list[model.Step] = []
    for step in job.steps:
        label = f"step {step.step_id} ({step.step_name!r})"
        unknown = {p: r for p, r in _unknown(msdb, "step", (job.key, step.step_id)).items() if p in STEP_PROPERTIES}
        for prop, reason in unknown.items():
            left_out(f"{label} @{prop}", f"not known before the script runs ({reason}): the job is not emitted",
                     block=True)
        if unknown:
            # Kept as one step (the job is not emitted) so that the other steps keep their numbers.
            kept_steps.append(step)
            pieces.append(Piece(step, step.command if isinstance(step.command, str) else "", None, True, True))
            continue
        subsystem = str(step.subsystem or "TSQL")
        if subsystem.upper() != "TSQL":
            left_out(label, f"subsystem {subsystem}: only T-SQL steps run here (CmdExec, PowerShell, SSIS and the "
                            "replication/Analysis Services subsystems have no equivalent in Azure SQL)")
            continue
        if step.proxy is not None:
            left_out(f"{label} proxy {step.proxy!r}", "proxies are not carried: the step runs as the agent's job "
                                                      "principal")
        if step.database_user_name:
            left_out(f"{label} @database_user_name={step.database_user_name!r}",
                     "the step runs as the agent's job principal (AGENT_JOB_PRINCIPAL), not as another user")
        if step.output_file_name:
            left_out(f"{label} @output_file_name={step.output_file_name!r}",
                     "there is no file system: the step's output is kept in the history (history --output)")
        if not isinstance(step.command, str) or not step.command.strip():
            left_out(label, "no @command")
            continue
        # The SQL Agent job's and step's name and the step's number are fixed now (a step cut at GO
        # keeps its SQL Agent number); the run-time tokens are replaced when the step runs here.
        fixed = {"JOBNAME": job.name, "STEPNAME": str(step.step_name), "STEPID": str(step.step_id)}
        command, problems = replace_tokens(step.command, fixed, leave=set(RUN_TIME) - set(fixed))
        left_to_run = sorted({use.base for use in token_uses(command) if use.macro and use.base in RUN_TIME})
        for written, reason in problems:
            left_out(f"{label} token {written}", f"{reason}: the job is not emitted", block=True)
        used = {use.base for use in token_uses(step.command) if use.macro}
        for token, value in fixed.items():
            again = [use.text for use in token_uses(value) if use.macro]
            if token in used and again:
                # SQL Agent replaces once; pasted here, the value's own token would be replaced
                # again when the step runs (a name 'nightly $(ESCAPE_NONE(DATE))' became the date).
                left_out(f"{label} token $(…({token}))",
                         f"its value {value!r} holds {', '.join(again)}, which the agent would replace again "
                         "when the step runs (SQL Agent replaces tokens once): rename it, or write the name "
                         "into the step: the job is not emitted", block=True)
        for old in sorted(set(OLD_SYNTAX.findall(command))):
            notes.append(f"{label}: [{old}] is SQL Server 2000's token syntax; SQL Server Agent 2005 SP1 and later "
                         "run it as written, and so does this agent")
        if command != step.command:
            notes.append(f"{label}: tokens replaced as SQL Agent replaces them (the job's and step's name, the step's "
                         "number)")
        if left_to_run:
            notes.append(f"{label}: {', '.join(left_to_run)} replaced when the step runs, as SQL Agent replaces them "
                         "(docs/moving-from-sql-agent.md, Tokens)")
        started = START_JOB.search(command)
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
        split = split_batches(command)
        if split.problem is not None:
            left_out(f"{label} GO", f"SQL Agent runs the command batch by batch, in one session; {split.problem}: "
                                    "the job is not emitted", block=True)
            kept_steps.append(step)
            pieces.append(Piece(step, command, None, True, True))
            continue
        if len(split.batches) > 1:
            if isinstance(step.retry_attempts, int) and step.retry_attempts > 0:
                left_out(f"{label} GO with @retry_attempts={step.retry_attempts}",
                         "SQL Agent retries the whole command from its first batch; the batches are steps here and "
                         "a retry runs only the batch that failed: the job is not emitted", block=True)
            notes.append(f"{label}: its {len(split.batches)} batches (GO) are {len(split.batches)} steps here, run one "
                         "after another; a batch that fails ends the step as in SQL Agent (the batches after it do "
                         "not run)")
        kept_steps.append(step)
        for k, batch in enumerate(split.batches):
            pieces.append(Piece(step, batch.command, batch.database, k == 0, k == len(split.batches) - 1))

    first_piece = {id(p.origin): n + 1 for n, p in reversed(list(enumerate(pieces)))}
    step_numbers = {step.step_id: first_piece[id(step)] for step in kept_steps}
    if kept_steps and job.start_step_id != kept_steps[0].step_id:
        left_out(f"@start_step_id={job.start_step_id}",
                 f"a run starts at step 1 here; SQL Agent started at step {job.start_step_id}")
    moved = [f"{old}->{new}" for old, new in step_numbers.items() if old != new]
    if moved:
        notes.append("steps renumbered (steps left out, batches made steps): " + ", ".join(moved))

    def action(step: model.Step, which: str) -> str | None:
        code = step.on_success_action if which == "success" else step.on_fail_action
        if code in ACTIONS:
            return ACTIONS[code]
        if code == 4:
            target = step.on_success_step_id if which == "success" else step.on_fail_step_id
            if target in step_numbers:
                return f"goto:{step_numbers[target]}"
            left_out(f"step {step.step_id} @on_{which}_action=4",
                     f"goes to step {target}, which is not carried; the flow quits with failure instead")
            return "quit_failure"
        left_out(f"step {step.step_id} @on_{which}_action={code}", "unknown action; expected 1 to 4")
        return None

    apply: dict[str, Any] | None = {}
    one_step = len(pieces) == 1
    for number, piece in enumerate(pieces, start=1):
        step = piece.origin
        success = action(step, "success") if piece.last else "next"
        failure = action(step, "fail")
        attempts = (step.retry_attempts if isinstance(step.retry_attempts, int) else 0) + 1
        if attempts > 100:
            left_out(f"step {step.step_id} @retry_attempts={attempts - 1}", "at most 99 retries (MAX_ATTEMPTS 100)")
            attempts = 100
        attempts = max(attempts, 1)
        interval = max((step.retry_interval if isinstance(step.retry_interval, int) else 0) * 60, 0)
        if interval > SECONDS_PER_DAY:
            left_out(f"step {step.step_id} @retry_interval={interval // 60}", "at most 1440 minutes (one day)")
            interval = SECONDS_PER_DAY
        database = piece.database if piece.database is not None else step.database_name
        db_value = None
        if isinstance(database, str) and database.strip():
            default = " (sp_add_jobstep's default when @database_name is not given)" \
                if database == "master" and piece.database is None else ""
            if database.strip().lower() in SYSTEM_DATABASES:
                if piece.first or piece.database is not None:
                    left_out(f"step {step.step_id} @database_name={database!r}",
                             f"a system database{default}: the step runs in the control database instead (check it)")
            elif not DATABASE_NAME_PATTERN.match(database.strip()):
                if piece.first or piece.database is not None:
                    left_out(f"step {step.step_id} @database_name={database!r}",
                             "not a database name the agent accepts (1-128 letters, digits, '_' or '-'): "
                             "the step runs in the control database instead")
            else:
                db_value = database.strip()
        simple = one_step and success in ("quit_success", "next") and failure in ("quit_failure", "next") \
            and interval == 0
        if simple:
            settings[prefix + "COMMAND"] = piece.command
            settings[prefix + "MAX_ATTEMPTS"] = str(attempts)
            if db_value:
                settings[prefix + "DATABASE"] = db_value
            apply = {"sql": piece.command, "max_attempts": attempts, "database": db_value, "misfire": "skip"}
        else:
            apply = None
            sp = f"{prefix}STEPS__{number}__"
            settings[sp + "COMMAND"] = piece.command
            settings[sp + "MAX_ATTEMPTS"] = str(attempts)
            if interval:
                settings[sp + "RETRY_INTERVAL_SECONDS"] = str(interval)
            if db_value:
                settings[sp + "DATABASE"] = db_value
            if success:
                settings[sp + "ON_SUCCESS"] = success
            if failure:
                settings[sp + "ON_FAILURE"] = failure
    # Steps (several, or one with a flow or a retry interval one command cannot say): defined by
    # agent.add_scheduled_job, then given their steps by agent.set_job_steps (apply_calls), read
    # from the JOB__<name>__STEPS__<n>__* settings of the same job.
    with_steps = bool(pieces) and apply is None
    if not pieces:
        apply = None
    settings[prefix + "TIMEZONE"] = timezone
    # SQL Server Agent never runs a slot it missed (agent stopped, a one-time moment already
    # past when the job reaches the server): neither does the imported job.
    settings[prefix + "MISFIRE"] = "skip"
    if notify_levels:
        settings[prefix + "NOTIFY"] = ("on_completion" if 3 in notify_levels or {1, 2} <= notify_levels
                                       else "on_success" if 1 in notify_levels else "on_failure")
    enabled = job.enabled != 0
    settings[prefix + "ENABLED"] = "true" if enabled else "false"

    # Schedules: each becomes (day spec, times of day); schedules with the same day spec share one
    # NCRONTAB when their times together are still one; the others become jobs of their own.
    groups: list[tuple[tuple, set[int], list[str], str | None]] = []  # (days, times, names, once)
    schedules = msdb.schedules_of(job.key)
    for schedule in schedules:
        sharing = [msdb.jobs[j].name for j, s in msdb.attachments if s == schedule.schedule_id and j != job.key]
        if sharing:
            notes.append(f"schedule {schedule.name!r} is shared in SQL Agent with {', '.join(map(repr, sharing))}: "
                         "here each job has its own SCHEDULE (a change to one is not a change to the others)")
        unknown = _unknown(msdb, "schedule", schedule.schedule_id)
        if unknown:
            left_out(f"schedule {schedule.name!r}", "; ".join(f"@{p} is not known before the script runs ({r})"
                                                              for p, r in unknown.items()))
            continue
        result = schedule_to_parts(schedule, now)
        if isinstance(result, Unexpressible):
            # Beyond one NCRONTAB (every N days or weeks, the nth or last weekday, a time window
            # that is not one product of fields, start and end dates): the schedule grammar's
            # clauses say exactly what SQL Agent does, as a job of its own.
            try:
                expression = schedule_from_sqlagent(
                    freq_type=schedule.freq_type, freq_interval=schedule.freq_interval,
                    freq_subday_type=schedule.freq_subday_type or 1,
                    freq_subday_interval=schedule.freq_subday_interval,
                    freq_relative_interval=schedule.freq_relative_interval,
                    freq_recurrence_factor=schedule.freq_recurrence_factor,
                    active_start_date=schedule.active_start_date, active_end_date=schedule.active_end_date,
                    active_start_time=schedule.active_start_time, active_end_time=schedule.active_end_time,
                    today=now.date())
            except ValueError as exc:
                left_out(f"schedule {schedule.name!r}", str(exc))
                continue
            groups.append((("exact",), set(), [schedule.name], expression))
            continue
        if isinstance(result, str):
            left_out(f"schedule {schedule.name!r}", result)
            continue
        days, times, once = result
        if once is not None:
            pinned = pinned_once(once, timezone)
            if pinned != once:
                notes.append(f"schedule {schedule.name!r}: {once[len('@once '):]} happens twice or never in "
                             f"{timezone} (a daylight-saving change): carried as {pinned[len('@once '):]}, the "
                             "first time (a time the clocks jump over: as far after the jump)")
            groups.append((("once",), set(), [schedule.name], pinned))
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
                     "(run-now, agent.start_job)" + (" - its schedules are listed above" if schedules else ""))
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
        if apply is not None or with_steps:
            if with_steps:
                steps = settings_steps(job_settings, job_name)
                # The job's command is its first step's, as a settings job's is (what `jobs`
                # shows); job-level @max_attempts and @database stay at their defaults, the steps'
                # defaults as those of the settings job, which sets neither.
                job_apply = {"sql": steps[0]["sql"], "misfire": "skip",
                             "steps": json.dumps(steps, ensure_ascii=False)}
            else:
                job_apply = dict(apply)
            job_apply.update(name=job_name, timezone=timezone, enabled=1 if enabled else 0)
            if days == ("once",):
                job_apply["run_at"] = once[len("@once "):]
            else:
                job_apply["schedule"] = expression
        results.append(Converted(job.name, job_name, job_settings, True, [], [], len(pieces), job_apply))
    if not results:
        results.append(Converted(job.name, name, settings, True, [], [], len(pieces), None, on_demand=True))
    if not pieces:
        left_out("steps", "no T-SQL step to run: the job is not emitted", block=True)
    if blocked:
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


def _hhmmss(value: int) -> int:
    """HHMMSS (an int, as SQL Agent stores it, already checked by sp_verify_schedule) -> seconds
    since midnight."""
    return (value // 10000) * 3600 + (value // 100 % 100) * 60 + value % 100


def _yyyymmdd(value: int) -> date:
    return date(value // 10000, value // 100 % 100, value % 100)


@dataclass(frozen=True)
class Unexpressible:
    """A schedule one NCRONTAB cannot say, which schedule_from_sqlagent may (with clauses)."""
    reason: str


def schedule_to_parts(schedule: model.Schedule, now: datetime):
    """(day spec, set of seconds-of-day, '@once ...' or None) when one NCRONTAB says
    exactly what SQL Agent does (several such schedules of a job can share one); Unexpressible
    when only the schedule grammar's clauses can; a reason (str) when nothing here runs it. The
    schedule's values are those msdb stores (sp_verify_schedule filled the defaults in)."""
    today = now.date()
    if schedule.enabled == 0:
        return "disabled in SQL Agent: not carried (enable it there first, or add it by hand)"
    freq_type = schedule.freq_type
    interval = schedule.freq_interval
    subday_type = schedule.freq_subday_type or 1
    subday_interval = schedule.freq_subday_interval
    relative = schedule.freq_relative_interval
    factor = schedule.freq_recurrence_factor
    start_time = _hhmmss(schedule.active_start_time)
    end_time = _hhmmss(schedule.active_end_time)
    start_date = _yyyymmdd(schedule.active_start_date)
    end_date = _yyyymmdd(schedule.active_end_date)
    if freq_type == 64:
        return "@freq_type=64 (when SQL Server Agent starts): there is no such event here"
    if freq_type == 128:
        return "@freq_type=128 (when the CPU is idle): there is no such event here"
    if freq_type == 1:
        moment = datetime.combine(start_date, time()) + timedelta(seconds=start_time)
        if moment <= now:
            return (f"@freq_type=1 (once) on {moment.isoformat()}: already past (the import stands for "
                    f"{now.replace(microsecond=0).isoformat()}), SQL Agent will not run it again")
        return ("once",), set(), f"@once {moment.isoformat()}"
    if end_date < date(9999, 12, 31):
        if end_date < today:
            return f"@active_end_date={end_date:%Y%m%d} is past: the schedule has ended"
        return Unexpressible(f"@active_end_date={end_date:%Y%m%d}: an end date")
    if start_date > today:
        return Unexpressible(f"@active_start_date={start_date:%Y%m%d}: a start date in the future")

    # Times of day.
    if subday_type == 1:
        times = {start_time}
    else:
        step = subday_interval * {2: 1, 4: 60, 8: 3600}[subday_type]
        if end_time < start_time:
            return Unexpressible(f"@active_start_time={schedule.active_start_time} after @active_end_time="
                                 f"{schedule.active_end_time} (a window across midnight)")
        times = set(range(start_time, end_time + 1, step))
    if _time_fields(times) is None:
        unit = {2: "second(s)", 4: "minute(s)", 8: "hour(s)"}.get(subday_type, "")
        return Unexpressible(f"every {subday_interval} {unit} from {_clock(start_time)} to {_clock(end_time)}")

    # Days.
    if freq_type == 4:
        if interval > 1:
            return Unexpressible(f"every {interval} days (@freq_interval={interval})")
        return ("*", "*", "*"), times, None
    if freq_type == 8:
        if factor > 1:
            return Unexpressible(f"every {factor} weeks (@freq_recurrence_factor={factor})")
        days = [str(k) for k in range(7) if interval & (1 << k)]
        return ("*", "*", ",".join(days)), times, None
    # Monthly (16) and monthly relative (32).
    months = "*"
    if factor > 1:
        if 12 % factor:
            return Unexpressible(f"every {factor} months (@freq_recurrence_factor={factor})")
        day_of_month = interval if freq_type == 16 else {1: 1, 2: 2, 4: 3, 8: 4}.get(relative, 1)
        # SQL Agent's first run is the first such day on or after @active_start_date; then every N months.
        first = start_date.month if day_of_month >= start_date.day else start_date.month % 12 + 1
        months = ",".join(str(m) for m in sorted((first - 1 + k * factor) % 12 + 1 for k in range(12 // factor)))
    if freq_type == 16:
        return (str(interval), months, "*"), times, None
    ordinal = {1: 1, 2: 2, 4: 3, 8: 4}.get(relative)
    if interval == 8 and ordinal is not None:
        return (str(ordinal), months, "*"), times, None
    which = {1: "first", 2: "second", 4: "third", 8: "fourth", 16: "last"}.get(relative, f"#{relative}")
    what = DAY_NAMES[interval - 1] if 1 <= interval <= 7 else {8: "day", 9: "weekday", 10: "weekend day"}.get(
        interval, f"@freq_interval={interval}")
    return Unexpressible(f"the {which} {what} of the month (@freq_type=32)")


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
    # Hours never as */n: the engine runs an hour field of * or */n in both passes of the hour the
    # fall-back repeats (the every-hour rule), and SQL Agent runs "every 2 hours" once there (an
    # attack: 0 0 */2 * * * ran twice at 02:00 in Europe/Paris); 0-22/2 runs once.
    return _field(seconds, 60), _field(minutes, 60), _field(hours, 24, every=False)


def _field(values: set[int], size: int, *, every: bool = True) -> str:
    ordered = sorted(values)
    if len(ordered) == size:
        return "*"
    if len(ordered) > 2:
        step = ordered[1] - ordered[0]
        if all(b - a == step for a, b in zip(ordered, ordered[1:])):
            if every and ordered[0] == 0 and ordered[-1] + step >= size and size % step == 0:
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
    alerts = list(getattr(converted, "alerts", []))
    for alert in alerts:
        if alert.emitted:
            settings.update(alert.settings)
    not_carried = list(getattr(converted, "not_carried", []))
    return {"timezone": timezone, "settings": settings, "jobs": [item.as_json() for item in converted],
            "alerts": [alert.as_json() for alert in alerts],
            "not_carried": not_carried, "notes": list(getattr(converted, "notes", [])),
            "sources": list(getattr(converted, "sources", [])),
            "complete": (bool(converted) or bool(alerts)) and not not_carried
            and all(item.emitted and not item.not_carried for item in converted)
            and all(alert.emitted and not alert.not_carried for alert in alerts)}


# The JSON fields of agent.set_job_steps @steps by the settings' suffix (sql: COMMAND), and those
# that are whole numbers (written as JSON numbers; a string of digits means the same).
_STEP_FIELDS = {suffix: field for field, suffix in STEP_JSON_FIELDS.items()}
_STEP_NUMBERS = {"MAX_ATTEMPTS", "RETRY_INTERVAL_SECONDS", "TIMEOUT_SECONDS", "TARGET_PARALLELISM",
                 "TARGET_STAGGER_SECONDS"}
MAX_STEPS_JSON = 1000000       # agent.set_job_steps @steps: at most this many characters


def settings_steps(settings: dict[str, str], job: str) -> list[dict[str, Any]]:
    """A job's JOB__<job>__STEPS__<n>__* settings as agent.set_job_steps @steps' objects, in step
    order: each setting its field (docs/tsql.md, Steps from T-SQL), its value as the setting says."""
    prefix = f"JOB__{job}__STEPS__"
    by_number: dict[int, dict[str, Any]] = {}
    for key, value in settings.items():
        if not key.startswith(prefix):
            continue
        number, suffix = key[len(prefix):].split("__", 1)
        by_number.setdefault(int(number), {})[_STEP_FIELDS[suffix]] = (
            int(value) if suffix in _STEP_NUMBERS and value.isascii() and value.isdigit() else value)
    return [by_number[number] for number in sorted(by_number)]


def apply_calls(converted: list[Converted]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The agent.add_scheduled_job arguments of the jobs the procedures express: a one-step job,
    or a job with steps (or a step's retry interval), whose "steps" are agent.set_job_steps @steps,
    the JSON array of its STEPS__<n>__* settings; and the jobs they cannot, with the reason."""
    calls: list[dict[str, Any]] = []
    refused: list[dict[str, str]] = []
    for item in converted:
        if not item.emitted:
            continue
        if item.on_demand:
            refused.append({"job": item.job, "reason": "agent.add_scheduled_job needs @schedule or @run_at: an "
                            "on-demand job goes in the app settings printed here"})
        elif item.apply is None:
            refused.append({"job": item.job, "reason": "agent.add_scheduled_job and agent.set_job_steps cannot "
                            "define this job: it goes in the app settings printed here"})
        elif len(item.apply.get("steps") or "") > MAX_STEPS_JSON:
            refused.append({"job": item.job, "reason": f"its steps are {len(item.apply['steps'])} characters of "
                            f"JSON, and agent.set_job_steps takes at most {MAX_STEPS_JSON}: the job goes in the app "
                            "settings printed here"})
        else:
            calls.append({k: v for k, v in item.apply.items() if v is not None})
            # What the procedures have no parameter for is said, not dropped: the job is defined
            # without it, and the exit code says the import is not complete.
            notify = item.settings.get(f"JOB__{item.job}__NOTIFY")
            if notify:
                refused.append({"job": item.job, "reason": f"defined without JOB__{item.job}__NOTIFY={notify} (its "
                                "SQL Agent notification): agent.add_scheduled_job has no @notify, so no outcome of "
                                "this job is sent to the webhook; to have them sent, define it in the app settings "
                                "printed here instead"})
    return calls, refused


def alert_apply_calls(alerts: Iterable[ConvertedAlert], jobs_defined: Iterable[str]) -> tuple[
        list[AlertDefinition], list[dict[str, str]]]:
    """The alerts agent.add_alert defines as their ALERT__<name>__* settings say (read by the
    engine's own parser, so that the procedure gets what the settings would give the tick), and
    those it cannot, with the reason: a webhook of the alert's own (the procedure has no such
    parameter), or a response job that this --apply does not define (its job goes in the app
    settings: the alert would start a job that is not there, so it goes there with it). An
    alert is applied whole or not at all: never without its response."""
    defined = {name.casefold() for name in jobs_defined}
    calls: list[AlertDefinition] = []
    refused: list[dict[str, str]] = []
    for item in alerts:
        if not item.emitted:
            continue            # listed in its not_carried: neither in the settings nor applied
        valid, invalid = parse_alerts(item.settings)
        if invalid or len(valid) != 1:
            refused.append({"alert": item.alert, "reason": "the agent refuses the converted settings: "
                            + "; ".join(bad.message for bad in invalid)})
            continue
        (definition,) = valid
        reason = add_alert_refusal(definition)
        if reason is None and definition.response_job and definition.response_job.casefold() not in defined:
            reason = (f"its response starts job {definition.response_job!r}, which --apply does not define (it is "
                      "listed here with why): the alert goes in the app settings printed here, with its job")
        if reason is not None:
            refused.append({"alert": item.alert, "reason": reason})
        else:
            calls.append(definition)
    return calls, refused
