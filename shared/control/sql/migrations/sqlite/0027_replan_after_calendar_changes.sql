-- 0027 a job's runs claimed ahead follow a change of its calendars or jitter (issue 33,
-- hardening); see the PostgreSQL file of the same number. SQLite has no procedures: the column
-- agent.set_job_calendars sets elsewhere (1: the engine's planning records the job's
-- never-started runs keyed from its new first slot on skipped, and claims them again under the
-- new rules), so that every dialect has the same tables and columns.
ALTER TABLE agent_jobs ADD COLUMN replan_runs SMALLINT NOT NULL DEFAULT 0;
