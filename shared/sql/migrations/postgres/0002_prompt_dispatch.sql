-- 0002 prompt dispatch: the runs table is the queue of the local runner, starts are decided
-- under one lock (cap, task order, overlap), and a lease lapse or a transient error no longer
-- spends the run's attempts.

-- Starts (and dispatches) take this table's lock for the rest of their transaction, so the
-- concurrency cap, the task order and the overlap policy are decided by one starter at a time.
CREATE TABLE agent.start_lock (
    lock_id INT PRIMARY KEY
);
INSERT INTO agent.start_lock (lock_id) VALUES (1);

-- attempt counts every start (the history numbering); failures counts the attempts spent by
-- errors in the job's SQL (bounded by max_attempts); lapses counts leases that lapsed because
-- the worker died or lost the database (bounded by AGENT_MAX_LAPSES); transient_errors counts
-- transient failures of the local runner (bounded by AGENT_MAX_DEQUEUE_COUNT, as deliveries are).
ALTER TABLE agent.runs ADD COLUMN failures INT NOT NULL DEFAULT 0;
ALTER TABLE agent.runs ADD COLUMN lapses INT NOT NULL DEFAULT 0;
ALTER TABLE agent.runs ADD COLUMN transient_errors INT NOT NULL DEFAULT 0;
UPDATE agent.runs SET failures = CASE WHEN status IN ('failed', 'pending', 'poisoned') THEN attempt
                                      ELSE GREATEST(attempt - 1, 0) END;
ALTER TABLE agent.runs ADD CONSTRAINT runs_status_check CHECK (status IN (
    'pending', 'queued', 'running', 'succeeded', 'failed', 'poisoned', 'skipped', 'cancelled'));
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('scheduled', 'manual', 'task'));

-- The tick time that last moved a job's next slot: a tick whose clock ran far ahead is found
-- (advanced_at later than any sane tick) and undone by the next sane tick.
ALTER TABLE agent.jobs ADD COLUMN advanced_at TIMESTAMP NULL;

-- What a starter looks for: pending runs in the order they became runnable.
CREATE INDEX runs_pending ON agent.runs (runnable_at, run_id) WHERE status = 'pending';

-- The local runner claims straight from agent.runs; the queue table is gone.
DROP TABLE agent.queue_messages;

-- Task order is checked at every start: the unfinished tasks, by order.
CREATE INDEX runs_open_tasks ON agent.runs (task_order)
    WHERE kind = 'task' AND status IN ('pending', 'queued', 'running');
