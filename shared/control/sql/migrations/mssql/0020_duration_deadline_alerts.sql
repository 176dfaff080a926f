-- 0020 alerts the agent raises itself (issue 32 items 1 and 2); see the PostgreSQL file of the
-- same number.
ALTER TABLE agent.jobs ADD max_duration_seconds INT NULL;
ALTER TABLE agent.jobs ADD stop_after_seconds INT NULL;
ALTER TABLE agent.jobs ADD slower_than DOUBLE PRECISION NULL;   -- FLOAT(53), as PostgreSQL's
ALTER TABLE agent.jobs ADD deadline_seconds INT NULL;

ALTER TABLE agent.notifications ADD kind NVARCHAR(16) NOT NULL CONSTRAINT notifications_kind_default DEFAULT 'outcome';
ALTER TABLE agent.notifications ADD detail NVARCHAR(MAX) NULL;
DROP INDEX notifications_run ON agent.notifications;
CREATE UNIQUE INDEX notifications_run_kind ON agent.notifications (run_id, kind);
