-- Named queries for SQLite (the embedded default, standard library sqlite3).
-- Format: "-- name --", a one-line description, then the query. Parameters are :name.
-- Timestamps are UTC text 'YYYY-MM-DD HH:MM:SS.SSS', always passed in; interval
-- arithmetic goes through julianday() and back with strftime('%Y-%m-%d %H:%M:%f').
-- Writers are serialised by SQLite itself (transactions start with BEGIN IMMEDIATE),
-- which is why there is no FOR UPDATE SKIP LOCKED here.

-- bootstrap_schema --
-- Create the schema version table if missing.
CREATE TABLE IF NOT EXISTS agent_schema_version (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  TEXT NOT NULL
);

-- lock_migrations --
-- SQLite serialises writers already (BEGIN IMMEDIATE); nothing more to lock.
SELECT 1 AS locked;

-- get_schema_version --
-- Highest applied migration (0 when none).
SELECT COALESCE(MAX(version), 0) AS version FROM agent_schema_version;

-- record_migration --
-- Remember that a migration was applied.
INSERT INTO agent_schema_version (version, description, applied_at)
VALUES (:version, :description, :now);

-- schema_exists --
-- Whether the schema version table exists (1 row) or not (0 rows).
SELECT 1 AS present FROM sqlite_master WHERE type = 'table' AND name = 'agent_schema_version';

-- get_state --
-- Read one engine state value (e.g. the hash of the job settings last synced).
SELECT state_value FROM agent_state WHERE state_key = :state_key;

-- set_state --
-- Write one engine state value.
INSERT INTO agent_state (state_key, state_value, updated_at)
VALUES (:state_key, :state_value, :now)
ON CONFLICT (state_key) DO UPDATE SET state_value = excluded.state_value, updated_at = excluded.updated_at;

-- record_config_events --
-- Record each job whose configuration became invalid (or changed its error) since the last sync.
INSERT INTO agent_job_events (job_name, event_at, kind, detail)
SELECT json_extract(j.value, '$.job_name'), :now, 'config_invalid', json_extract(j.value, '$.config_error')
FROM json_each(:jobs) AS j
WHERE json_extract(j.value, '$.valid') = 0
  AND NOT EXISTS (SELECT 1 FROM agent_jobs c
                  WHERE c.job_name = json_extract(j.value, '$.job_name') AND c.valid = 0
                    AND c.configured = 1 AND c.config_error = json_extract(j.value, '$.config_error'));

-- upsert_jobs --
-- Write every configured job in one statement; a new job, a changed schedule or time zone, or a job re-enabled starts from its new next_due_at.
INSERT INTO agent_jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                        config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                        grace_seconds, overlap, next_due_at, configured, updated_at)
SELECT json_extract(j.value, '$.job_name'), json_extract(j.value, '$.schedule'),
       json_extract(j.value, '$.timezone'), json_extract(j.value, '$.command'),
       json_extract(j.value, '$.target_database'), json_extract(j.value, '$.enabled'),
       json_extract(j.value, '$.valid'), json_extract(j.value, '$.config_error'),
       json_extract(j.value, '$.max_attempts'), json_extract(j.value, '$.timeout_seconds'),
       json_extract(j.value, '$.lease_seconds'), json_extract(j.value, '$.misfire'),
       json_extract(j.value, '$.grace_seconds'), json_extract(j.value, '$.overlap'),
       json_extract(j.value, '$.next_due_at'), 1, :now
FROM json_each(:jobs) AS j
WHERE TRUE
ON CONFLICT (job_name) DO UPDATE SET
    next_due_at = CASE
        WHEN agent_jobs.schedule <> excluded.schedule
          OR agent_jobs.timezone <> excluded.timezone
          OR agent_jobs.enabled <> excluded.enabled
          OR agent_jobs.valid <> excluded.valid
          OR agent_jobs.configured = 0
        THEN excluded.next_due_at ELSE agent_jobs.next_due_at END,
    schedule = excluded.schedule,
    timezone = excluded.timezone,
    command = excluded.command,
    target_database = excluded.target_database,
    enabled = excluded.enabled,
    valid = excluded.valid,
    config_error = excluded.config_error,
    max_attempts = excluded.max_attempts,
    timeout_seconds = excluded.timeout_seconds,
    lease_seconds = excluded.lease_seconds,
    misfire = excluded.misfire,
    grace_seconds = excluded.grace_seconds,
    overlap = excluded.overlap,
    configured = 1,
    updated_at = excluded.updated_at;

-- unconfigure_missing_jobs --
-- Jobs no longer in the settings stop being scheduled; their history stays.
UPDATE agent_jobs SET configured = 0, next_due_at = NULL, updated_at = :now
WHERE configured = 1
  AND job_name NOT IN (SELECT json_extract(j.value, '$.job_name') FROM json_each(:jobs) AS j);

-- expire_leases --
-- Take back every run whose holder stopped heartbeating (or whose message was lost), fencing it with a new token.
UPDATE agent_runs SET
    status = CASE WHEN status = 'queued' OR attempt < max_attempts THEN 'pending' ELSE 'failed' END,
    token = token + 1,
    lease_expires_at = NULL,
    runnable_at = :now,
    finished_at = CASE WHEN status = 'running' AND attempt >= max_attempts THEN :now ELSE NULL END,
    last_error = CASE WHEN status = 'running'
                      THEN 'lease expired: worker ' || COALESCE(worker, '?') || ' stopped renewing its lease'
                      ELSE 'dispatch lease expired: the message was not picked up in time; dispatching again' END
WHERE status IN ('queued', 'running') AND lease_expires_at < :now
RETURNING run_id, job_name, kind, status, attempt, token, operation_id, scheduled_for,
          CASE WHEN last_error LIKE 'lease expired:%' THEN 1 ELSE 0 END AS was_running;

-- close_dead_attempts --
-- Mark attempts still 'running' whose run has moved on to a newer token: their worker died or was fenced.
UPDATE agent_attempts SET outcome = 'lease_expired', finished_at = :now,
    error_message = 'lease expired: the worker stopped renewing its lease (killed, hung or cut off)'
WHERE outcome = 'running'
  AND token < (SELECT r.token FROM agent_runs r WHERE r.run_id = agent_attempts.run_id);

-- claim_due_runs --
-- Claim one run per due job in one statement; the unique (job_name, scheduled_for) key arbitrates between concurrent ticks; misfire and overlap decided here.
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note)
SELECT d.job_name, 'scheduled', d.next_due_at, d.decision, d.command, d.target_database, d.overlap,
       d.max_attempts, d.timeout_seconds, d.lease_seconds, :now, :now,
       CASE WHEN d.decision = 'skipped' THEN :now END,
       lower(hex(randomblob(16))),
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
               CASE WHEN j.next_due_at < :late_cutoff AND j.misfire = 'skip' THEN 'misfire-skip'
                    WHEN j.next_due_at < :late_cutoff
                         AND julianday(j.next_due_at) + j.grace_seconds / 86400.0 < julianday(:now) THEN 'misfire-grace'
                    WHEN j.overlap = 'skip' AND EXISTS (
                         SELECT 1 FROM agent_runs a
                         WHERE a.job_name = j.job_name AND a.status IN ('pending', 'queued', 'running')) THEN 'overlap'
                    WHEN j.next_due_at < :late_cutoff THEN 'misfire-catch-up'
                    ELSE 'on-time' END AS reason
        FROM agent_jobs j
        WHERE j.next_due_at <= :now AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
    ) AS r
) AS d
WHERE TRUE
ORDER BY d.job_name
ON CONFLICT (job_name, scheduled_for) DO NOTHING
RETURNING run_id, job_name, scheduled_for, status, note, operation_id, token;

-- select_due_schedules --
-- The distinct schedules of jobs whose next slot has come (claimed by this tick or an earlier one): their next slot is computed in Python, once per schedule.
SELECT DISTINCT schedule, timezone
FROM agent_jobs
WHERE next_due_at <= :now AND enabled = 1 AND valid = 1 AND configured = 1;

-- advance_due_jobs --
-- Move every due job to the next slot of its schedule; a job a concurrent tick already moved is no longer due and stays as it is.
UPDATE agent_jobs SET next_due_at = a.next_due_at
FROM (SELECT json_extract(x.value, '$.schedule') AS schedule,
             json_extract(x.value, '$.timezone') AS timezone,
             json_extract(x.value, '$.next_due_at') AS next_due_at
      FROM json_each(:advances) AS x) AS a
WHERE agent_jobs.schedule = a.schedule AND agent_jobs.timezone = a.timezone
  AND agent_jobs.next_due_at <= :now AND agent_jobs.enabled = 1 AND agent_jobs.valid = 1
  AND agent_jobs.configured = 1;

-- dispatch_runs --
-- Hand runnable runs to the queue: each gets a new, larger token and a dispatch lease; overlap 'queue', task order and the concurrency cap are honoured.
UPDATE agent_runs SET
    status = 'queued',
    token = token + 1,
    lease_expires_at = :lease_until,
    dispatched_at = :now
WHERE run_id IN (
    SELECT c.run_id FROM agent_runs c
    WHERE c.status = 'pending' AND c.runnable_at <= :now
      AND (c.overlap <> 'queue' OR c.job_name IS NULL OR NOT EXISTS (
            SELECT 1 FROM agent_runs o
            WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
              AND (o.status IN ('queued', 'running')
                   OR (o.status = 'pending' AND o.scheduled_for < c.scheduled_for))))
      AND (c.task_order IS NULL OR NOT EXISTS (
            SELECT 1 FROM agent_runs t
            WHERE t.kind = 'task' AND t.task_order < c.task_order
              AND t.status IN ('pending', 'queued', 'running')))
    ORDER BY c.runnable_at, c.run_id
    LIMIT max(0, :max_in_flight - (SELECT COUNT(*) FROM agent_runs f WHERE f.status IN ('queued', 'running'))))
RETURNING run_id, token, job_name, kind, operation_id, scheduled_for, attempt;

-- release_dispatch --
-- Put back runs whose queue message could not be sent (a JSON array of {run_id, token}); a later tick dispatches them again.
UPDATE agent_runs SET status = 'pending', lease_expires_at = NULL
FROM (SELECT json_extract(x.value, '$.run_id') AS run_id, json_extract(x.value, '$.token') AS token
      FROM json_each(:runs) AS x) AS r
WHERE agent_runs.run_id = r.run_id AND agent_runs.token = r.token AND agent_runs.status = 'queued';

-- start_run --
-- Fenced start: only the holder of the current token starts a queued run; returns what the worker needs.
UPDATE agent_runs SET
    status = 'running',
    attempt = attempt + 1,
    started_at = :now,
    heartbeat_at = :now,
    lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', julianday(:now) + lease_seconds / 86400.0),
    worker = :worker,
    dequeue_count = :dequeue_count
WHERE run_id = :run_id AND token = :token AND status = 'queued'
RETURNING run_id, job_name, kind, command, target_database, attempt, max_attempts, token,
          timeout_seconds, lease_seconds, operation_id, scheduled_for, started_at;

-- insert_attempt --
-- Open the history row of an attempt just started.
INSERT INTO agent_attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
VALUES (:run_id, :attempt, :token, :worker, :dequeue_count, :now, 'running');

-- get_run --
-- One run, for the executor's explanation of a message it will not run, and for the CLI.
SELECT run_id, job_name, kind, scheduled_for, status, command, target_database, task_order,
       attempt, max_attempts, token, lease_expires_at, heartbeat_at, runnable_at, created_at,
       dispatched_at, started_at, finished_at, worker, operation_id, dequeue_count,
       last_error_number, last_error, note
FROM agent_runs WHERE run_id = :run_id;

-- heartbeat_run --
-- Renew the lease of a running run; zero rows means the lease was taken over (or the run cancelled).
UPDATE agent_runs SET heartbeat_at = :now,
    lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', julianday(:now) + lease_seconds / 86400.0)
WHERE run_id = :run_id AND token = :token AND status = 'running';

-- complete_run --
-- Fenced completion: succeeds only for the current token; run in the same transaction as control-database work.
UPDATE agent_runs SET status = 'succeeded', finished_at = :now,
    lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
WHERE run_id = :run_id AND token = :token AND status = 'running';

-- finish_attempt --
-- Close the history row of an attempt with its outcome and error.
UPDATE agent_attempts SET outcome = :outcome, finished_at = :now,
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running';

-- fail_run --
-- Fenced failure: back to pending after a backoff while attempts remain, else failed.
UPDATE agent_runs SET
    status = CASE WHEN attempt < max_attempts THEN 'pending' ELSE 'failed' END,
    runnable_at = :retry_at,
    finished_at = CASE WHEN attempt < max_attempts THEN NULL ELSE :now END,
    lease_expires_at = NULL,
    last_error_number = :error_number,
    last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING status, attempt, max_attempts;

-- requeue_transient --
-- Fenced: a transient failure hands the run back to the queue's redelivery (same token), with a dispatch lease in case the message is lost.
UPDATE agent_runs SET status = 'queued', lease_expires_at = :lease_until,
    last_error_number = :error_number, last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running';

-- poison_run --
-- Fenced: the current message of this run was poisoned; the run ends poisoned.
UPDATE agent_runs SET status = 'poisoned', finished_at = :now,
    lease_expires_at = NULL, last_error = :reason
WHERE run_id = :run_id AND token = :token AND status IN ('queued', 'running');

-- list_run_errors --
-- Every error seen by a run's attempts, oldest first (kept with a poison message).
SELECT attempt, token, dequeue_count, started_at, finished_at, outcome, error_number,
       error_sqlstate, error_message
FROM agent_attempts WHERE run_id = :run_id ORDER BY attempt_id;

-- insert_poison --
-- Keep a poisoned message: body as received, dequeue count, every error, the run.
INSERT INTO agent_poison_messages (run_id, message_id, body, dequeue_count, reason, errors, poisoned_at)
VALUES (:run_id, :message_id, :body, :dequeue_count, :reason, :errors, :now)
RETURNING poison_id;

-- list_poison --
-- Poison messages, newest first.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent_poison_messages ORDER BY poison_id DESC LIMIT :limit;

-- get_poison --
-- One poison message.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent_poison_messages WHERE poison_id = :poison_id;

-- requeue_run --
-- Give a poisoned or failed run one more attempt: back to pending; the next dispatch gives it a new token.
UPDATE agent_runs SET status = 'pending', runnable_at = :now, finished_at = NULL,
    lease_expires_at = NULL, max_attempts = attempt + 1,
    note = 'requeued by operator'
WHERE run_id = :run_id AND status IN ('poisoned', 'failed');

-- mark_poison_requeued --
-- Remember when a poison message was requeued.
UPDATE agent_poison_messages SET requeued_at = :now WHERE poison_id = :poison_id;

-- insert_manual_run --
-- run-now: a run of a job right away, keyed by the request time; the job's overlap policy applies.
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note)
SELECT d.job_name, 'manual', :now, d.decision, d.command, d.target_database, d.overlap,
       d.max_attempts, d.timeout_seconds, d.lease_seconds, :now, :now,
       CASE WHEN d.decision = 'skipped' THEN :now END,
       :operation_id,
       CASE WHEN d.decision = 'skipped'
            THEN 'overlap: the previous run of this job was still in flight; policy skip'
            ELSE 'run-now' END
FROM (
    SELECT j.*, CASE WHEN j.overlap = 'skip' AND EXISTS (
                    SELECT 1 FROM agent_runs a
                    WHERE a.job_name = j.job_name AND a.status IN ('pending', 'queued', 'running'))
               THEN 'skipped' ELSE 'pending' END AS decision
    FROM agent_jobs j
    WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
) AS d
RETURNING run_id, job_name, status, note, operation_id;

-- insert_task --
-- submit: an ad-hoc task; runs after every task with a lower order has finished.
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                        overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                        created_at, operation_id, note)
VALUES (NULL, 'task', :now, 'pending', :command, :target_database, :task_order,
        'allow', :max_attempts, :timeout_seconds, :lease_seconds, :now,
        :now, :operation_id, 'submitted')
RETURNING run_id, status, operation_id;

-- cancel_run --
-- Cancel a run not yet finished; the token bump fences a worker still running it (its heartbeat stops the work).
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = :now,
    lease_expires_at = NULL, note = 'cancelled by operator'
WHERE run_id = :run_id AND status IN ('pending', 'queued', 'running');

-- list_jobs --
-- Every known job with its configuration state, next slot and latest run.
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at
FROM agent_jobs j
LEFT JOIN agent_runs l ON l.run_id = (
    SELECT r.run_id FROM agent_runs r
    WHERE r.job_name = j.job_name ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1)
ORDER BY j.job_name;

-- list_history --
-- Runs, newest first, optionally of one job.
SELECT run_id, job_name, kind, scheduled_for, status, attempt, max_attempts, token, created_at,
       started_at, finished_at, worker, last_error_number, last_error, note, operation_id
FROM agent_runs
WHERE (:job_name IS NULL OR job_name = :job_name)
ORDER BY run_id DESC LIMIT :limit;

-- list_attempts --
-- Attempts of the runs in a JSON array of run ids.
SELECT a.run_id, a.attempt, a.token, a.worker, a.dequeue_count, a.started_at, a.finished_at,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message
FROM agent_attempts a
WHERE a.run_id IN (SELECT CAST(x.value AS INTEGER) FROM json_each(:run_ids) AS x)
ORDER BY a.run_id, a.attempt_id;

-- list_job_events --
-- Job events (invalid configuration, ...), newest first, optionally of one job.
SELECT event_id, job_name, event_at, kind, detail FROM agent_job_events
WHERE (:job_name IS NULL OR job_name = :job_name)
ORDER BY event_id DESC LIMIT :limit;

-- list_stuck_runs --
-- Reconciliation: runs in flight past their lease, or runnable but not dispatched for longer than the given age.
SELECT run_id, job_name, kind, status, scheduled_for, runnable_at, lease_expires_at, token, attempt
FROM agent_runs
WHERE (status IN ('queued', 'running') AND lease_expires_at < :now)
   OR (status = 'pending' AND runnable_at < :stale_before)
ORDER BY run_id;

-- queue_send --
-- Local queue: enqueue message bodies (a JSON array of strings), visible at once.
INSERT INTO agent_queue_messages (queue_name, body, dequeue_count, inserted_at, visible_at)
SELECT :queue_name, b.value, 0, :now, :now FROM json_each(:bodies) AS b ORDER BY b.key;

-- queue_receive --
-- Local queue: take up to :limit visible messages, hide them for the visibility timeout and count the delivery.
UPDATE agent_queue_messages SET
    dequeue_count = dequeue_count + 1,
    visible_at = :invisible_until,
    pop_receipt = :pop_receipt
WHERE message_id IN (
    SELECT c.message_id FROM agent_queue_messages c
    WHERE c.queue_name = :queue_name AND c.visible_at <= :now
    ORDER BY c.message_id
    LIMIT :limit)
RETURNING message_id, body, dequeue_count, pop_receipt, inserted_at;

-- queue_delete --
-- Local queue: delete a message, only with the receipt of its latest delivery.
DELETE FROM agent_queue_messages WHERE message_id = :message_id AND pop_receipt = :pop_receipt;

-- queue_release --
-- Local queue: make a message visible again after a failed delivery.
UPDATE agent_queue_messages SET visible_at = :visible_at
WHERE message_id = :message_id AND pop_receipt = :pop_receipt;

-- queue_depth --
-- Local queue: messages in a queue, and how many are visible now.
SELECT COUNT(*) AS total,
       COALESCE(SUM(CASE WHEN visible_at <= :now THEN 1 ELSE 0 END), 0) AS visible
FROM agent_queue_messages WHERE queue_name = :queue_name;

-- count_runs_by_status --
-- Runs per status (the local runner's idle check and the doctor).
SELECT status, COUNT(*) AS runs FROM agent_runs GROUP BY status;

-- delete_run --
-- Remove a run and its attempts (the doctor's scratch run only).
DELETE FROM agent_attempts WHERE run_id = :run_id;
DELETE FROM agent_runs WHERE run_id = :run_id;
