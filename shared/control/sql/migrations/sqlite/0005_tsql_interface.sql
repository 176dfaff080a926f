-- 0005 T-SQL interface (issue 14). SQLite has no stored procedures: the procedures and views of
-- PostgreSQL and SQL Server do not exist here, and the command line is the way in. Only the
-- columns and index the engine reads on every dialect are added, so the schema stays the same.

-- Where a job is defined: 0 the app settings (JOB__<name>__*), 1 agent.add_scheduled_job.
ALTER TABLE agent_jobs ADD COLUMN defined_in_database SMALLINT NOT NULL DEFAULT 0;
-- A job defined or changed in the database waits for the engine to plan its first slot.
ALTER TABLE agent_jobs ADD COLUMN needs_planning SMALLINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_needs_planning ON agent_jobs (needs_planning) WHERE needs_planning = 1;
