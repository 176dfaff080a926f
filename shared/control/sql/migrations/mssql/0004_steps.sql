-- 0004 steps: a job is a list of steps with on-success / on-failure flow (SQL Agent's job
-- steps); each step attempt is its own history row with its output; operators are notified.
-- Each statement runs on its own, in the one transaction of the migration.
SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

-- steps: the job's steps as JSON (NULL: a one-step job, its COMMAND), copied onto each run
-- when its slot is claimed, so that a redefinition never changes a run in flight.
ALTER TABLE agent.jobs ADD steps NVARCHAR(MAX) NULL;
ALTER TABLE agent.jobs ADD notify NVARCHAR(16) NULL;
ALTER TABLE agent.jobs ADD notify_webhook_url NVARCHAR(2000) NULL;
-- step: the step the run is at (1-based); failed_step: the step whose failure ended the run.
ALTER TABLE agent.runs ADD steps NVARCHAR(MAX) NULL;
ALTER TABLE agent.runs ADD step INT NOT NULL CONSTRAINT runs_step_default DEFAULT 1;
ALTER TABLE agent.runs ADD failed_step INT NULL;
-- Each attempt of a step: its step (NULL for a one-step job), its database and its output.
ALTER TABLE agent.attempts ADD step INT NULL;
ALTER TABLE agent.attempts ADD target_database NVARCHAR(128) NULL;
ALTER TABLE agent.attempts ADD [output] NVARCHAR(MAX) NULL;

-- The notification outbox: one row per run outcome to notify, written in the transaction that
-- ends the run, delivered afterwards (outside any worker's critical path) by whichever
-- process claims it first (claim_token).
CREATE TABLE agent.notifications (
    notification_id BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT notifications_pk PRIMARY KEY,
    run_id          BIGINT NOT NULL,
    job_name        NVARCHAR(64) NOT NULL,
    outcome         NVARCHAR(16) NOT NULL,
    url             NVARCHAR(2000) NOT NULL,
    status          NVARCHAR(16) NOT NULL,
    attempts        INT NOT NULL CONSTRAINT notifications_attempts_default DEFAULT 0,
    created_at      DATETIME2(6) NOT NULL,
    next_attempt_at DATETIME2(6) NOT NULL,
    claim_token     NVARCHAR(32) NULL,
    claimed_until   DATETIME2(6) NULL,
    sent_at         DATETIME2(6) NULL,
    last_error      NVARCHAR(MAX) NULL
);
-- Once per run outcome: a second enqueue of the same run does nothing.
CREATE UNIQUE INDEX notifications_run ON agent.notifications (run_id);
CREATE INDEX notifications_due ON agent.notifications (status, next_attempt_at);
