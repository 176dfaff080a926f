-- 0028 steps for the jobs defined in the database (agent.set_job_steps; see the PostgreSQL file of
-- the same number). SQLite has no procedures and no job defined in the database; the same column
-- as the others, so the named queries read the same rows.
ALTER TABLE agent_jobs ADD COLUMN requested_steps TEXT NULL;
