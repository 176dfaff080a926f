-- 0022 overlap policies, catch-up and backfill (issue 33 item 5); see the PostgreSQL file of the
-- same number. This dialect's claims are named queries (shared/control/sql/sqlite.sql).
-- agent_jobs.catchup_seconds: JOB__<name>__CATCHUP_SECONDS (0: none).
ALTER TABLE agent_jobs ADD COLUMN catchup_seconds INT NOT NULL DEFAULT 0;
-- agent_jobs.requested_target_stagger_seconds: agent.add_scheduled_job's @target_stagger_seconds on
-- the servers (kept here so that every dialect's schema is the same).
ALTER TABLE agent_jobs ADD COLUMN requested_target_stagger_seconds INT NULL;
