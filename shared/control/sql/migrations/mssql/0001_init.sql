-- 0001 init: the control schema (jobs, runs, attempts, job events, poison messages, local queue).
-- T-SQL for SQL Server 2016+ and Azure SQL Database (OPENJSON in the named queries needs
-- database compatibility level 130 or higher; Azure SQL databases default to 150+).
-- All timestamps are UTC DATETIME2(6), written from parameters (the agent passes "now"), never
-- from the server clock, so every dialect and every simulated clock agree. Text is NVARCHAR
-- (pyodbc binds str parameters as NVARCHAR; see shared/control/sql/mssql.sql). The schema "agent" and
-- agent.schema_version are created by the bootstrap_schema query before this file runs.
-- Each statement runs on its own, in the one transaction of the migration.

-- A failed statement dooms the whole transaction, not just itself.
SET XACT_ABORT ON;
-- Filtered indexes need these when the file is run by hand (sqlcmd defaults QUOTED_IDENTIFIER to OFF).
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

CREATE TABLE agent.state (
    state_key   NVARCHAR(64) NOT NULL CONSTRAINT state_pk PRIMARY KEY,
    state_value NVARCHAR(MAX) NOT NULL,
    updated_at  DATETIME2(6) NOT NULL
);

-- One row per configured job. next_due_at is the slot the job waits for; the tick
-- claims every job with next_due_at <= now in one statement.
CREATE TABLE agent.jobs (
    job_name        NVARCHAR(64) NOT NULL CONSTRAINT jobs_pk PRIMARY KEY,
    schedule        NVARCHAR(400) NOT NULL,
    timezone        NVARCHAR(64) NOT NULL,
    command         NVARCHAR(MAX) NOT NULL,
    target_database NVARCHAR(128) NULL,
    enabled         SMALLINT NOT NULL,
    valid           SMALLINT NOT NULL,
    config_error    NVARCHAR(MAX) NULL,
    max_attempts    INT NOT NULL,
    timeout_seconds INT NOT NULL,
    lease_seconds   INT NOT NULL,
    misfire         NVARCHAR(16) NOT NULL,
    grace_seconds   INT NOT NULL,
    overlap         NVARCHAR(16) NOT NULL,
    next_due_at     DATETIME2(6) NULL,
    configured      SMALLINT NOT NULL,
    updated_at      DATETIME2(6) NOT NULL
);
CREATE INDEX jobs_next_due_at ON agent.jobs (next_due_at) WHERE next_due_at IS NOT NULL;

-- Everything that runs is a row here: scheduled occurrences, run-now requests, one-time
-- jobs and ad-hoc tasks (job_name NULL, kind 'task'). One lifecycle, one history.
CREATE TABLE agent.runs (
    run_id            BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT runs_pk PRIMARY KEY,
    job_name          NVARCHAR(64) NULL,
    kind              NVARCHAR(16) NOT NULL,
    scheduled_for     DATETIME2(6) NOT NULL,
    status            NVARCHAR(16) NOT NULL,
    command           NVARCHAR(MAX) NOT NULL,
    target_database   NVARCHAR(128) NULL,
    task_order        INT NULL,
    overlap           NVARCHAR(16) NOT NULL,
    attempt           INT NOT NULL CONSTRAINT runs_attempt_default DEFAULT 0,
    max_attempts      INT NOT NULL,
    timeout_seconds   INT NOT NULL,
    lease_seconds     INT NOT NULL,
    token             BIGINT NOT NULL CONSTRAINT runs_token_default DEFAULT 0,
    lease_expires_at  DATETIME2(6) NULL,
    heartbeat_at      DATETIME2(6) NULL,
    runnable_at       DATETIME2(6) NOT NULL,
    created_at        DATETIME2(6) NOT NULL,
    dispatched_at     DATETIME2(6) NULL,
    started_at        DATETIME2(6) NULL,
    finished_at       DATETIME2(6) NULL,
    worker            NVARCHAR(200) NULL,
    operation_id      NVARCHAR(32) NOT NULL,
    dequeue_count     INT NULL,
    last_error_number INT NULL,
    last_error        NVARCHAR(MAX) NULL,
    note              NVARCHAR(MAX) NULL
);
-- Invariant 1: one run per (job, scheduled slot); the index arbitrates concurrent ticks.
-- Filtered: SQL Server treats NULLs as equal in a unique index, and every ad-hoc task has
-- job_name NULL. (IGNORE_DUP_KEY cannot be set on a filtered index, which is why the claim
-- query guards its insert with (UPDLOCK, HOLDLOCK) instead of ignoring duplicates.)
CREATE UNIQUE INDEX runs_job_slot ON agent.runs (job_name, scheduled_for) WHERE job_name IS NOT NULL;
CREATE INDEX runs_status_runnable ON agent.runs (status, runnable_at);
CREATE INDEX runs_job_status ON agent.runs (job_name, status);

-- Every attempt of every run: the history, with errors and timings.
CREATE TABLE agent.attempts (
    attempt_id     BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT attempts_pk PRIMARY KEY,
    run_id         BIGINT NOT NULL CONSTRAINT attempts_run_fk REFERENCES agent.runs (run_id),
    attempt        INT NOT NULL,
    token          BIGINT NOT NULL,
    worker         NVARCHAR(200) NULL,
    dequeue_count  INT NULL,
    started_at     DATETIME2(6) NOT NULL,
    finished_at    DATETIME2(6) NULL,
    outcome        NVARCHAR(20) NOT NULL,
    error_number   INT NULL,
    error_sqlstate NVARCHAR(5) NULL,
    error_message  NVARCHAR(MAX) NULL
);
CREATE INDEX attempts_run ON agent.attempts (run_id, attempt);
CREATE INDEX attempts_running ON agent.attempts (run_id) WHERE outcome = N'running';

-- Things that happened to a job outside any run (configuration found invalid, ...).
CREATE TABLE agent.job_events (
    event_id  BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT job_events_pk PRIMARY KEY,
    job_name  NVARCHAR(64) NOT NULL,
    event_at  DATETIME2(6) NOT NULL,
    kind      NVARCHAR(32) NOT NULL,
    detail    NVARCHAR(MAX) NULL
);
CREATE INDEX job_events_job ON agent.job_events (job_name, event_at);

-- Messages the app took out of circulation: body as received, every error seen.
CREATE TABLE agent.poison_messages (
    poison_id     BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT poison_messages_pk PRIMARY KEY,
    run_id        BIGINT NULL,
    message_id    NVARCHAR(100) NULL,
    body          NVARCHAR(MAX) NOT NULL,
    dequeue_count INT NOT NULL,
    reason        NVARCHAR(MAX) NOT NULL,
    errors        NVARCHAR(MAX) NOT NULL,
    poisoned_at   DATETIME2(6) NOT NULL,
    requeued_at   DATETIME2(6) NULL
);

-- The local queue of the embedded default: Azure Storage queue semantics in a table.
CREATE TABLE agent.queue_messages (
    message_id    BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT queue_messages_pk PRIMARY KEY,
    queue_name    NVARCHAR(63) NOT NULL,
    body          NVARCHAR(MAX) NOT NULL,
    dequeue_count INT NOT NULL CONSTRAINT queue_messages_dequeue_default DEFAULT 0,
    inserted_at   DATETIME2(6) NOT NULL,
    visible_at    DATETIME2(6) NOT NULL,
    pop_receipt   NVARCHAR(36) NULL
);
CREATE INDEX queue_messages_visible ON agent.queue_messages (queue_name, visible_at);
