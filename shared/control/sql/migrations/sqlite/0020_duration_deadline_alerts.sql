-- 0020 alerts the agent raises itself (issue 32 items 1 and 2); see the PostgreSQL file of the
-- same number.
ALTER TABLE agent_jobs ADD COLUMN max_duration_seconds INT NULL;
ALTER TABLE agent_jobs ADD COLUMN stop_after_seconds INT NULL;
ALTER TABLE agent_jobs ADD COLUMN slower_than REAL NULL;
ALTER TABLE agent_jobs ADD COLUMN deadline_seconds INT NULL;

ALTER TABLE agent_notifications ADD COLUMN kind VARCHAR(16) NOT NULL DEFAULT 'outcome';
ALTER TABLE agent_notifications ADD COLUMN detail TEXT NULL;
DROP INDEX notifications_run;
CREATE UNIQUE INDEX notifications_run_kind ON agent_notifications (run_id, kind);
