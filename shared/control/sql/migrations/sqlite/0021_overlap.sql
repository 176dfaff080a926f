-- 0021 overlap policies, catch-up and backfill (issue 33 item 5); see the PostgreSQL file of the
-- same number. This dialect's claims are named queries (shared/control/sql/sqlite.sql).
-- agent_jobs.catchup_seconds: JOB__<name>__CATCHUP_SECONDS (0: none).
ALTER TABLE agent_jobs ADD COLUMN catchup_seconds INT NOT NULL DEFAULT 0;
