-- 0003 history retention: indexes the tick's purge (AGENT_HISTORY_RETENTION_DAYS,
-- AGENT_POISON_RETENTION_DAYS) and the history listings seek, so both stay fast at
-- 10 million runs (bench/bench_history.py).
-- Filtered indexes need these options when the file is run by hand (sqlcmd defaults
-- QUOTED_IDENTIFIER to OFF); the agent's own sessions have them on.
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
SET XACT_ABORT ON;

-- The purge takes the oldest finished runs first.
CREATE INDEX runs_finished ON agent.runs (finished_at) WHERE finished_at IS NOT NULL;
-- history --job NAME: one job's runs, newest first.
CREATE INDEX runs_job_run ON agent.runs (job_name, run_id);
-- Job events of one job, newest first; and the oldest events for the purge.
CREATE INDEX job_events_job_event ON agent.job_events (job_name, event_id);
CREATE INDEX job_events_at ON agent.job_events (event_at);
-- Poison messages: the oldest for the purge; a run's poison messages (a run with a poison
-- message not yet requeued is kept, so that `poison requeue` still finds it).
CREATE INDEX poison_messages_at ON agent.poison_messages (poisoned_at);
CREATE INDEX poison_messages_run ON agent.poison_messages (run_id);
