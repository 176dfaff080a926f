-- 0006 fleet jobs: one step across many databases (Elastic Jobs' target groups). Fleet
-- targets are refused on the embedded database at sync; the columns keep every dialect's
-- schema the same. See the PostgreSQL migration for what each column means.
ALTER TABLE agent_runs ADD COLUMN parent_run_id BIGINT NULL;
ALTER TABLE agent_runs ADD COLUMN parent_token BIGINT NULL;
ALTER TABLE agent_runs ADD COLUMN target_server VARCHAR(256) NULL;
ALTER TABLE agent_runs ADD COLUMN retry_interval_seconds INT NULL;
ALTER TABLE agent_runs ADD COLUMN awaiting_targets SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE agent_runs ADD COLUMN target_parallelism INT NULL;
ALTER TABLE agent_runs ADD COLUMN next_step_on_success INT NULL;
ALTER TABLE agent_runs ADD COLUMN next_step_on_failure INT NULL;
ALTER TABLE agent_runs ADD COLUMN targets_total INT NULL;
ALTER TABLE agent_runs ADD COLUMN targets_failed INT NULL;
CREATE INDEX runs_parent ON agent_runs (parent_run_id, parent_token, status) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_awaiting_targets ON agent_runs (run_id) WHERE awaiting_targets = 1;
-- What agent.add_scheduled_job was given as @targets (SQL Server and PostgreSQL only).
ALTER TABLE agent_jobs ADD COLUMN requested_targets VARCHAR(4000) NULL;
ALTER TABLE agent_jobs ADD COLUMN requested_target_parallelism INT NULL;
