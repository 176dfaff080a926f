-- 0004 steps: a job is a list of steps with on-success / on-failure flow (SQL Agent's job
-- steps); each step attempt is its own history row with its output; operators are notified.
-- steps: the job's steps as JSON (NULL: a one-step job, its COMMAND), copied onto each run
-- when its slot is claimed, so that a redefinition never changes a run in flight.
ALTER TABLE agent_jobs ADD COLUMN steps TEXT NULL;
ALTER TABLE agent_jobs ADD COLUMN notify VARCHAR(16) NULL;
ALTER TABLE agent_jobs ADD COLUMN notify_webhook_url VARCHAR(2000) NULL;
-- step: the step the run is at (1-based); failed_step: the step whose failure ended the run.
ALTER TABLE agent_runs ADD COLUMN steps TEXT NULL;
ALTER TABLE agent_runs ADD COLUMN step INT NOT NULL DEFAULT 1;
ALTER TABLE agent_runs ADD COLUMN failed_step INT NULL;
-- Each attempt of a step: its step (NULL for a one-step job), its database and its output.
ALTER TABLE agent_attempts ADD COLUMN step INT NULL;
ALTER TABLE agent_attempts ADD COLUMN target_database VARCHAR(128) NULL;
ALTER TABLE agent_attempts ADD COLUMN output TEXT NULL;

-- The notification outbox: one row per run outcome to notify, written in the transaction that
-- ends the run, delivered afterwards (outside any worker's critical path) by whichever
-- process claims it first (claim_token).
CREATE TABLE agent_notifications (
    notification_id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          BIGINT NOT NULL,
    job_name        VARCHAR(64) NOT NULL,
    outcome         VARCHAR(16) NOT NULL,
    url             VARCHAR(2000) NOT NULL,
    status          VARCHAR(16) NOT NULL,
    attempts        INT NOT NULL DEFAULT 0,
    created_at      TEXT NOT NULL,
    next_attempt_at TEXT NOT NULL,
    claim_token     VARCHAR(32) NULL,
    claimed_until   TEXT NULL,
    sent_at         TEXT NULL,
    last_error      TEXT NULL
);
-- Once per run outcome: a second enqueue of the same run does nothing.
CREATE UNIQUE INDEX notifications_run ON agent_notifications (run_id);
CREATE INDEX notifications_due ON agent_notifications (status, next_attempt_at);
