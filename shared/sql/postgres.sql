-- Named queries for PostgreSQL (through pyodbc and the PostgreSQL ODBC driver).
-- Format: "-- name --", a one-line description, then the query. Parameters are :name;
-- the store turns them into qmark placeholders. Timestamps are UTC, naive, always passed
-- in (CAST(:x AS timestamp)): the agent's clock, never the server's.

-- bootstrap_schema --
-- Create the agent schema and the schema version table if missing.
CREATE SCHEMA IF NOT EXISTS agent;
CREATE TABLE IF NOT EXISTS agent.schema_version (
    version     INT PRIMARY KEY,
    description VARCHAR(200) NOT NULL,
    applied_at  TIMESTAMP NOT NULL
);

-- lock_migrations --
-- Serialise concurrent init-db calls for the rest of the transaction.
SELECT pg_advisory_xact_lock(7428001) AS locked;

-- get_schema_version --
-- Highest applied migration (0 when none).
SELECT COALESCE(MAX(version), 0) AS version FROM agent.schema_version;

-- record_migration --
-- Remember that a migration was applied.
INSERT INTO agent.schema_version (version, description, applied_at)
VALUES (:version, :description, CAST(:now AS timestamp));

-- schema_exists --
-- Whether the schema version table exists (1 row) or not (0 rows).
SELECT 1 AS present FROM information_schema.tables
WHERE table_schema = 'agent' AND table_name = 'schema_version';

-- get_state --
-- Read one engine state value (e.g. the hash of the job settings last synced).
SELECT state_value FROM agent.state WHERE state_key = :state_key;

-- set_state --
-- Write one engine state value.
INSERT INTO agent.state (state_key, state_value, updated_at)
VALUES (:state_key, :state_value, CAST(:now AS timestamp))
ON CONFLICT (state_key) DO UPDATE SET state_value = EXCLUDED.state_value, updated_at = EXCLUDED.updated_at;

-- record_config_events --
-- Record each job whose configuration became invalid (or changed its error) since the last sync.
INSERT INTO agent.job_events (job_name, event_at, kind, detail)
SELECT j.job_name, CAST(:now AS timestamp), 'config_invalid', j.config_error
FROM json_to_recordset(CAST(:jobs AS json)) AS j(job_name VARCHAR, valid INT, config_error TEXT)
WHERE j.valid = 0
  AND NOT EXISTS (SELECT 1 FROM agent.jobs c
                  WHERE c.job_name = j.job_name AND c.valid = 0 AND c.configured = 1
                    AND c.config_error = j.config_error);

-- upsert_jobs --
-- Write every configured job in one statement; a new job, a changed schedule or time zone, or a job re-enabled starts from its new next_due_at.
INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                        config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                        grace_seconds, overlap, next_due_at, configured, updated_at)
SELECT j.job_name, j.schedule, j.timezone, j.command, j.target_database, j.enabled, j.valid,
       j.config_error, j.max_attempts, j.timeout_seconds, j.lease_seconds, j.misfire,
       j.grace_seconds, j.overlap, CAST(j.next_due_at AS timestamp), 1, CAST(:now AS timestamp)
FROM json_to_recordset(CAST(:jobs AS json)) AS j(
    job_name VARCHAR, schedule VARCHAR, timezone VARCHAR, command TEXT, target_database VARCHAR,
    enabled INT, valid INT, config_error TEXT, max_attempts INT, timeout_seconds INT,
    lease_seconds INT, misfire VARCHAR, grace_seconds INT, overlap VARCHAR, next_due_at VARCHAR)
ORDER BY j.job_name
ON CONFLICT (job_name) DO UPDATE SET
    next_due_at = CASE
        WHEN agent.jobs.schedule <> EXCLUDED.schedule
          OR agent.jobs.timezone <> EXCLUDED.timezone
          OR agent.jobs.enabled <> EXCLUDED.enabled
          OR agent.jobs.valid <> EXCLUDED.valid
          OR agent.jobs.configured = 0
        THEN EXCLUDED.next_due_at ELSE agent.jobs.next_due_at END,
    schedule = EXCLUDED.schedule,
    timezone = EXCLUDED.timezone,
    command = EXCLUDED.command,
    target_database = EXCLUDED.target_database,
    enabled = EXCLUDED.enabled,
    valid = EXCLUDED.valid,
    config_error = EXCLUDED.config_error,
    max_attempts = EXCLUDED.max_attempts,
    timeout_seconds = EXCLUDED.timeout_seconds,
    lease_seconds = EXCLUDED.lease_seconds,
    misfire = EXCLUDED.misfire,
    grace_seconds = EXCLUDED.grace_seconds,
    overlap = EXCLUDED.overlap,
    configured = 1,
    updated_at = EXCLUDED.updated_at;

-- unconfigure_missing_jobs --
-- Jobs no longer in the settings stop being scheduled; their history stays.
UPDATE agent.jobs SET configured = 0, next_due_at = NULL, updated_at = CAST(:now AS timestamp)
WHERE configured = 1
  AND job_name NOT IN (SELECT j.job_name FROM json_to_recordset(CAST(:jobs AS json)) AS j(job_name VARCHAR));

-- expire_leases --
-- Take back every run whose holder stopped heartbeating (or whose message was lost), fencing it with a new token.
UPDATE agent.runs SET
    status = CASE WHEN status = 'queued' OR attempt < max_attempts THEN 'pending' ELSE 'failed' END,
    token = token + 1,
    lease_expires_at = NULL,
    runnable_at = CAST(:now AS timestamp),
    finished_at = CASE WHEN status = 'running' AND attempt >= max_attempts
                       THEN CAST(:now AS timestamp) ELSE NULL END,
    last_error = CASE WHEN status = 'running'
                      THEN 'lease expired: worker ' || COALESCE(worker, '?') || ' stopped renewing its lease'
                      ELSE 'dispatch lease expired: the message was not picked up in time; dispatching again' END
WHERE status IN ('queued', 'running') AND lease_expires_at < CAST(:now AS timestamp)
RETURNING run_id, job_name, kind, status, attempt, token, operation_id, scheduled_for,
          CASE WHEN last_error LIKE 'lease expired:%' THEN 1 ELSE 0 END AS was_running;

-- close_dead_attempts --
-- Mark attempts still 'running' whose run has moved on to a newer token: their worker died or was fenced.
UPDATE agent.attempts SET outcome = 'lease_expired', finished_at = CAST(:now AS timestamp),
    error_message = 'lease expired: the worker stopped renewing its lease (killed, hung or cut off)'
WHERE outcome = 'running'
  AND token < (SELECT r.token FROM agent.runs r WHERE r.run_id = agent.attempts.run_id);

-- claim_due_runs --
-- Claim one run per due job in one statement; the unique (job_name, scheduled_for) key arbitrates between concurrent ticks; misfire and overlap decided here.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note)
SELECT d.job_name, 'scheduled', d.next_due_at, d.decision, d.command, d.target_database, d.overlap,
       d.max_attempts, d.timeout_seconds, d.lease_seconds, CAST(:now AS timestamp),
       CAST(:now AS timestamp),
       CASE WHEN d.decision = 'skipped' THEN CAST(:now AS timestamp) END,
       md5(random()::text || clock_timestamp()::text || d.job_name),
       CASE d.reason
           WHEN 'misfire-skip' THEN 'misfire: slot missed by more than the misfire threshold; policy skip'
           WHEN 'misfire-grace' THEN 'misfire: slot older than its grace period; skipped'
           WHEN 'misfire-catch-up' THEN 'misfire: caught up late, once'
           WHEN 'overlap' THEN 'overlap: the previous run of this job was still in flight; policy skip'
       END
FROM (
    SELECT r.*, CASE WHEN r.reason IN ('misfire-skip', 'misfire-grace', 'overlap') THEN 'skipped'
                     ELSE 'pending' END AS decision
    FROM (
        SELECT j.*,
               CASE WHEN j.next_due_at < CAST(:late_cutoff AS timestamp) AND j.misfire = 'skip' THEN 'misfire-skip'
                    WHEN j.next_due_at < CAST(:late_cutoff AS timestamp)
                         AND j.next_due_at + j.grace_seconds * INTERVAL '1 second' < CAST(:now AS timestamp)
                    THEN 'misfire-grace'
                    WHEN j.overlap = 'skip' AND EXISTS (
                         SELECT 1 FROM agent.runs a
                         WHERE a.job_name = j.job_name AND a.status IN ('pending', 'queued', 'running')) THEN 'overlap'
                    WHEN j.next_due_at < CAST(:late_cutoff AS timestamp) THEN 'misfire-catch-up'
                    ELSE 'on-time' END AS reason
        FROM agent.jobs j
        WHERE j.next_due_at <= CAST(:now AS timestamp) AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
    ) AS r
) AS d
ORDER BY d.job_name
ON CONFLICT (job_name, scheduled_for) DO NOTHING
RETURNING run_id, job_name, scheduled_for, status, note, operation_id, token;

-- select_due_schedules --
-- The distinct schedules of jobs whose next slot has come (claimed by this tick or an earlier one): their next slot is computed in Python, once per schedule.
SELECT DISTINCT schedule, timezone
FROM agent.jobs
WHERE next_due_at <= CAST(:now AS timestamp) AND enabled = 1 AND valid = 1 AND configured = 1;

-- advance_due_jobs --
-- Move every due job to the next slot of its schedule; a job a concurrent tick already moved is no longer due and stays as it is.
UPDATE agent.jobs AS j SET next_due_at = CAST(a.next_due_at AS timestamp)
FROM json_to_recordset(CAST(:advances AS json)) AS a(schedule VARCHAR, timezone VARCHAR, next_due_at VARCHAR)
WHERE j.schedule = a.schedule AND j.timezone = a.timezone
  AND j.next_due_at <= CAST(:now AS timestamp) AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1;

-- dispatch_runs --
-- Hand runnable runs to the queue: each gets a new, larger token and a dispatch lease; overlap 'queue', task order and the concurrency cap are honoured.
UPDATE agent.runs AS r SET
    status = 'queued',
    token = r.token + 1,
    lease_expires_at = CAST(:lease_until AS timestamp),
    dispatched_at = CAST(:now AS timestamp)
WHERE r.run_id IN (
    SELECT c.run_id FROM agent.runs c
    WHERE c.status = 'pending' AND c.runnable_at <= CAST(:now AS timestamp)
      AND (c.overlap <> 'queue' OR c.job_name IS NULL OR NOT EXISTS (
            SELECT 1 FROM agent.runs o
            WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
              AND (o.status IN ('queued', 'running')
                   OR (o.status = 'pending' AND o.scheduled_for < c.scheduled_for))))
      AND (c.task_order IS NULL OR NOT EXISTS (
            SELECT 1 FROM agent.runs t
            WHERE t.kind = 'task' AND t.task_order < c.task_order
              AND t.status IN ('pending', 'queued', 'running')))
    ORDER BY c.runnable_at, c.run_id
    LIMIT GREATEST(0, CAST(:max_in_flight AS INT)
                      - (SELECT COUNT(*) FROM agent.runs f WHERE f.status IN ('queued', 'running')))
    FOR UPDATE SKIP LOCKED)
RETURNING r.run_id, r.token, r.job_name, r.kind, r.operation_id, r.scheduled_for, r.attempt;

-- release_dispatch --
-- Put back runs whose queue message could not be sent (a JSON array of {run_id, token}); a later tick dispatches them again.
UPDATE agent.runs AS r SET status = 'pending', lease_expires_at = NULL
FROM json_to_recordset(CAST(:runs AS json)) AS x(run_id BIGINT, token BIGINT)
WHERE r.run_id = x.run_id AND r.token = x.token AND r.status = 'queued';

-- start_run --
-- Fenced start: only the holder of the current token starts a queued run; returns what the worker needs.
UPDATE agent.runs SET
    status = 'running',
    attempt = attempt + 1,
    started_at = CAST(:now AS timestamp),
    heartbeat_at = CAST(:now AS timestamp),
    lease_expires_at = CAST(:now AS timestamp) + lease_seconds * INTERVAL '1 second',
    worker = :worker,
    dequeue_count = :dequeue_count
WHERE run_id = :run_id AND token = :token AND status = 'queued'
RETURNING run_id, job_name, kind, command, target_database, attempt, max_attempts, token,
          timeout_seconds, lease_seconds, operation_id, scheduled_for, started_at;

-- insert_attempt --
-- Open the history row of an attempt just started.
INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
VALUES (:run_id, :attempt, :token, :worker, :dequeue_count, CAST(:now AS timestamp), 'running');

-- get_run --
-- One run, for the executor's explanation of a message it will not run, and for the CLI.
SELECT run_id, job_name, kind, scheduled_for, status, command, target_database, task_order,
       attempt, max_attempts, token, lease_expires_at, heartbeat_at, runnable_at, created_at,
       dispatched_at, started_at, finished_at, worker, operation_id, dequeue_count,
       last_error_number, last_error, note
FROM agent.runs WHERE run_id = :run_id;

-- heartbeat_run --
-- Renew the lease of a running run; zero rows means the lease was taken over (or the run cancelled).
UPDATE agent.runs SET heartbeat_at = CAST(:now AS timestamp),
    lease_expires_at = CAST(:now AS timestamp) + lease_seconds * INTERVAL '1 second'
WHERE run_id = :run_id AND token = :token AND status = 'running';

-- complete_run --
-- Fenced completion: succeeds only for the current token; run in the same transaction as control-database work.
UPDATE agent.runs SET status = 'succeeded', finished_at = CAST(:now AS timestamp),
    lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
WHERE run_id = :run_id AND token = :token AND status = 'running';

-- finish_attempt --
-- Close the history row of an attempt with its outcome and error.
UPDATE agent.attempts SET outcome = :outcome, finished_at = CAST(:now AS timestamp),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running';

-- fail_run --
-- Fenced failure: back to pending after a backoff while attempts remain, else failed.
UPDATE agent.runs SET
    status = CASE WHEN attempt < max_attempts THEN 'pending' ELSE 'failed' END,
    runnable_at = CAST(:retry_at AS timestamp),
    finished_at = CASE WHEN attempt < max_attempts THEN NULL ELSE CAST(:now AS timestamp) END,
    lease_expires_at = NULL,
    last_error_number = :error_number,
    last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING status, attempt, max_attempts;

-- requeue_transient --
-- Fenced: a transient failure hands the run back to the queue's redelivery (same token), with a dispatch lease in case the message is lost.
UPDATE agent.runs SET status = 'queued', lease_expires_at = CAST(:lease_until AS timestamp),
    last_error_number = :error_number, last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running';

-- poison_run --
-- Fenced: the current message of this run was poisoned; the run ends poisoned.
UPDATE agent.runs SET status = 'poisoned', finished_at = CAST(:now AS timestamp),
    lease_expires_at = NULL, last_error = :reason
WHERE run_id = :run_id AND token = :token AND status IN ('queued', 'running');

-- list_run_errors --
-- Every error seen by a run's attempts, oldest first (kept with a poison message).
SELECT attempt, token, dequeue_count, started_at, finished_at, outcome, error_number,
       error_sqlstate, error_message
FROM agent.attempts WHERE run_id = :run_id ORDER BY attempt_id;

-- insert_poison --
-- Keep a poisoned message: body as received, dequeue count, every error, the run.
INSERT INTO agent.poison_messages (run_id, message_id, body, dequeue_count, reason, errors, poisoned_at)
VALUES (:run_id, :message_id, :body, :dequeue_count, :reason, :errors, CAST(:now AS timestamp))
RETURNING poison_id;

-- list_poison --
-- Poison messages, newest first.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages ORDER BY poison_id DESC LIMIT :limit;

-- get_poison --
-- One poison message.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages WHERE poison_id = :poison_id;

-- requeue_run --
-- Give a poisoned or failed run one more attempt: back to pending; the next dispatch gives it a new token.
UPDATE agent.runs SET status = 'pending', runnable_at = CAST(:now AS timestamp), finished_at = NULL,
    lease_expires_at = NULL, max_attempts = attempt + 1,
    note = 'requeued by operator'
WHERE run_id = :run_id AND status IN ('poisoned', 'failed');

-- mark_poison_requeued --
-- Remember when a poison message was requeued.
UPDATE agent.poison_messages SET requeued_at = CAST(:now AS timestamp) WHERE poison_id = :poison_id;

-- insert_manual_run --
-- run-now: a run of a job right away, keyed by the request time; the job's overlap policy applies.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note)
SELECT j.job_name, 'manual', CAST(:now AS timestamp), d.decision, j.command, j.target_database,
       j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, CAST(:now AS timestamp),
       CAST(:now AS timestamp), CASE WHEN d.decision = 'skipped' THEN CAST(:now AS timestamp) END,
       :operation_id,
       CASE WHEN d.decision = 'skipped'
            THEN 'overlap: the previous run of this job was still in flight; policy skip'
            ELSE 'run-now' END
FROM agent.jobs j
CROSS JOIN LATERAL (
    SELECT CASE WHEN j.overlap = 'skip' AND EXISTS (
                SELECT 1 FROM agent.runs a
                WHERE a.job_name = j.job_name AND a.status IN ('pending', 'queued', 'running'))
           THEN 'skipped' ELSE 'pending' END AS decision) AS d
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
RETURNING run_id, job_name, status, note, operation_id;

-- insert_task --
-- submit: an ad-hoc task; runs after every task with a lower order has finished.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                        overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                        created_at, operation_id, note)
VALUES (NULL, 'task', CAST(:now AS timestamp), 'pending', :command, :target_database, :task_order,
        'allow', :max_attempts, :timeout_seconds, :lease_seconds, CAST(:now AS timestamp),
        CAST(:now AS timestamp), :operation_id, 'submitted')
RETURNING run_id, status, operation_id;

-- cancel_run --
-- Cancel a run not yet finished; the token bump fences a worker still running it (its heartbeat stops the work).
UPDATE agent.runs SET status = 'cancelled', token = token + 1, finished_at = CAST(:now AS timestamp),
    lease_expires_at = NULL, note = 'cancelled by operator'
WHERE run_id = :run_id AND status IN ('pending', 'queued', 'running');

-- list_jobs --
-- Every known job with its configuration state, next slot and latest run.
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at
FROM agent.jobs j
LEFT JOIN LATERAL (
    SELECT r.run_id, r.status, r.scheduled_for, r.finished_at FROM agent.runs r
    WHERE r.job_name = j.job_name ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1) AS l ON TRUE
ORDER BY j.job_name;

-- list_history --
-- Runs, newest first, optionally of one job.
SELECT run_id, job_name, kind, scheduled_for, status, attempt, max_attempts, token, created_at,
       started_at, finished_at, worker, last_error_number, last_error, note, operation_id
FROM agent.runs
WHERE (CAST(:job_name AS VARCHAR) IS NULL OR job_name = CAST(:job_name AS VARCHAR))
ORDER BY run_id DESC LIMIT :limit;

-- list_attempts --
-- Attempts of the runs in a JSON array of run ids.
SELECT a.run_id, a.attempt, a.token, a.worker, a.dequeue_count, a.started_at, a.finished_at,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message
FROM agent.attempts a
WHERE a.run_id IN (SELECT CAST(x.value AS BIGINT) FROM json_array_elements_text(CAST(:run_ids AS json)) AS x(value))
ORDER BY a.run_id, a.attempt_id;

-- list_job_events --
-- Job events (invalid configuration, ...), newest first, optionally of one job.
SELECT event_id, job_name, event_at, kind, detail FROM agent.job_events
WHERE (CAST(:job_name AS VARCHAR) IS NULL OR job_name = CAST(:job_name AS VARCHAR))
ORDER BY event_id DESC LIMIT :limit;

-- list_stuck_runs --
-- Reconciliation: runs in flight past their lease, or runnable but not dispatched for longer than the given age.
SELECT run_id, job_name, kind, status, scheduled_for, runnable_at, lease_expires_at, token, attempt
FROM agent.runs
WHERE (status IN ('queued', 'running') AND lease_expires_at < CAST(:now AS timestamp))
   OR (status = 'pending' AND runnable_at < CAST(:stale_before AS timestamp))
ORDER BY run_id;

-- queue_send --
-- Local queue: enqueue message bodies (a JSON array of strings), visible at once.
INSERT INTO agent.queue_messages (queue_name, body, dequeue_count, inserted_at, visible_at)
SELECT :queue_name, b.value, 0, CAST(:now AS timestamp), CAST(:now AS timestamp)
FROM json_array_elements_text(CAST(:bodies AS json)) WITH ORDINALITY AS b(value, position)
ORDER BY b.position;

-- queue_receive --
-- Local queue: take up to :limit visible messages, hide them for the visibility timeout and count the delivery.
UPDATE agent.queue_messages AS m SET
    dequeue_count = m.dequeue_count + 1,
    visible_at = CAST(:invisible_until AS timestamp),
    pop_receipt = :pop_receipt
WHERE m.message_id IN (
    SELECT c.message_id FROM agent.queue_messages c
    WHERE c.queue_name = :queue_name AND c.visible_at <= CAST(:now AS timestamp)
    ORDER BY c.message_id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED)
RETURNING m.message_id, m.body, m.dequeue_count, m.pop_receipt, m.inserted_at;

-- queue_delete --
-- Local queue: delete a message, only with the receipt of its latest delivery.
DELETE FROM agent.queue_messages WHERE message_id = :message_id AND pop_receipt = :pop_receipt;

-- queue_release --
-- Local queue: make a message visible again after a failed delivery.
UPDATE agent.queue_messages SET visible_at = CAST(:visible_at AS timestamp)
WHERE message_id = :message_id AND pop_receipt = :pop_receipt;

-- queue_depth --
-- Local queue: messages in a queue, and how many are visible now.
SELECT COUNT(*) AS total,
       COALESCE(SUM(CASE WHEN visible_at <= CAST(:now AS timestamp) THEN 1 ELSE 0 END), 0) AS visible
FROM agent.queue_messages WHERE queue_name = :queue_name;

-- count_runs_by_status --
-- Runs per status (the local runner's idle check and the doctor).
SELECT status, COUNT(*) AS runs FROM agent.runs GROUP BY status;

-- delete_run --
-- Remove a run and its attempts (the doctor's scratch run only).
DELETE FROM agent.attempts WHERE run_id = :run_id;
DELETE FROM agent.runs WHERE run_id = :run_id;
