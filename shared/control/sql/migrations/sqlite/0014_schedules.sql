-- 0014 schedules beyond every scheduler (issue 33): a job's calendars (JOB__<name>__EXCLUDE, ONLY,
-- ON_EXCLUDED), whole, as JSON (shared.jobs.calendars.CalendarRules): the claim reads them with
-- the job (select_due_jobs) and computes its slots' decisions in Python; NULL: no calendar.
ALTER TABLE agent_jobs ADD COLUMN calendars TEXT NULL;
-- JOB__<name>__JITTER_SECONDS: each slot runs up to this many seconds late, by a delay fixed by the
-- job's name and the slot (every instance computes the same: the slot is still claimed once).
ALTER TABLE agent_jobs ADD COLUMN jitter_seconds INT NOT NULL DEFAULT 0;
-- Calendars defined from T-SQL (agent.add_calendar) and a database job's requested calendars
-- (agent.set_job_calendars): SQLite has no procedures; the same tables and columns as the others.
CREATE TABLE agent_calendars (
    name        VARCHAR(64) NOT NULL PRIMARY KEY COLLATE NOCASE,
    dates       TEXT NULL,
    weekly      TEXT NULL,
    defined_by  VARCHAR(128) NULL,
    updated_at  TIMESTAMP NOT NULL
);
ALTER TABLE agent_jobs ADD COLUMN requested_exclude VARCHAR(4000) NULL;
ALTER TABLE agent_jobs ADD COLUMN requested_only VARCHAR(4000) NULL;
ALTER TABLE agent_jobs ADD COLUMN requested_on_excluded VARCHAR(8) NULL;
