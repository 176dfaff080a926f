-- 0012 schedules beyond every scheduler (issue 33): a job's calendars (JOB__<name>__EXCLUDE, ONLY,
-- ON_EXCLUDED), whole, as JSON (shared.jobs.calendars.CalendarRules): the claim reads them with
-- the job (select_due_jobs) and computes its slots' decisions in Python; NULL: no calendar.
ALTER TABLE agent.jobs ADD calendars NVARCHAR(MAX) NULL;
-- JOB__<name>__JITTER_SECONDS: each slot runs up to this many seconds late, by a delay fixed by the
-- job's name and the slot (every instance computes the same: the slot is still claimed once).
ALTER TABLE agent.jobs ADD jitter_seconds INT NOT NULL CONSTRAINT jobs_jitter_seconds_default DEFAULT 0;
