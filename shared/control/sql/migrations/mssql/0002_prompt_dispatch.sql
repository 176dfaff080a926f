-- 0002 prompt dispatch: the runs table is the queue of the local runner, starts are decided
-- under one lock (cap, task order, overlap), and a lease lapse or a transient error no longer
-- spends the run's attempts. Each statement runs on its own, in the one transaction of the
-- migration. Run by hand (sqlcmd), a migration needs these options for the filtered indexes.
SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

-- Starts (and dispatches) take this table's lock (TABLOCKX) for the rest of their transaction,
-- so the concurrency cap, the task order and the overlap policy are decided by one starter at a
-- time.
CREATE TABLE agent.start_lock (
    lock_id INT NOT NULL CONSTRAINT start_lock_pk PRIMARY KEY
);
INSERT INTO agent.start_lock (lock_id) VALUES (1);

-- attempt counts every start (the history numbering); failures counts the attempts spent by
-- errors in the job's SQL (bounded by max_attempts); lapses counts leases that lapsed because
-- the worker died or lost the database (bounded by AGENT_MAX_LAPSES); transient_errors counts
-- transient failures of the local runner (bounded by AGENT_MAX_DEQUEUE_COUNT).
ALTER TABLE agent.runs ADD failures INT NOT NULL CONSTRAINT runs_failures_default DEFAULT 0;
ALTER TABLE agent.runs ADD lapses INT NOT NULL CONSTRAINT runs_lapses_default DEFAULT 0;
ALTER TABLE agent.runs ADD transient_errors INT NOT NULL CONSTRAINT runs_transient_errors_default DEFAULT 0;
EXEC sp_executesql N'UPDATE agent.runs SET failures = CASE WHEN status IN (N''failed'', N''pending'', N''poisoned'') THEN attempt WHEN attempt > 0 THEN attempt - 1 ELSE 0 END';
ALTER TABLE agent.runs ADD CONSTRAINT runs_status_check CHECK (status IN (
    N'pending', N'queued', N'running', N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled'));
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN (N'scheduled', N'manual', N'task'));

-- The tick time that last moved a job's next slot (see the PostgreSQL migration).
ALTER TABLE agent.jobs ADD advanced_at DATETIME2(6) NULL;

-- What a starter looks for: pending runs in the order they became runnable.
CREATE INDEX runs_pending ON agent.runs (runnable_at, run_id) WHERE status = N'pending';

-- Slots that may have to be skipped (overlap, misfire) are job runs: a backlog of tasks costs
-- the skip pass nothing.
CREATE INDEX runs_pending_jobs ON agent.runs (runnable_at) WHERE status = N'pending' AND job_name IS NOT NULL;

-- Task order is checked at every start: the unfinished tasks, by order.
CREATE INDEX runs_open_tasks ON agent.runs (task_order)
    WHERE kind = N'task' AND status IN (N'pending', N'queued', N'running');

-- The local runner claims straight from agent.runs; the queue table is gone.
DROP TABLE agent.queue_messages;
