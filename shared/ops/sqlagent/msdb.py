"""A model of msdb's job tables and of the procedures that change them, as SQL Server's own
code (msdb's sp_add_job, sp_verify_job, sp_verify_schedule, ...) does it: the same parameters
and defaults, the same checks (a call SQL Server refuses changes nothing and returns 1, with
SQL Server's error number), the same renumbering of steps, the same "a NULL parameter leaves
the value as it is" of the sp_update_* procedures.

What the model cannot know (the server's databases, logins, operators, categories, proxies) is
taken to exist: the script ran on a server where it did. msdb starts with none of the script's
jobs, as on the server the jobs move to.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Callable

from shared.ops.sqlagent.values import (
    NVARCHAR_MAX, SYSNAME, SqlFailure, SqlType, Unknown, Value, convert, text_key)

INT = SqlType("int")
TINYINT = SqlType("tinyint")
BIT = SqlType("bit")
GUID = SqlType("uniqueidentifier")
REQUIRED = object()             # a parameter without a default
SUBSYSTEMS = {"ACTIVESCRIPTING", "CMDEXEC", "DISTRIBUTION", "SNAPSHOT", "LOGREADER", "MERGE", "QUEUEREADER",
              "ANALYSISQUERY", "ANALYSISCOMMAND", "SSIS", "POWERSHELL", "TSQL"}
LOCAL = "(local)"


@dataclass(frozen=True)
class Param:
    name: str                   # lower case, no @
    type: SqlType
    default: Any = None         # REQUIRED: no default
    output: bool = False


def _params(*spec: tuple) -> tuple[Param, ...]:
    return tuple(Param(*item) for item in spec)


def _nv(length: int | None) -> SqlType:
    return SqlType("nvarchar", length)


# The signatures, in SQL Server's order (positional arguments follow it).
SIGNATURES: dict[str, tuple[Param, ...]] = {
    "sp_add_job": _params(
        ("job_name", SYSNAME, REQUIRED), ("enabled", TINYINT, 1), ("description", _nv(512)), ("start_step_id", INT, 1),
        ("category_name", SYSNAME), ("category_id", INT), ("owner_login_name", SYSNAME),
        ("notify_level_eventlog", INT, 2), ("notify_level_email", INT, 0), ("notify_level_netsend", INT, 0),
        ("notify_level_page", INT, 0), ("notify_email_operator_name", SYSNAME),
        ("notify_netsend_operator_name", SYSNAME), ("notify_page_operator_name", SYSNAME), ("delete_level", INT, 0),
        ("job_id", GUID, None, True), ("originating_server", SYSNAME)),
    "sp_update_job": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("new_name", SYSNAME), ("enabled", TINYINT), ("description", _nv(512)),
        ("start_step_id", INT), ("category_name", SYSNAME), ("owner_login_name", SYSNAME),
        ("notify_level_eventlog", INT), ("notify_level_email", INT), ("notify_level_netsend", INT),
        ("notify_level_page", INT), ("notify_email_operator_name", SYSNAME), ("notify_netsend_operator_name", SYSNAME),
        ("notify_page_operator_name", SYSNAME), ("delete_level", INT), ("automatic_post", BIT, 1)),
    "sp_delete_job": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("originating_server", SYSNAME), ("delete_history", BIT, 1),
        ("delete_unused_schedule", BIT, 1)),
    "sp_add_jobstep": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("step_id", INT), ("step_name", SYSNAME, REQUIRED),
        ("subsystem", _nv(40), "TSQL"), ("command", NVARCHAR_MAX), ("additional_parameters", NVARCHAR_MAX),
        ("cmdexec_success_code", INT, 0), ("on_success_action", TINYINT, 1), ("on_success_step_id", INT, 0),
        ("on_fail_action", TINYINT, 2), ("on_fail_step_id", INT, 0), ("server", SYSNAME), ("database_name", SYSNAME),
        ("database_user_name", SYSNAME), ("retry_attempts", INT, 0), ("retry_interval", INT, 0),
        ("os_run_priority", INT, 0), ("output_file_name", _nv(200)), ("flags", INT, 0), ("proxy_id", INT),
        ("proxy_name", SYSNAME), ("step_uid", GUID, None, True)),
    "sp_update_jobstep": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("step_id", INT, REQUIRED), ("step_name", SYSNAME),
        ("subsystem", _nv(40)), ("command", NVARCHAR_MAX), ("additional_parameters", NVARCHAR_MAX),
        ("cmdexec_success_code", INT), ("on_success_action", TINYINT), ("on_success_step_id", INT),
        ("on_fail_action", TINYINT), ("on_fail_step_id", INT), ("server", SYSNAME), ("database_name", SYSNAME),
        ("database_user_name", SYSNAME), ("retry_attempts", INT), ("retry_interval", INT), ("os_run_priority", INT),
        ("output_file_name", _nv(200)), ("flags", INT), ("proxy_id", INT), ("proxy_name", SYSNAME)),
    "sp_delete_jobstep": _params(("job_id", GUID), ("job_name", SYSNAME), ("step_id", INT, REQUIRED)),
    "sp_add_schedule": _params(
        ("schedule_name", SYSNAME, REQUIRED), ("enabled", TINYINT, 1), ("freq_type", INT, 0), ("freq_interval", INT, 0),
        ("freq_subday_type", INT, 0), ("freq_subday_interval", INT, 0), ("freq_relative_interval", INT, 0),
        ("freq_recurrence_factor", INT, 0), ("active_start_date", INT), ("active_end_date", INT, 99991231),
        ("active_start_time", INT, 0), ("active_end_time", INT, 235959), ("owner_login_name", SYSNAME),
        ("schedule_uid", GUID, None, True), ("schedule_id", INT, None, True), ("originating_server", SYSNAME)),
    "sp_add_jobschedule": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("name", SYSNAME, REQUIRED), ("enabled", TINYINT, 1),
        ("freq_type", INT, 1), ("freq_interval", INT, 0), ("freq_subday_type", INT, 0), ("freq_subday_interval", INT, 0),
        ("freq_relative_interval", INT, 0), ("freq_recurrence_factor", INT, 0), ("active_start_date", INT),
        ("active_end_date", INT, 99991231), ("active_start_time", INT, 0), ("active_end_time", INT, 235959),
        ("schedule_id", INT, None, True), ("automatic_post", BIT, 1), ("schedule_uid", GUID, None, True)),
    "sp_attach_schedule": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("schedule_id", INT), ("schedule_name", SYSNAME),
        ("automatic_post", BIT, 1)),
    "sp_detach_schedule": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("schedule_id", INT), ("schedule_name", SYSNAME),
        ("delete_unused_schedule", BIT, 0), ("automatic_post", BIT, 1)),
    "sp_update_schedule": _params(
        ("schedule_id", INT), ("name", SYSNAME), ("new_name", SYSNAME), ("enabled", TINYINT), ("freq_type", INT),
        ("freq_interval", INT), ("freq_subday_type", INT), ("freq_subday_interval", INT),
        ("freq_relative_interval", INT), ("freq_recurrence_factor", INT), ("active_start_date", INT),
        ("active_end_date", INT), ("active_start_time", INT), ("active_end_time", INT), ("owner_login_name", SYSNAME),
        ("automatic_post", BIT, 1)),
    "sp_update_jobschedule": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("name", SYSNAME, REQUIRED), ("new_name", SYSNAME),
        ("enabled", TINYINT), ("freq_type", INT), ("freq_interval", INT), ("freq_subday_type", INT),
        ("freq_subday_interval", INT), ("freq_relative_interval", INT), ("freq_recurrence_factor", INT),
        ("active_start_date", INT), ("active_end_date", INT), ("active_start_time", INT), ("active_end_time", INT),
        ("automatic_post", BIT, 1)),
    "sp_delete_schedule": _params(
        ("schedule_id", INT), ("schedule_name", SYSNAME), ("force_delete", BIT, 0), ("automatic_post", BIT, 1)),
    "sp_delete_jobschedule": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("name", SYSNAME, REQUIRED), ("keep_schedule", INT, 0),
        ("automatic_post", BIT, 1)),
    "sp_add_jobserver": _params(
        ("job_id", GUID), ("job_name", SYSNAME), ("server_name", SYSNAME), ("automatic_post", BIT, 1)),
    "sp_delete_jobserver": _params(("job_id", GUID), ("job_name", SYSNAME), ("server_name", SYSNAME, REQUIRED)),
    "sp_add_notification": _params(
        ("alert_name", SYSNAME, REQUIRED), ("operator_name", SYSNAME, REQUIRED), ("notification_method", TINYINT, REQUIRED)),
    "sp_delete_notification": _params(("alert_name", SYSNAME, REQUIRED), ("operator_name", SYSNAME, REQUIRED)),
    "sp_delete_alert": _params(("name", SYSNAME, REQUIRED)),
    "sp_add_alert": _params(
        ("name", SYSNAME, REQUIRED), ("message_id", INT, 0), ("severity", INT, 0), ("enabled", TINYINT, 1),
        ("delay_between_responses", INT, 0), ("notification_message", _nv(512)),
        ("include_event_description_in", TINYINT, 5), ("database_name", SYSNAME), ("event_description_keyword", _nv(100)),
        ("job_id", GUID), ("job_name", SYSNAME), ("raise_snmp_trap", TINYINT, 0), ("performance_condition", _nv(512)),
        ("category_name", SYSNAME), ("wmi_namespace", SYSNAME), ("wmi_query", _nv(512))),
    "sp_update_alert": _params(
        ("name", SYSNAME, REQUIRED), ("new_name", SYSNAME), ("enabled", TINYINT), ("message_id", INT), ("severity", INT),
        ("delay_between_responses", INT), ("notification_message", _nv(512)), ("include_event_description_in", TINYINT),
        ("database_name", SYSNAME), ("event_description_keyword", _nv(100)), ("job_id", GUID), ("job_name", SYSNAME),
        ("occurrence_count", INT), ("count_reset_date", INT), ("count_reset_time", INT), ("last_occurrence_date", INT),
        ("last_occurrence_time", INT), ("last_response_date", INT), ("last_response_time", INT),
        ("raise_snmp_trap", TINYINT), ("performance_condition", _nv(512)), ("category_name", SYSNAME),
        ("wmi_namespace", SYSNAME), ("wmi_query", _nv(512))),
}

# msdb procedures that change no job (or only things the agent has no equivalent of, listed
# elsewhere): calls to them succeed and change nothing here.
HARMLESS = {
    "sp_add_category", "sp_update_category", "sp_delete_category", "sp_add_operator", "sp_update_operator",
    "sp_delete_operator", "sp_update_notification", "sp_add_proxy", "sp_update_proxy", "sp_delete_proxy", "sp_grant_proxy_to_subsystem",
    "sp_grant_login_to_proxy", "sp_revoke_login_from_proxy", "sp_revoke_proxy_from_subsystem", "sp_send_dbmail",
    "sp_purge_jobhistory", "sp_delete_backuphistory", "sp_delete_database_backuphistory", "sp_cycle_agent_errorlog",
    "sp_set_sqlagent_properties", "sp_stop_job", "sp_start_job", "sp_executesql", "sp_addrolemember",
    "sp_droprolemember", "sp_addextendedproperty", "sp_updateextendedproperty", "sp_dropextendedproperty",
    "sp_configure", "sp_add_targetservergroup", "sp_update_targetservergroup", "sp_delete_targetservergroup",
    "sp_add_targetsvrgrp_member", "sp_delete_targetsvrgrp_member", "sp_delete_jobsteplog", "sp_rename",
}
# msdb procedures that create or change jobs in ways this model does not follow.
NOT_FOLLOWED = {
    "sp_apply_job_to_targets": "it assigns the job to target servers (multi-server administration)",
    "sp_remove_job_from_targets": "it removes the job from target servers (multi-server administration)",
    "sp_add_maintenance_plan_job": "it ties a job to a database maintenance plan",
    "sp_delete_maintenance_plan_job": "it unties a job from a database maintenance plan",
    "sp_msx_enlist": "it enlists the server in multi-server administration",
    "sp_msx_defect": "it takes the server out of multi-server administration",
    "sp_post_msx_operation": "it posts job changes to target servers",
    "sp_resync_targetserver": "it posts job changes to target servers",
    "sp_add_log_shipping_primary_database": "log shipping creates its own jobs",
    "sp_add_log_shipping_secondary_primary": "log shipping creates its own jobs",
    "sp_add_log_shipping_secondary_database": "log shipping creates its own jobs",
    "sp_add_log_shipping_alert_job": "log shipping creates its own jobs",
    "sp_add_log_shipping_monitor_jobs": "log shipping creates its own jobs",
    "sp_addpublication": "replication creates its own jobs",
    "sp_addpublication_snapshot": "replication creates its own jobs",
    "sp_addsubscription": "replication creates its own jobs",
    "sp_addpushsubscription_agent": "replication creates its own jobs",
    "sp_addpullsubscription_agent": "replication creates its own jobs",
    "sp_addlogreader_agent": "replication creates its own jobs",
    "sp_addmergepublication": "replication creates its own jobs",
    "sp_addmergesubscription": "replication creates its own jobs",
    "sp_addmergepushsubscription_agent": "replication creates its own jobs",
    "sp_addmergepullsubscription_agent": "replication creates its own jobs",
    "sp_adddistributor": "replication creates its own jobs",
    "sp_adddistributiondb": "replication creates its own jobs",
    "sp_addqreader_agent": "replication creates its own jobs",
}


@dataclass
class Step:
    step_id: int
    step_name: Value
    subsystem: Value = "TSQL"
    command: Value = None
    cmdexec_success_code: Value = 0
    on_success_action: Value = 1
    on_success_step_id: Value = 0
    on_fail_action: Value = 2
    on_fail_step_id: Value = 0
    server: Value = None
    database_name: Value = "master"
    database_user_name: Value = None
    retry_attempts: Value = 0
    retry_interval: Value = 0
    os_run_priority: Value = 0
    output_file_name: Value = None
    flags: Value = 0
    proxy: Value = None
    line: int = 0


@dataclass
class Job:
    key: int                            # the model's own identity (names change)
    job_id: uuid.UUID
    name: str
    enabled: Value = 1
    description: Value = None
    start_step_id: Value = 1
    category_name: Value = None
    owner_login_name: Value = None
    notify_level_eventlog: Value = 2
    notify_level_email: Value = 0
    notify_level_netsend: Value = 0
    notify_level_page: Value = 0
    notify_email_operator_name: Value = None
    notify_netsend_operator_name: Value = None
    notify_page_operator_name: Value = None
    delete_level: Value = 0
    steps: list[Step] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)      # LOCAL or a server's name
    alerts: list[tuple[str, str]] = field(default_factory=list)   # (what, reason) listed with the job
    source: str = ""
    line: int = 0


SCHEDULE_FIELDS = ("enabled", "freq_type", "freq_interval", "freq_subday_type", "freq_subday_interval",
                   "freq_relative_interval", "freq_recurrence_factor", "active_start_date", "active_end_date",
                   "active_start_time", "active_end_time")


@dataclass
class Schedule:
    schedule_id: int
    uid: uuid.UUID
    name: str
    enabled: Value = 1
    freq_type: Value = 0
    freq_interval: Value = 0
    freq_subday_type: Value = 0
    freq_subday_interval: Value = 0
    freq_relative_interval: Value = 0
    freq_recurrence_factor: Value = 0
    active_start_date: Value = None
    active_end_date: Value = 99991231
    active_start_time: Value = 0
    active_end_time: Value = 235959
    line: int = 0


class Refused(Exception):
    """The procedure refuses the call (RAISERROR then RETURN(1)): SQL Server's error number
    and message. severity 0 is an informational message (RETURN(1) without an error)."""

    def __init__(self, number: int, message: str, severity: int = 16) -> None:
        super().__init__(message)
        self.number = number
        self.message = message
        self.severity = severity


class NotFollowed(Exception):
    """The call depends on a value known only at run time (which job, which schedule): the
    model cannot apply it. reason says which argument and why."""


@dataclass
class Outcome:
    return_code: int = 0
    error: int = 0                  # @@ERROR after the call
    message: str | None = None      # what SQL Server says when it refuses
    outputs: dict[str, Value] = field(default_factory=dict)
    job_key: int | None = None      # the job the call concerns, when it names one
    not_followed: str | None = None


class Msdb:
    """msdb's jobs, steps, schedules, their attachments and target servers."""

    def __init__(self, today: date) -> None:
        self.jobs: dict[int, Job] = {}
        self.schedules: dict[int, Schedule] = {}
        self.attachments: list[tuple[int, int]] = []        # (job key, schedule_id), in attach order
        self.unknown: dict[tuple, str] = {}                 # (kind, key, property) -> reason
        self.today = today
        self._next_key = 1
        self._next_schedule = 1
        self._owned: set[tuple[str, int]] = set()   # objects this model may change in place
        self.touched_jobs: set[int] = set()          # since this copy was made: for comparing copies
        self.touched_schedules: set[int] = set()
        self.by_id: dict[uuid.UUID, int] = {}        # job_id -> key
        self.by_name: dict[str, int] = {}            # text_key(name) -> key
        self.by_uid: dict[uuid.UUID, int] = {}       # schedule_uid -> schedule_id
        # sp_add_alert's alerts (issue 32 item 3), by text_key(name): each a dict replaced, never
        # changed in place (copies share them); "operators": the operators sp_add_notification named.
        self.alerts: dict[str, dict] = {}

    def copy(self) -> "Msdb":
        """A copy that shares the jobs and schedules until one of the two changes them (the
        interpreter copies the model for every transaction and every IF it cannot decide)."""
        other = Msdb.__new__(Msdb)
        other.jobs, other.schedules = dict(self.jobs), dict(self.schedules)
        other.attachments, other.unknown = list(self.attachments), dict(self.unknown)
        other.by_id, other.by_name, other.by_uid = dict(self.by_id), dict(self.by_name), dict(self.by_uid)
        other.alerts = dict(self.alerts)
        other.today, other._next_key, other._next_schedule = self.today, self._next_key, self._next_schedule
        other._owned = set()
        other.touched_jobs, other.touched_schedules = set(), set()
        self._owned = set()
        return other

    def _own_job(self, job: Job) -> Job:
        self.touched_jobs.add(job.key)
        if ("job", job.key) not in self._owned:
            job = copy.deepcopy(job)
            self.jobs[job.key] = job
            self._owned.add(("job", job.key))
        return job

    def _own_schedule(self, schedule: Schedule) -> Schedule:
        self.touched_schedules.add(schedule.schedule_id)
        if ("schedule", schedule.schedule_id) not in self._owned:
            schedule = copy.deepcopy(schedule)
            self.schedules[schedule.schedule_id] = schedule
            self._owned.add(("schedule", schedule.schedule_id))
        return schedule

    def job_view(self, key: int) -> tuple:
        """What the import of one job depends on: it, its schedules and what is unknown of them
        (two models agree on a job when these are equal)."""
        job = self.jobs.get(key)
        if job is None:
            return ()
        schedules = tuple(self.schedules[s] for j, s in self.attachments if j == key)
        unknown = tuple(sorted((k, v) for k, v in self.unknown.items()
                               if (k[0] == "job" and k[1] == key)
                               or (k[0] == "schedule" and any(k[1] == s.schedule_id for s in schedules))))
        return job, schedules, unknown

    def schedules_of(self, key: int) -> list[Schedule]:
        return [self.schedules[s] for j, s in self.attachments if j == key]

    # ---------------------------------------------------------------- calls

    def call(self, procedure: str, arguments: dict[str, Value]) -> Outcome:
        """One call of an msdb procedure whose arguments are bound and converted to its
        parameters' types (every parameter present: its default when not given)."""
        handler: Callable = getattr(self, "_" + procedure)
        outcome = Outcome()
        unknown = {name: value.reason for name, value in arguments.items() if isinstance(value, Unknown)}
        try:
            handler(arguments, outcome, unknown)
        except Refused as refused:
            outcome.return_code = 1
            outcome.error = refused.number if refused.severity > 10 else 0
            outcome.message = f"error {refused.number}: {refused.message}"
            outcome.outputs = {}
        except NotFollowed as why:
            outcome.not_followed = str(why)
            outcome.outputs = {}
        except SqlFailure as failure:
            outcome.return_code = 1
            outcome.error = failure.number
            outcome.message = f"error {failure.number}: {failure.message}"
            outcome.outputs = {}
        return outcome

    # ---------------------------------------------------------------- identifying things

    def _job(self, arguments: dict[str, Value], outcome: Outcome) -> Job:
        """sp_verify_job_identifiers: exactly one of @job_id and @job_name, naming a job."""
        job_id, job_name = arguments.get("job_id"), arguments.get("job_name")
        for name, value in (("@job_id", job_id), ("@job_name", job_name)):
            if isinstance(value, Unknown):
                raise NotFollowed(f"{name} is not known before the script runs ({value.reason})")
        if isinstance(job_name, str):
            job_name = job_name.strip(" ") or None
        if (job_id is None) == (job_name is None):
            raise Refused(14294, "Supply either @job_id or @job_name to identify the job.")
        if job_id is not None:
            found = self.jobs.get(self.by_id.get(job_id, 0))
            if found is None:
                raise Refused(14262, f"The specified @job_id ('{str(job_id).upper()}') does not exist (no job "
                                     "of this import has it).")
        else:
            found = self.jobs.get(self.by_name.get(text_key(job_name), 0))
            if found is None:
                raise Refused(14262, f"The specified @job_name ('{job_name}') does not exist (no job of this import "
                                     "has that name).")
        outcome.job_key = found.key
        return self._own_job(found)

    def _schedule(self, arguments: dict[str, Value], id_name: str = "schedule_id", name_name: str = "schedule_name",
                  job: Job | None = None) -> Schedule:
        """sp_verify_schedule_identifiers: exactly one of the id and the name; a name must be
        unique (among the job's schedules when a job filters)."""
        schedule_id, name = arguments.get(id_name), arguments.get(name_name)
        for label, value in ((id_name, schedule_id), (name_name, name)):
            if isinstance(value, Unknown):
                raise NotFollowed(f"@{label} is not known before the script runs ({value.reason})")
        if isinstance(name, str):
            name = name.strip(" ") or None
        if (schedule_id is None) == (name is None):
            raise Refused(14373, f"Supply either @{id_name} or @{name_name} to identify the schedule.")
        if schedule_id is not None:
            found = self.schedules.get(schedule_id)
            if found is None:
                raise Refused(14262, f"The specified @schedule_id ('{schedule_id}') does not exist.")
            return self._own_schedule(found)
        pool = self.schedules_of(job.key) if job is not None else list(self.schedules.values())
        matches = [s for s in pool if text_key(s.name) == text_key(name)]
        if len(matches) > 1:
            raise Refused(14371, f"There are two or more schedules named \"{name}\". Specify @schedule_id instead "
                                 "of @schedule_name to uniquely identify the schedule.")
        if not matches:
            raise Refused(14262, f"The specified @schedule_name ('{name}') does not exist.")
        return self._own_schedule(matches[0])

    # ---------------------------------------------------------------- jobs

    def _sp_add_job(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        name = a["job_name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@job_name is not known before the script runs ({name.reason})")
        if name is None:
            raise Refused(515, "Cannot insert the value NULL into column 'name', table 'msdb.dbo.sysjobs'.")
        name = name.strip(" ")
        if text_key(name) in self.by_name:
            raise Refused(14261, f"The specified @name ('{name}') already exists.")
        if a["job_id"] is not None:
            raise Refused(14274, "Cannot add, update, or delete a job (or its steps or schedules) that originated "
                                 "from an MSX server: sp_add_job creates the @job_id, it does not take one (the "
                                 "variable given to @job_id OUTPUT already holds a value)")
        _check_enabled(a["enabled"])
        if a["start_step_id"] != 1 and not isinstance(a["start_step_id"], Unknown):
            raise Refused(14266, "The specified '@start_step_id' is invalid (valid values are: 1).")
        levels = _job_levels(a, {})
        job = Job(key=self._next_key, job_id=uuid.uuid4(), name=name, enabled=a["enabled"],
                  description=a["description"], start_step_id=a["start_step_id"], category_name=a["category_name"],
                  owner_login_name=a["owner_login_name"], delete_level=a["delete_level"], **levels)
        self._next_key += 1
        self.jobs[job.key] = job
        self.by_id[job.job_id] = job.key
        self.by_name[text_key(name)] = job.key
        self._owned.add(("job", job.key))
        self.touched_jobs.add(job.key)
        outcome.job_key = job.key
        outcome.outputs["job_id"] = job.job_id
        self._mark("job", job.key, unknown, exclude={"job_id", "job_name"})

    def _sp_update_job(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        new_name = a["new_name"]
        if isinstance(new_name, str):
            new_name = new_name.strip(" ") or None
        if isinstance(new_name, Unknown):
            raise NotFollowed(f"@new_name is not known before the script runs ({new_name.reason})")
        if new_name is not None and self.by_name.get(text_key(new_name), job.key) != job.key:
            raise Refused(14261, f"The specified @name ('{new_name}') already exists.")
        enabled = job.enabled if a["enabled"] is None else a["enabled"]
        _check_enabled(enabled)
        start = job.start_step_id if a["start_step_id"] is None else a["start_step_id"]
        if isinstance(start, int) and not 1 <= start <= len(job.steps) + 1:
            raise Refused(14266, f"The specified '@start_step_id' is invalid (valid values are: "
                                 f"1..{len(job.steps) + 1}).")
        current = {k: getattr(job, k) for k in ("notify_level_eventlog", "notify_level_email", "notify_level_netsend",
                                               "notify_level_page", "notify_email_operator_name",
                                               "notify_netsend_operator_name", "notify_page_operator_name")}
        levels = _job_levels(a, current)
        delete_level = job.delete_level if a["delete_level"] is None else a["delete_level"]
        _check_level("@delete_level", delete_level)
        if new_name is not None:
            del self.by_name[text_key(job.name)]
            job.name = new_name
            self.by_name[text_key(new_name)] = job.key
        job.enabled, job.start_step_id, job.delete_level = enabled, start, delete_level
        for key in ("description", "category_name", "owner_login_name"):
            if a[key] is not None:
                setattr(job, key, a[key])
        for key, value in levels.items():
            setattr(job, key, value)
        self._mark("job", job.key, unknown, exclude={"job_id", "job_name", "new_name"})

    def _sp_delete_job(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        if a["job_id"] is None and a["job_name"] is None:
            raise Refused(14279, "Supply either @job_name, @job_id or @originating_server.")
        job = self._job(a, outcome)
        attached = [s for j, s in self.attachments if j == job.key]
        self.attachments = [(j, s) for j, s in self.attachments if j != job.key]
        if a["delete_unused_schedule"] == 1:
            for schedule_id in attached:
                if not any(s == schedule_id for _, s in self.attachments):
                    self._drop_schedule(schedule_id)
        del self.jobs[job.key]
        del self.by_id[job.job_id]
        del self.by_name[text_key(job.name)]
        self.unknown = {k: v for k, v in self.unknown.items() if not (k[0] == "job" and k[1] == job.key)}

    def _sp_add_jobserver(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        server = a["server_name"]
        if isinstance(server, Unknown):
            raise NotFollowed(f"@server_name is not known before the script runs ({server.reason})")
        server = LOCAL if server is None or server.strip(" ").upper() == "(LOCAL)" else server.strip(" ").upper()
        if server in job.servers:
            raise Refused(14269, f"Job '{job.name}' is already targeted at server '{server}'.")
        job.servers.append(server)

    def _sp_delete_jobserver(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        server = a["server_name"]
        if isinstance(server, Unknown):
            raise NotFollowed(f"@server_name is not known before the script runs ({server.reason})")
        server = LOCAL if server is None or server.strip(" ").upper() == "(LOCAL)" else server.strip(" ").upper()
        if server not in job.servers:
            raise Refused(14270, f"Job '{job.name}' is not currently targeted at server '{server}'.")
        job.servers.remove(server)

    # ---------------------------------------------------------------- steps

    def _sp_add_jobstep(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        a = dict(a)
        for key in ("step_name", "subsystem", "server", "database_name", "database_user_name", "output_file_name",
                    "proxy_name"):
            if isinstance(a[key], str):
                a[key] = a[key].strip(" ")
                if a[key] == "" and key != "step_name" and key != "subsystem":
                    a[key] = None
        if isinstance(a["subsystem"], str) and a["subsystem"].upper() == "DTS":
            a["subsystem"] = "SSIS"
        job = self._job(a, outcome)
        steps = job.steps
        step_id = a["step_id"]
        if isinstance(step_id, Unknown):
            raise NotFollowed(f"@step_id is not known before the script runs ({step_id.reason}): where the step "
                              "goes is not known")
        if step_id is None:
            step_id = len(steps) + 1
        self._verify_step(job, a, step_id, a["step_name"], top=len(steps) + 1, require_name=True)
        if step_id <= len(steps):
            # sp_add_jobstep_internal: the steps from step_id on move up one, and so do the
            # gotos that point at them.
            for step in steps:
                if step.step_id >= step_id:
                    step.step_id += 1
            for step in steps:
                if isinstance(step.on_success_step_id, int) and step.on_success_step_id >= step_id:
                    step.on_success_step_id += 1
                if isinstance(step.on_fail_step_id, int) and step.on_fail_step_id >= step_id:
                    step.on_fail_step_id += 1
        step = Step(step_id=step_id, step_name=a["step_name"], subsystem=a["subsystem"], command=a["command"],
                    cmdexec_success_code=a["cmdexec_success_code"], on_success_action=a["on_success_action"],
                    on_success_step_id=a["on_success_step_id"], on_fail_action=a["on_fail_action"],
                    on_fail_step_id=a["on_fail_step_id"], server=a["server"],
                    database_name=a["database_name"], database_user_name=a["database_user_name"],
                    retry_attempts=a["retry_attempts"], retry_interval=a["retry_interval"],
                    os_run_priority=a["os_run_priority"], output_file_name=a["output_file_name"], flags=a["flags"],
                    proxy=a["proxy_name"] if a["proxy_name"] is not None else a["proxy_id"])
        _normalise_step(step)
        self._shift_step_unknowns(job.key, step_id, +1)
        steps.insert(step_id - 1, step)
        self._mark("step", (job.key, step.step_id), unknown, exclude={"job_id", "job_name", "step_id", "step_uid"})
        outcome.outputs["step_uid"] = uuid.uuid4()

    def _verify_step(self, job: Job, a: dict, step_id: int, new_name: Value, *, top: int, require_name: bool,
                     this: Step | None = None) -> None:
        """sp_verify_jobstep (top: the highest step_id allowed)."""
        if not isinstance(step_id, int) or not 1 <= step_id <= top:
            raise Refused(14266, f"The specified '@step_id' is invalid (valid values are: 1..{top}).")
        subsystem = a["subsystem"]
        if isinstance(subsystem, str) and subsystem.upper() not in SUBSYSTEMS:
            raise Refused(14234, f"The specified '@subsystem' ('{subsystem}') is invalid (valid values are returned "
                                 "by sp_enum_sqlagent_subsystems).")
        if require_name and new_name is None:
            raise Refused(515, "Cannot insert the value NULL into column 'step_name', table 'msdb.dbo.sysjobsteps'.")
        if isinstance(new_name, str) and any(isinstance(s.step_name, str) and text_key(s.step_name) == text_key(new_name)
                                             and s is not this for s in job.steps):
            raise Refused(14261, f"The specified @step_name ('{new_name}') already exists.")
        for which, label in (("success", "@on_success_step"), ("fail", "@on_failure_step")):
            action, target = a[f"on_{which}_action"], a[f"on_{which}_step_id"]
            if isinstance(action, int) and action not in (1, 2, 3, 4):
                raise Refused(14266, f"The specified '@on_{'failure' if which == 'fail' else which}_action' is "
                                     "invalid (valid values are: 1, 2, 3, 4).")
            if action == 4 and isinstance(target, int) and (target < 1 or target == step_id):
                raise Refused(14235, f"The specified '{label}' is invalid: a step cannot go to itself ({step_id}) "
                                     "or to a step below 1.")
        priority = a["os_run_priority"]
        if isinstance(priority, int) and priority not in (-15, -1, 0, 1, 15):
            raise Refused(14266, "The specified '@os_run_priority' is invalid (valid values are: -15, -1, 0, 1, 15).")
        flags = a["flags"]
        if isinstance(flags, int) and not 0 <= flags <= 114:
            raise Refused(14266, "The specified '@flags' is invalid (valid values are: 0..114).")
        database = a["database_name"]
        if isinstance(database, str) and database.startswith("[") and database.endswith("]"):
            raise Refused(14262, f"The specified '@database_name' ('{database}') does not exist (names in brackets "
                                 "are not allowed).")

    def _sp_update_jobstep(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        a = dict(a)
        for key in ("step_name", "subsystem", "command", "server", "database_name", "database_user_name",
                    "output_file_name", "proxy_name"):
            if isinstance(a[key], str):
                a[key] = a[key].strip(" ")          # LTRIM(RTRIM()): the command too, here
        if isinstance(a["subsystem"], str) and a["subsystem"].upper() == "DTS":
            a["subsystem"] = "SSIS"
        job = self._job(a, outcome)
        step_id = a["step_id"]
        if isinstance(step_id, Unknown):
            raise NotFollowed(f"@step_id is not known before the script runs ({step_id.reason})")
        step = next((s for s in job.steps if s.step_id == step_id), None)
        if step is None:
            raise Refused(14262, f"The specified @step_id ('{step_id}') does not exist.")
        merged = {}
        for key in ("step_name", "subsystem", "command", "cmdexec_success_code", "on_success_action",
                    "on_success_step_id", "on_fail_action", "on_fail_step_id", "server", "database_name",
                    "database_user_name", "retry_attempts", "retry_interval", "os_run_priority", "output_file_name",
                    "flags"):
            merged[key] = getattr(step, key) if a[key] is None else a[key]
        proxy = a["proxy_name"] if a["proxy_name"] is not None else a["proxy_id"]
        merged["proxy"] = step.proxy if proxy is None else (None if proxy == "" else proxy)
        for key in ("command", "server", "database_name", "database_user_name", "output_file_name"):
            if merged[key] == "":
                merged[key] = None
        renamed = a["step_name"] if a["step_name"] is not None and a["step_name"] != step.step_name else None
        self._verify_step(job, merged, step_id, renamed, top=len(job.steps), require_name=False, this=step)
        for key, value in merged.items():
            setattr(step, key, value)
        _normalise_step(step)
        for key in unknown:
            if key not in ("job_id", "job_name", "step_id"):
                self.unknown[("step", (job.key, step_id), key)] = unknown[key]
        for key in merged:
            if a.get(key) is not None and not isinstance(a.get(key), Unknown):
                self.unknown.pop(("step", (job.key, step_id), key), None)

    def _sp_delete_jobstep(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        step_id = a["step_id"]
        if isinstance(step_id, Unknown):
            raise NotFollowed(f"@step_id is not known before the script runs ({step_id.reason})")
        if step_id is None or not 0 <= step_id <= len(job.steps):
            raise Refused(14266, f"The specified '@step_id' is invalid (valid values are: 0..{len(job.steps)}).")
        if step_id == 0:
            job.steps.clear()
            self.unknown = {k: v for k, v in self.unknown.items() if not (k[0] == "step" and k[1][0] == job.key)}
            return
        job.steps = [s for s in job.steps if s.step_id != step_id]
        self.unknown = {k: v for k, v in self.unknown.items() if not (k[0] == "step" and k[1] == (job.key, step_id))}
        for step in job.steps:
            if step.step_id > step_id:
                step.step_id -= 1
        for step in job.steps:
            if isinstance(step.on_success_step_id, int) and step.on_success_step_id > step_id:
                step.on_success_step_id -= 1
            if isinstance(step.on_fail_step_id, int) and step.on_fail_step_id > step_id:
                step.on_fail_step_id -= 1
            if step.on_success_step_id == step_id:
                step.on_success_step_id, step.on_success_action = 0, 1
            if step.on_fail_step_id == step_id:
                step.on_fail_step_id, step.on_fail_action = 0, 2
        self._shift_step_unknowns(job.key, step_id, -1)

    def _shift_step_unknowns(self, key: int, from_step: int, by: int) -> None:
        moved = {}
        for (kind, where, prop), reason in self.unknown.items():
            if kind == "step" and where[0] == key and where[1] >= from_step + (1 if by < 0 else 0):
                moved[(kind, (key, where[1] + by), prop)] = reason
            else:
                moved[(kind, where, prop)] = reason
        self.unknown = moved

    # ---------------------------------------------------------------- schedules

    def _sp_add_schedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        name = a["schedule_name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@schedule_name is not known before the script runs ({name.reason})")
        values = {k: a[k] for k in SCHEDULE_FIELDS}
        values = self._verify_schedule(name, values)
        uid = a["schedule_uid"]
        existing = self.schedules.get(self.by_uid.get(uid, 0)) if isinstance(uid, uuid.UUID) else None
        if existing is not None:
            existing = self._own_schedule(existing)
            # A schedule_uid already in msdb: sp_add_schedule updates that schedule (how SSMS's
            # scripts of two jobs that share a schedule end up sharing it again).
            existing.name = name.strip(" ") if isinstance(name, str) else name
            for key, value in values.items():
                setattr(existing, key, value)
            outcome.outputs.update(schedule_id=existing.schedule_id, schedule_uid=existing.uid)
            self._mark("schedule", existing.schedule_id, unknown, only=SCHEDULE_FIELDS)
            return
        schedule = Schedule(schedule_id=self._next_schedule,
                            uid=uid if isinstance(uid, uuid.UUID) else uuid.uuid4(),
                            name=name.strip(" ") if isinstance(name, str) else name, **values)
        self._next_schedule += 1
        self.schedules[schedule.schedule_id] = schedule
        self.by_uid[schedule.uid] = schedule.schedule_id
        self._owned.add(("schedule", schedule.schedule_id))
        self.touched_schedules.add(schedule.schedule_id)
        outcome.outputs.update(schedule_id=schedule.schedule_id, schedule_uid=schedule.uid)
        self._mark("schedule", schedule.schedule_id, unknown, only=SCHEDULE_FIELDS)

    def _verify_schedule(self, name: Value, v: dict) -> dict:
        """sp_verify_schedule: the defaults it fills in, and the values it refuses."""
        if v.get("enabled", 1) is None:
            raise Refused(515, "Cannot insert the value NULL into column 'enabled', table 'msdb.dbo.sysschedules'.")
        v = {k: (0 if value is None else value) for k, value in v.items()}
        if isinstance(name, str) and name.strip(" ").upper() == "ALL":
            raise Refused(14200, "The specified '@name' is invalid ('ALL' is reserved).")
        if name is None:
            raise Refused(515, "Cannot insert the value NULL into column 'name', table 'msdb.dbo.sysschedules'.")
        known = {k: value for k, value in v.items() if not isinstance(value, Unknown)}
        if "enabled" in known and known["enabled"] not in (0, 1):
            raise Refused(14266, "The specified '@enabled' is invalid (valid values are: 0, 1).")
        freq_type = known.get("freq_type")
        if freq_type == 2:
            raise Refused(14295, "Frequency Type 0x2 (OnDemand) is no longer supported.")
        if freq_type is not None and freq_type not in (1, 4, 8, 16, 32, 64, 128):
            raise Refused(14266, f"The specified '@freq_type' ({freq_type}) is invalid (valid values are: 1, 4, 8, "
                                 "16, 32, 64, 128).")
        subday = known.get("freq_subday_type")
        if subday is not None and subday not in (0, 1, 2, 4, 8):
            raise Refused(14266, f"The specified '@freq_subday_type' ({subday}) is invalid (valid values are: 0x1, "
                                 "0x2, 0x4, 0x8).")
        if known.get("active_start_date") == 0:
            v["active_start_date"] = known["active_start_date"] = int(self.today.strftime("%Y%m%d"))
        if known.get("active_end_date") == 0:
            v["active_end_date"] = known["active_end_date"] = 99991231
        if known.get("active_end_time") == 0:
            v["active_end_time"] = known["active_end_time"] = 235959
        for key in ("active_end_date", "active_start_date"):
            if key in known and not _valid_date(known[key]):
                raise Refused(14266, f"The specified '@{key}' ({known[key]}) is invalid (valid values are: "
                                     "19900101..99991231).")
        if "active_start_date" in known and "active_end_date" in known \
                and known["active_end_date"] < known["active_start_date"]:
            raise Refused(14288, f"@active_end_date ({known['active_end_date']}) cannot be before @active_start_date "
                                 f"({known['active_start_date']}).")
        for key in ("active_end_time", "active_start_time"):
            if key in known:
                problem = _time_problem(known[key])
                if problem:
                    raise Refused(14266 if "000000" in problem else 14287,
                                  f"The specified '@{key}' ({known[key]}) is invalid: {problem}.")
        if known.get("active_start_time") == known.get("active_end_time") and subday in (2, 4, 8) \
                and "active_start_time" in known:
            raise Refused(14266, "The specified '@active_end_time' is invalid: the start and end times of a schedule "
                                 "that repeats within the day must differ.")
        if freq_type in (1, 64, 128):
            for key in ("freq_interval", "freq_subday_type", "freq_subday_interval", "freq_relative_interval",
                        "freq_recurrence_factor"):
                v[key] = 0
            return v
        if subday == 0:
            v["freq_subday_type"] = subday = 1
        interval = known.get("freq_subday_interval")
        if subday in (2, 4, 8) and interval is not None and (interval < 1 or (subday == 2 and interval < 10)):
            raise Refused(14278, f"The schedule for this job is invalid (reason: The specified "
                                 f"'@freq_subday_interval' ({interval}) is invalid"
                                 f"{': seconds must be 10 or more' if subday == 2 else ''}).")
        freq_interval = known.get("freq_interval")
        if freq_type == 4:
            v["freq_recurrence_factor"] = 0
            if freq_interval is not None and freq_interval < 1:
                raise Refused(14278, f"The schedule for this job is invalid (reason: @freq_interval ({freq_interval}) "
                                     "must be at least 1 for a daily schedule).")
        if freq_type == 8 and freq_interval is not None and not 1 <= freq_interval <= 127:
            raise Refused(14278, f"The schedule for this job is invalid (reason: @freq_interval ({freq_interval}) "
                                 "must be a set of days, 1..127, for a weekly schedule).")
        if freq_type == 16 and freq_interval is not None and not 1 <= freq_interval <= 31:
            raise Refused(14278, f"The schedule for this job is invalid (reason: @freq_interval ({freq_interval}) "
                                 "must be a day of the month, 1..31, for a monthly schedule).")
        if freq_type == 32:
            relative = known.get("freq_relative_interval")
            if relative is not None and relative not in (1, 2, 4, 8, 16):
                raise Refused(14278, f"The schedule for this job is invalid (reason: @freq_relative_interval "
                                     f"({relative}) must be 1, 2, 4, 8 or 16 for a monthly relative schedule).")
            if freq_interval is not None and not 1 <= freq_interval <= 10:
                raise Refused(14278, f"The schedule for this job is invalid (reason: @freq_interval ({freq_interval}) "
                                     "must be 1..10 for a monthly relative schedule).")
        factor = known.get("freq_recurrence_factor")
        if freq_type in (8, 16, 32) and factor is not None and factor < 1:
            raise Refused(14278, f"The schedule for this job is invalid (reason: @freq_recurrence_factor ({factor}) "
                                 "must be at least 1 for a weekly or monthly schedule).")
        return v

    def _sp_attach_schedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        schedule = self._schedule(a)
        if (job.key, schedule.schedule_id) not in self.attachments:
            self.attachments.append((job.key, schedule.schedule_id))

    def _sp_add_jobschedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        added = dict(a, schedule_name=a["name"], owner_login_name=None, originating_server=None)
        self._sp_add_schedule(added, outcome, {k: v for k, v in unknown.items() if k != "name"})
        schedule_id = outcome.outputs["schedule_id"]
        if (job.key, schedule_id) not in self.attachments:
            self.attachments.append((job.key, schedule_id))

    def _sp_detach_schedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        schedule = self._schedule(a, job=job if a["schedule_id"] is None else None)
        if (job.key, schedule.schedule_id) not in self.attachments:
            raise Refused(14374, f"The specified schedule name \"{schedule.name}\" is not associated with the job "
                                 f"\"{job.name}\".", severity=0)
        self.attachments.remove((job.key, schedule.schedule_id))
        if a["delete_unused_schedule"] == 1 and not any(s == schedule.schedule_id for _, s in self.attachments):
            self._drop_schedule(schedule.schedule_id)

    def _sp_update_schedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        schedule = self._schedule(a, name_name="name")
        self._update_schedule(schedule, a, unknown)

    def _sp_update_jobschedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        name = a["name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@name is not known before the script runs ({name.reason})")
        name = (name or "").strip(" ")
        matches = [s for s in self.schedules_of(job.key) if text_key(s.name) == text_key(name)]
        matches = [self._own_schedule(m) for m in matches]
        if len(matches) > 1:
            raise Refused(14375, f"More than one schedule named \"{name}\" is attached to job \"{job.name}\". Use "
                                 "\"sp_update_schedule\" to update schedules.")
        if not matches:
            raise Refused(14374, f"The specified schedule name \"{name}\" is not associated with the job "
                                 f"\"{job.name}\".")
        self._update_schedule(matches[0], a, unknown)

    def _update_schedule(self, schedule: Schedule, a: dict, unknown: dict) -> None:
        new_name = a["new_name"]
        if isinstance(new_name, str):
            new_name = new_name.strip(" ") or None
        merged = {k: getattr(schedule, k) if a[k] is None else a[k] for k in SCHEDULE_FIELDS}
        merged = self._verify_schedule(new_name if new_name is not None else schedule.name, merged)
        if new_name is not None:
            schedule.name = new_name
        for key, value in merged.items():
            setattr(schedule, key, value)
        for key in SCHEDULE_FIELDS:
            if a[key] is not None:
                if isinstance(a[key], Unknown):
                    self.unknown[("schedule", schedule.schedule_id, key)] = a[key].reason
                else:
                    self.unknown.pop(("schedule", schedule.schedule_id, key), None)

    def _sp_delete_schedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        schedule = self._schedule(a)
        if any(s == schedule.schedule_id for _, s in self.attachments) and a["force_delete"] != 1:
            raise Refused(14372, f"The schedule ({schedule.name}) cannot be deleted because it is being used by at "
                                 "least one job. Use sp_detach_schedule to remove schedules from a job.")
        self.attachments = [(j, s) for j, s in self.attachments if s != schedule.schedule_id]
        self._drop_schedule(schedule.schedule_id)

    def _sp_delete_jobschedule(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        job = self._job(a, outcome)
        name = a["name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@name is not known before the script runs ({name.reason})")
        name = (name or "").strip(" ")
        mine = [s for j, s in self.attachments if j == job.key]
        if name.upper() == "ALL":
            if a["keep_schedule"] == 0 and any(j != job.key and s in mine for j, s in self.attachments):
                raise Refused(14367, "One or more schedules were not deleted because they are being used by at least "
                                     "one other job. Use \"sp_detach_schedule\" to remove schedules from a job.")
            self.attachments = [(j, s) for j, s in self.attachments if j != job.key]
            if a["keep_schedule"] == 0:
                for schedule_id in mine:
                    self._drop_schedule(schedule_id)
            return
        matches = [self.schedules[s] for s in mine if text_key(self.schedules[s].name) == text_key(name)]
        if len(matches) > 1:
            raise Refused(14376, f"More than one schedule named \"{name}\" is attached to job \"{job.name}\".")
        if not matches:
            raise Refused(14374, f"The specified schedule name \"{name}\" is not associated with the job "
                                 f"\"{job.name}\".")
        schedule_id = matches[0].schedule_id
        self.attachments.remove((job.key, schedule_id))
        if a["keep_schedule"] == 0 and not any(s == schedule_id for _, s in self.attachments):
            self._drop_schedule(schedule_id)

    def _drop_schedule(self, schedule_id: int) -> None:
        self.touched_schedules.add(schedule_id)
        dropped = self.schedules.pop(schedule_id, None)
        if dropped is not None:
            self.by_uid.pop(dropped.uid, None)
        self.unknown = {k: v for k, v in self.unknown.items() if not (k[0] == "schedule" and k[1] == schedule_id)}

    # ---------------------------------------------------------------- alerts

    def _sp_add_alert(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        """An alert (converted by shared/ops/sqlagent_import.py into ALERT__<name>__*): what it
        watches, its delay and the job it starts, as msdb.dbo.sysalerts holds them."""
        name = a["name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@name is not known before the script runs ({name.reason})")
        name = (name or "").strip(" ")
        if text_key(name) in self.alerts:
            raise Refused(14261, f"The specified @name ('{name}') already exists.")
        job_key = None
        if a["job_id"] is not None or a["job_name"] is not None:
            job_key = self._job(a, outcome).key
        self.alerts[text_key(name)] = {**{k: v for k, v in a.items() if k not in ("job_id", "job_name")},
                                       "name": name, "job_key": job_key, "operators": (), "unknown": dict(unknown)}

    def _sp_update_alert(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        name = a["name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@name is not known before the script runs ({name.reason})")
        current = self.alerts.get(text_key((name or "").strip(" ")))
        if current is None:
            raise Refused(14262, f"The specified @name ('{name}') does not exist.")
        changed = {k: v for k, v in a.items() if v is not None and k not in ("name", "new_name", "job_id", "job_name")}
        updated = {**current, **changed, "unknown": {**current["unknown"], **unknown}}
        if a["job_id"] is not None or a["job_name"] is not None:
            updated["job_key"] = self._job(a, outcome).key
        del self.alerts[text_key(current["name"])]
        if isinstance(a["new_name"], str) and a["new_name"].strip(" "):
            updated["name"] = a["new_name"].strip(" ")
        self.alerts[text_key(updated["name"])] = updated

    def _sp_delete_alert(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        name = a["name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@name is not known before the script runs ({name.reason})")
        if self.alerts.pop(text_key((name or "").strip(" ")), None) is None:
            raise Refused(14262, f"The specified @name ('{name}') does not exist.")

    def _sp_add_notification(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        """An operator told of an alert: here, the alert notifies (the agent's webhook / Action Group)."""
        name, operator = a["alert_name"], a["operator_name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@alert_name is not known before the script runs ({name.reason})")
        current = self.alerts.get(text_key((name or "").strip(" ")))
        if current is None:
            raise Refused(14262, f"The specified @alert_name ('{name}') does not exist.")
        shown = operator if isinstance(operator, str) else "(an operator not known before the script runs)"
        self.alerts[text_key(current["name"])] = {**current, "operators": (*current["operators"], shown)}

    def _sp_delete_notification(self, a: dict, outcome: Outcome, unknown: dict) -> None:
        name, operator = a["alert_name"], a["operator_name"]
        if isinstance(name, Unknown):
            raise NotFollowed(f"@alert_name is not known before the script runs ({name.reason})")
        current = self.alerts.get(text_key((name or "").strip(" ")))
        if current is None:
            raise Refused(14262, f"The specified @alert_name ('{name}') does not exist.")
        kept = tuple(o for o in current["operators"] if not (isinstance(operator, str) and text_key(o) == text_key(operator)))
        self.alerts[text_key(current["name"])] = {**current, "operators": kept}

    # ---------------------------------------------------------------- helpers

    def _mark(self, kind: str, key: Any, unknown: dict[str, str], *, exclude: set[str] = frozenset(),
              only: tuple[str, ...] | None = None) -> None:
        for name, reason in unknown.items():
            if name in exclude or (only is not None and name not in only):
                continue
            self.unknown[(kind, key, name)] = reason


def _check_enabled(value: Value) -> None:
    if isinstance(value, int) and value not in (0, 1):
        raise Refused(14266, f"The specified '@enabled' ({value}) is invalid (valid values are: 0, 1).")


def _check_level(name: str, value: Value) -> None:
    if isinstance(value, int) and value & 3 != value:
        raise Refused(14266, f"The specified '{name}' ({value}) is invalid (valid values are: 0, 1, 2, 3).")


def _job_levels(a: dict, current: dict) -> dict:
    """sp_verify_job's rules for the notification levels: each 0-3; an operator named needs a
    level above 0; no operator sets the level to 0."""
    out = {}
    out["notify_level_eventlog"] = current.get("notify_level_eventlog") if a["notify_level_eventlog"] is None \
        else a["notify_level_eventlog"]
    _check_level("@notify_level_eventlog", out["notify_level_eventlog"])
    for kind in ("email", "netsend", "page"):
        level = a[f"notify_level_{kind}"]
        level = current.get(f"notify_level_{kind}", 0) if level is None else level
        _check_level(f"@notify_level_{kind}", level)
        operator = a[f"notify_{kind}_operator_name"]
        operator = current.get(f"notify_{kind}_operator_name") if operator is None else operator
        if isinstance(operator, str):
            operator = operator.strip(" ") or None
        if operator is not None:
            if level == 0:
                raise Refused(14266, f"The specified '@notify_level_{kind}' is invalid (valid values are: 1, 2, 3): "
                                     f"an operator ({operator}) is named.")
        else:
            level = 0
        out[f"notify_level_{kind}"] = level
        out[f"notify_{kind}_operator_name"] = operator
    return out


def _normalise_step(step: Step) -> None:
    """What sp_verify_jobstep stores: a T-SQL step without a database runs in master, and has no
    server; a CmdExec step has neither database nor user."""
    subsystem = step.subsystem.upper() if isinstance(step.subsystem, str) else None
    if subsystem == "TSQL":
        step.server = None
        if step.database_name is None or (isinstance(step.database_name, str) and not step.database_name.strip()):
            step.database_name = "master"
    elif subsystem == "CMDEXEC":
        step.database_name = step.database_user_name = None
    if subsystem not in (None, "TSQL"):
        step.database_user_name = None


def _valid_date(value: int) -> bool:
    if not 19900101 <= value <= 99991231:
        return False
    try:
        date(value // 10000, value // 100 % 100, value % 100)
    except ValueError:
        return False
    return True


def _time_problem(value: int) -> str | None:
    if not 0 <= value <= 235959:
        return "valid values are 000000..235959"
    if value // 10000 > 23:
        return "the hour is above 23"
    if value // 100 % 100 > 59:
        return "the minute is above 59"
    if value % 100 > 59:
        return "the second is above 59"
    return None


def bind(procedure: str, positional: list[tuple[Value, bool]], named: list[tuple[str, Value, bool]]
         ) -> tuple[dict[str, Value], dict[str, str]]:
    """The arguments of a call as the procedure sees them: positional ones in the signature's
    order, named ones by name, defaults for the rest, each converted to its parameter's type.
    Returns (values by parameter name, OUTPUT parameter -> the caller's variable marker) or
    raises SqlFailure as SQL Server does (8145 unknown parameter, 201 missing, 8144 too many)."""
    signature = SIGNATURES[procedure]
    by_name = {p.name: p for p in signature}
    values: dict[str, Value] = {}
    outputs: dict[str, str] = {}
    if len(positional) > len(signature):
        raise SqlFailure(8144, f"Procedure or function {procedure} has too many arguments specified.")
    for param, (value, output) in zip(signature, positional):
        values[param.name] = value
        if output:
            outputs[param.name] = param.name
    for name, value, output in named:
        param = by_name.get(name)
        if param is None:
            raise SqlFailure(8145, f"@{name} is not a parameter for procedure {procedure}.")
        if name in values:
            raise SqlFailure(8143, f"Parameter '@{name}' was supplied multiple times.")
        values[name] = value
        if output:
            if not param.output:
                raise SqlFailure(8162, f"The formal parameter \"@{name}\" was not declared as an OUTPUT parameter, "
                                       "but the actual parameter passed in requested output.")
            outputs[name] = name
    bound: dict[str, Value] = {}
    for param in signature:
        if param.name in values and values[param.name] is not DEFAULT:
            bound[param.name] = convert(values[param.name], param.type)
        elif param.default is REQUIRED:
            raise SqlFailure(201, f"Procedure or function '{procedure}' expects parameter '@{param.name}', which was "
                                  "not supplied.")
        else:
            bound[param.name] = param.default
    return bound, outputs


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()        # the DEFAULT keyword as an argument
