-- 0020 alerts the agent raises itself (issue 32 items 1 and 2): a run running too long
-- (MAX_DURATION_SECONDS, notified once; STOP_AFTER_SECONDS, stopped as `stop` does), a run slower
-- than a multiple of its job's recent p95 (SLOWER_THAN), and a slot with no success within
-- DEADLINE_SECONDS. Decided by the tick (shared/engine/alerts.py), notified through the outbox.

-- The limits, synced from the settings with the rest of the job (NULL: no such alert).
ALTER TABLE agent.jobs ADD COLUMN max_duration_seconds INT NULL;
ALTER TABLE agent.jobs ADD COLUMN stop_after_seconds INT NULL;
ALTER TABLE agent.jobs ADD COLUMN slower_than DOUBLE PRECISION NULL;
ALTER TABLE agent.jobs ADD COLUMN deadline_seconds INT NULL;

-- The outbox holds alerts besides outcomes: one row per (run, kind) — kind 'outcome' (the run's
-- end, as before), 'duration', 'stopped', 'slower' or 'deadline' (a slot is one run: the
-- unique (job, slot) of agent.runs) — so each is written at most once, whichever tick races.
-- detail: what the alert says (the limit, the time taken). An alert with no webhook to go to is
-- recorded with status 'unsent' (never claimed): it was raised, once, for telemetry.
ALTER TABLE agent.notifications ADD COLUMN kind VARCHAR(16) NOT NULL DEFAULT 'outcome';
ALTER TABLE agent.notifications ADD COLUMN detail TEXT NULL;
DROP INDEX agent.notifications_run;
CREATE UNIQUE INDEX notifications_run_kind ON agent.notifications (run_id, kind);
