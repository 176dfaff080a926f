-- 0015 slots after a change of a job's state (issue 34, items 4 to 6 follow-up); see the
-- PostgreSQL file of the same number.

-- What the settings sync last wrote for a job (a digest of every setting it writes): a sync that
-- changes nothing leaves the job's row, and its updated_at, as they were.
ALTER TABLE agent_jobs ADD COLUMN definition_hash VARCHAR(64) NULL;
