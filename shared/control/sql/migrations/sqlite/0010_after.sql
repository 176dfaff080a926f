-- 0010 jobs that follow jobs (issue 27 item 3): JOB__<b>__AFTER=<a>: a run of a that ends with b's
-- AFTER_OUTCOME starts a run of b, created in the transaction that records a's end. SQLite has no
-- procedures or views: only the columns and indexes every dialect has.

-- Whom the job follows, and on which end of its runs (NULL: no one).
ALTER TABLE agent_jobs ADD COLUMN after_job VARCHAR(64) NULL;
ALTER TABLE agent_jobs ADD COLUMN after_outcome VARCHAR(16) NULL CHECK (after_outcome IN ('succeeded', 'failed', 'completed'));
CREATE INDEX jobs_after_job ON agent_jobs (after_job) WHERE after_job IS NOT NULL;
-- The run whose end started this one; one follow-up per (run, job), whoever ends the run.
ALTER TABLE agent_runs ADD COLUMN followed_run_id BIGINT NULL;
CREATE UNIQUE INDEX runs_followed ON agent_runs (followed_run_id, job_name) WHERE followed_run_id IS NOT NULL;
