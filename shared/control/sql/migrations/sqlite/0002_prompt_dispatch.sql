-- 0002 prompt dispatch: the runs table is the queue of the local runner, starts are decided
-- one at a time (SQLite's single writer: BEGIN IMMEDIATE), and a lease lapse or a transient
-- error no longer spends the run's attempts.

-- Kept for the same schema on every dialect; SQLite serialises starts with its write lock.
CREATE TABLE agent_start_lock (
    lock_id INT PRIMARY KEY
);
INSERT INTO agent_start_lock (lock_id) VALUES (1);

-- attempt counts every start (the history numbering); failures counts the attempts spent by
-- errors in the job's SQL (bounded by max_attempts); lapses counts leases that lapsed because
-- the worker died or lost the database (bounded by AGENT_MAX_LAPSES); transient_errors counts
-- transient failures of the local runner (bounded by AGENT_MAX_DEQUEUE_COUNT).
ALTER TABLE agent_runs ADD COLUMN failures INT NOT NULL DEFAULT 0;
ALTER TABLE agent_runs ADD COLUMN lapses INT NOT NULL DEFAULT 0;
ALTER TABLE agent_runs ADD COLUMN transient_errors INT NOT NULL DEFAULT 0;
UPDATE agent_runs SET failures = CASE WHEN status IN ('failed', 'pending', 'poisoned') THEN attempt
                                      ELSE max(attempt - 1, 0) END;

-- The tick time that last moved a job's next slot (see the PostgreSQL migration).
ALTER TABLE agent_jobs ADD COLUMN advanced_at TEXT NULL;

-- What a starter looks for: pending runs in the order they became runnable.
CREATE INDEX runs_pending ON agent_runs (runnable_at, run_id) WHERE status = 'pending';

-- Slots that may have to be skipped (overlap, misfire) are job runs: a backlog of tasks costs
-- the skip pass nothing.
CREATE INDEX runs_pending_jobs ON agent_runs (runnable_at) WHERE status = 'pending' AND job_name IS NOT NULL;

-- Task order is checked at every start: the unfinished tasks, by order.
CREATE INDEX runs_open_tasks ON agent_runs (task_order)
    WHERE kind = 'task' AND status IN ('pending', 'queued', 'running');

-- The local runner claims straight from agent_runs; the queue table is gone.
DROP TABLE agent_queue_messages;
