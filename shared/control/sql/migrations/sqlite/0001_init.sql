-- 0001 init: the control schema (jobs, runs, attempts, job events, poison messages, local queue).
-- All timestamps are UTC text 'YYYY-MM-DD HH:MM:SS.SSS' (sortable as text), written from
-- parameters (the agent passes "now"), never from the database clock.
-- SQLite has no schemas: tables carry the agent_ prefix instead.

CREATE TABLE agent_state (
    state_key   VARCHAR(64) PRIMARY KEY,
    state_value TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);

-- One row per configured job. next_due_at is the slot the job waits for; the tick
-- claims every job with next_due_at <= now in one statement.
CREATE TABLE agent_jobs (
    job_name        VARCHAR(64) PRIMARY KEY,
    schedule        VARCHAR(400) NOT NULL,
    timezone        VARCHAR(64) NOT NULL,
    command         TEXT NOT NULL,
    target_database VARCHAR(128) NULL,
    enabled         SMALLINT NOT NULL,
    valid           SMALLINT NOT NULL,
    config_error    TEXT NULL,
    max_attempts    INT NOT NULL,
    timeout_seconds INT NOT NULL,
    lease_seconds   INT NOT NULL,
    misfire         VARCHAR(16) NOT NULL,
    grace_seconds   INT NOT NULL,
    overlap         VARCHAR(16) NOT NULL,
    next_due_at     TEXT NULL,
    configured      SMALLINT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX jobs_next_due_at ON agent_jobs (next_due_at) WHERE next_due_at IS NOT NULL;

-- Everything that runs is a row here: scheduled occurrences, run-now requests, one-time
-- jobs and ad-hoc tasks (job_name NULL, kind 'task'). One lifecycle, one history.
CREATE TABLE agent_runs (
    run_id            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_name          VARCHAR(64) NULL,
    kind              VARCHAR(16) NOT NULL,
    scheduled_for     TEXT NOT NULL,
    status            VARCHAR(16) NOT NULL,
    command           TEXT NOT NULL,
    target_database   VARCHAR(128) NULL,
    task_order        INT NULL,
    overlap           VARCHAR(16) NOT NULL,
    attempt           INT NOT NULL DEFAULT 0,
    max_attempts      INT NOT NULL,
    timeout_seconds   INT NOT NULL,
    lease_seconds     INT NOT NULL,
    token             BIGINT NOT NULL DEFAULT 0,
    lease_expires_at  TEXT NULL,
    heartbeat_at      TEXT NULL,
    runnable_at       TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    dispatched_at     TEXT NULL,
    started_at        TEXT NULL,
    finished_at       TEXT NULL,
    worker            VARCHAR(200) NULL,
    operation_id      VARCHAR(32) NOT NULL,
    dequeue_count     INT NULL,
    last_error_number INT NULL,
    last_error        TEXT NULL,
    note              TEXT NULL
);
-- Invariant 1: one run per (job, scheduled slot); the index arbitrates concurrent ticks.
CREATE UNIQUE INDEX runs_job_slot ON agent_runs (job_name, scheduled_for);
CREATE INDEX runs_status_runnable ON agent_runs (status, runnable_at);
CREATE INDEX runs_job_status ON agent_runs (job_name, status);

-- Every attempt of every run: the history, with errors and timings.
CREATE TABLE agent_attempts (
    attempt_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id         BIGINT NOT NULL REFERENCES agent_runs (run_id),
    attempt        INT NOT NULL,
    token          BIGINT NOT NULL,
    worker         VARCHAR(200) NULL,
    dequeue_count  INT NULL,
    started_at     TEXT NOT NULL,
    finished_at    TEXT NULL,
    outcome        VARCHAR(20) NOT NULL,
    error_number   INT NULL,
    error_sqlstate VARCHAR(5) NULL,
    error_message  TEXT NULL
);
CREATE INDEX attempts_run ON agent_attempts (run_id, attempt);
CREATE INDEX attempts_running ON agent_attempts (run_id) WHERE outcome = 'running';

-- Things that happened to a job outside any run (configuration found invalid, ...).
CREATE TABLE agent_job_events (
    event_id  INTEGER PRIMARY KEY AUTOINCREMENT,
    job_name  VARCHAR(64) NOT NULL,
    event_at  TEXT NOT NULL,
    kind      VARCHAR(32) NOT NULL,
    detail    TEXT NULL
);
CREATE INDEX job_events_job ON agent_job_events (job_name, event_at);

-- Messages the app took out of circulation: body as received, every error seen.
CREATE TABLE agent_poison_messages (
    poison_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id        BIGINT NULL,
    message_id    VARCHAR(100) NULL,
    body          TEXT NOT NULL,
    dequeue_count INT NOT NULL,
    reason        TEXT NOT NULL,
    errors        TEXT NOT NULL,
    poisoned_at   TEXT NOT NULL,
    requeued_at   TEXT NULL
);

-- The local queue of the embedded default: Azure Storage queue semantics in a table.
CREATE TABLE agent_queue_messages (
    message_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    queue_name    VARCHAR(63) NOT NULL,
    body          TEXT NOT NULL,
    dequeue_count INT NOT NULL DEFAULT 0,
    inserted_at   TEXT NOT NULL,
    visible_at    TEXT NOT NULL,
    pop_receipt   VARCHAR(36) NULL
);
CREATE INDEX queue_messages_visible ON agent_queue_messages (queue_name, visible_at);
