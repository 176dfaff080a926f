-- Named queries for SQL Server / Azure SQL Database (T-SQL, through pyodbc and Microsoft ODBC
-- Driver 18). Format: "-- name --", a one-line description, then the query. Parameters are
-- :name; the store turns them into qmark placeholders (a parameter used twice is bound twice).
-- Only what Azure SQL Database has: no msdb, no cross-database names, no xp_ procedures.
--
-- Time: DATETIME2(6), UTC, always passed in (CAST(:x AS DATETIME2(6))): the agent's clock,
-- never the server's. pyodbc binds a naive datetime as SQL_TYPE_TIMESTAMP with the column size
-- the driver reports for it (27 with ODBC Driver 17/18, i.e. datetime2(7) with 7 fraction
-- digits), so microseconds arrive intact and the CAST is lossless. Timestamps inside JSON
-- parameters are text 'YYYY-MM-DD HH:MM:SS.ffffff' read with CONVERT(..., 121).
--
-- Text: pyodbc binds a Python str as NVARCHAR, so every text column is NVARCHAR and every
-- literal N'...': a VARCHAR column compared with an NVARCHAR parameter would be converted row
-- by row (CONVERT_IMPLICIT) and its index could not be used for a seek.
--
-- Concurrency: Azure SQL Database runs READ COMMITTED SNAPSHOT. A plain read sees the last
-- committed version and takes no lock, so nothing here decides on a read and writes later:
-- * fenced transitions are conditional UPDATEs (an UPDATE qualifies its target rows with update
--   locks on their current committed version, not on the snapshot) returning what changed
--   with OUTPUT inserted.* (deleted.* for the values before);
-- * the claim of a run is an INSERT whose NOT EXISTS probe holds (UPDLOCK, HOLDLOCK) key-range
--   locks on (job_name, scheduled_for), backed by the unique index runs_job_slot; a concurrent
--   tick waits for the first one's commit and then finds its row (no duplicate, no error);
--   should a duplicate ever get through, the index refuses it (2601 = lost the race);
-- * the dispatcher and the local queue pick rows WITH (UPDLOCK, READPAST, ROWLOCK), the
--   T-SQL form of FOR UPDATE SKIP LOCKED, and update them through that CTE (a locking read of
--   the current rows, touching no row another worker holds);
-- * upserts are MERGE ... WITH (HOLDLOCK) (serializable on the key: no duplicate insert).
-- No SET NOCOUNT ON anywhere: the engine reads the affected row counts.
--
-- T-SQL requires a MERGE to end with a semicolon (error 10713). The loader strips a ';' at the
-- end of a line (it separates statements), so each MERGE keeps its ';' by ending on a comment;
-- tests/test_dialects.py checks that the loaded MERGE statements still end with ';'.

-- bootstrap_schema --
-- Create the agent schema and the schema version table if missing (serialised, so two first init-db runs cannot both create them).
EXEC sp_getapplock @Resource = N'agent.migrations', @LockMode = N'Exclusive', @LockOwner = N'Transaction';
-- CREATE SCHEMA must be the only statement of its batch, hence sp_executesql.
DECLARE @create_schema NVARCHAR(100) = CASE WHEN SCHEMA_ID(N'agent') IS NULL THEN N'CREATE SCHEMA agent' ELSE N'' END; EXEC sp_executesql @create_schema;
IF OBJECT_ID(N'agent.schema_version', N'U') IS NULL
CREATE TABLE agent.schema_version (
    version     INT NOT NULL CONSTRAINT schema_version_pk PRIMARY KEY,
    description NVARCHAR(200) NOT NULL,
    applied_at  DATETIME2(6) NOT NULL
);

-- lock_migrations --
-- Serialise concurrent init-db calls for the rest of the transaction (writers wait; snapshot readers do not).
SELECT COUNT(*) AS locked FROM agent.schema_version WITH (TABLOCKX, HOLDLOCK);

-- get_schema_version --
-- Highest applied migration (0 when none).
SELECT COALESCE(MAX(version), 0) AS version FROM agent.schema_version;

-- record_migration --
-- Remember that a migration was applied.
INSERT INTO agent.schema_version (version, description, applied_at)
VALUES (:version, :description, CAST(:now AS DATETIME2(6)));

-- schema_exists --
-- Whether the schema version table exists (1 row) or not (0 rows).
SELECT 1 AS present FROM INFORMATION_SCHEMA.TABLES
WHERE TABLE_SCHEMA = N'agent' AND TABLE_NAME = N'schema_version';

-- get_state --
-- Read one engine state value (e.g. the hash of the job settings last synced).
SELECT state_value FROM agent.state WHERE state_key = :state_key;

-- set_state --
-- Write one engine state value.
MERGE agent.state WITH (HOLDLOCK) AS t
USING (SELECT CAST(:state_key AS NVARCHAR(64)) AS state_key, CAST(:state_value AS NVARCHAR(MAX)) AS state_value,
              CAST(:now AS DATETIME2(6)) AS updated_at) AS s
ON t.state_key = s.state_key
WHEN MATCHED THEN UPDATE SET state_value = s.state_value, updated_at = s.updated_at
WHEN NOT MATCHED THEN INSERT (state_key, state_value, updated_at) VALUES (s.state_key, s.state_value, s.updated_at); -- MERGE ends with a semicolon

-- record_config_events --
-- Record each job whose configuration became invalid (or changed its error) since the last sync.
INSERT INTO agent.job_events (job_name, event_at, kind, detail)
SELECT j.job_name, CAST(:now AS DATETIME2(6)), N'config_invalid', j.config_error
FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64), valid INT, config_error NVARCHAR(MAX)) AS j
WHERE j.valid = 0
  AND NOT EXISTS (SELECT 1 FROM agent.jobs AS c
                  WHERE c.job_name = j.job_name AND c.valid = 0 AND c.configured = 1
                    AND c.config_error = j.config_error);

-- upsert_jobs --
-- Write every configured job in one statement; a new job, a changed schedule or time zone, or a job re-enabled starts from its new next_due_at.
MERGE agent.jobs WITH (HOLDLOCK) AS t
USING (
    SELECT j.job_name, j.schedule, j.timezone, j.command, j.target_database, j.enabled, j.valid,
           j.config_error, j.max_attempts, j.timeout_seconds, j.lease_seconds, j.misfire,
           j.grace_seconds, j.overlap, CONVERT(DATETIME2(6), j.next_due_at, 121) AS next_due_at
    FROM OPENJSON(:jobs) WITH (
        job_name NVARCHAR(64), schedule NVARCHAR(400), timezone NVARCHAR(64), command NVARCHAR(MAX),
        target_database NVARCHAR(128), enabled SMALLINT, valid SMALLINT, config_error NVARCHAR(MAX),
        max_attempts INT, timeout_seconds INT, lease_seconds INT, misfire NVARCHAR(16),
        grace_seconds INT, overlap NVARCHAR(16), next_due_at NVARCHAR(40)) AS j
) AS s
ON t.job_name = s.job_name
WHEN MATCHED THEN UPDATE SET
    next_due_at = CASE
        WHEN t.schedule <> s.schedule
          OR t.timezone <> s.timezone
          OR t.enabled <> s.enabled
          OR t.valid <> s.valid
          OR t.configured = 0
        THEN s.next_due_at ELSE t.next_due_at END,
    schedule = s.schedule,
    timezone = s.timezone,
    command = s.command,
    target_database = s.target_database,
    enabled = s.enabled,
    valid = s.valid,
    config_error = s.config_error,
    max_attempts = s.max_attempts,
    timeout_seconds = s.timeout_seconds,
    lease_seconds = s.lease_seconds,
    misfire = s.misfire,
    grace_seconds = s.grace_seconds,
    overlap = s.overlap,
    configured = 1,
    updated_at = CAST(:now AS DATETIME2(6))
WHEN NOT MATCHED THEN
    INSERT (job_name, schedule, timezone, command, target_database, enabled, valid, config_error,
            max_attempts, timeout_seconds, lease_seconds, misfire, grace_seconds, overlap,
            next_due_at, configured, updated_at)
    VALUES (s.job_name, s.schedule, s.timezone, s.command, s.target_database, s.enabled, s.valid,
            s.config_error, s.max_attempts, s.timeout_seconds, s.lease_seconds, s.misfire,
            s.grace_seconds, s.overlap, s.next_due_at, 1, CAST(:now AS DATETIME2(6))); -- MERGE ends with a semicolon

-- unconfigure_missing_jobs --
-- Jobs no longer in the settings stop being scheduled; their history stays.
UPDATE agent.jobs SET configured = 0, next_due_at = NULL, updated_at = CAST(:now AS DATETIME2(6))
WHERE configured = 1
  AND job_name NOT IN (SELECT j.job_name FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64)) AS j);

-- expire_leases --
-- Take back every run whose holder stopped heartbeating (or whose message was lost), fencing it with a new token.
UPDATE agent.runs SET
    status = CASE WHEN status = N'queued' OR attempt < max_attempts THEN N'pending' ELSE N'failed' END,
    token = token + 1,
    lease_expires_at = NULL,
    runnable_at = CAST(:now AS DATETIME2(6)),
    finished_at = CASE WHEN status = N'running' AND attempt >= max_attempts
                       THEN CAST(:now AS DATETIME2(6)) ELSE NULL END,
    last_error = CASE WHEN status = N'running'
                      THEN N'lease expired: worker ' + COALESCE(worker, N'?') + N' stopped renewing its lease'
                      ELSE N'dispatch lease expired: the message was not picked up in time; dispatching again' END
OUTPUT inserted.run_id, inserted.job_name, inserted.kind, inserted.status, inserted.attempt, inserted.token,
       inserted.operation_id, inserted.scheduled_for,
       CASE WHEN deleted.status = N'running' THEN 1 ELSE 0 END AS was_running
WHERE status IN (N'queued', N'running') AND lease_expires_at < CAST(:now AS DATETIME2(6));

-- close_dead_attempts --
-- Mark attempts still 'running' whose run has moved on to a newer token: their worker died or was fenced.
UPDATE a SET outcome = N'lease_expired', finished_at = CAST(:now AS DATETIME2(6)),
    error_message = N'lease expired: the worker stopped renewing its lease (killed, hung or cut off)'
FROM agent.attempts AS a
JOIN agent.runs AS r ON r.run_id = a.run_id
WHERE a.outcome = N'running' AND a.token < r.token;

-- claim_due_runs --
-- Claim one run per due job in one statement; the unique (job_name, scheduled_for) key arbitrates between concurrent ticks; misfire and overlap decided here.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note)
OUTPUT inserted.run_id, inserted.job_name, inserted.scheduled_for, inserted.status, inserted.note,
       inserted.operation_id, inserted.token
SELECT d.job_name, N'scheduled', d.next_due_at, d.decision, d.command, d.target_database, d.overlap,
       d.max_attempts, d.timeout_seconds, d.lease_seconds, CAST(:now AS DATETIME2(6)),
       CAST(:now AS DATETIME2(6)),
       CASE WHEN d.decision = N'skipped' THEN CAST(:now AS DATETIME2(6)) END,
       LOWER(REPLACE(CONVERT(VARCHAR(36), NEWID()), '-', '')),
       CASE d.reason
           WHEN N'misfire-skip' THEN N'misfire: slot missed by more than the misfire threshold; policy skip'
           WHEN N'misfire-grace' THEN N'misfire: slot older than its grace period; skipped'
           WHEN N'misfire-catch-up' THEN N'misfire: caught up late, once'
           WHEN N'overlap' THEN N'overlap: the previous run of this job was still in flight; policy skip'
       END
FROM (
    SELECT r.*, CASE WHEN r.reason IN (N'misfire-skip', N'misfire-grace', N'overlap') THEN N'skipped'
                     ELSE N'pending' END AS decision
    FROM (
        SELECT j.*,
               CASE WHEN j.next_due_at < CAST(:late_cutoff AS DATETIME2(6)) AND j.misfire = N'skip' THEN N'misfire-skip'
                    WHEN j.next_due_at < CAST(:late_cutoff AS DATETIME2(6))
                         AND DATEADD(second, j.grace_seconds, j.next_due_at) < CAST(:now AS DATETIME2(6))
                    THEN N'misfire-grace'
                    WHEN j.overlap = N'skip' AND EXISTS (
                         SELECT 1 FROM agent.runs AS a
                         WHERE a.job_name = j.job_name AND a.status IN (N'pending', N'queued', N'running')) THEN N'overlap'
                    WHEN j.next_due_at < CAST(:late_cutoff AS DATETIME2(6)) THEN N'misfire-catch-up'
                    ELSE N'on-time' END AS reason
        FROM agent.jobs AS j
        WHERE j.next_due_at <= CAST(:now AS DATETIME2(6)) AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
    ) AS r
) AS d
WHERE NOT EXISTS (
    SELECT 1 FROM agent.runs AS x WITH (UPDLOCK, HOLDLOCK)
    WHERE x.job_name IS NOT NULL AND x.job_name = d.job_name AND x.scheduled_for = d.next_due_at)
ORDER BY d.job_name;

-- select_due_schedules --
-- The distinct schedules of jobs whose next slot has come (claimed by this tick or an earlier one): their next slot is computed in Python, once per schedule.
SELECT DISTINCT schedule, timezone
FROM agent.jobs
WHERE next_due_at <= CAST(:now AS DATETIME2(6)) AND enabled = 1 AND valid = 1 AND configured = 1;

-- advance_due_jobs --
-- Move every due job to the next slot of its schedule; a job a concurrent tick already moved is no longer due and stays as it is.
UPDATE j SET next_due_at = CONVERT(DATETIME2(6), a.next_due_at, 121)
FROM agent.jobs AS j
JOIN OPENJSON(:advances) WITH (schedule NVARCHAR(400), timezone NVARCHAR(64), next_due_at NVARCHAR(40)) AS a
  ON j.schedule = a.schedule AND j.timezone = a.timezone
WHERE j.next_due_at <= CAST(:now AS DATETIME2(6)) AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1;

-- dispatch_runs --
-- Hand runnable runs to the queue: each gets a new, larger token and a dispatch lease; overlap 'queue', task order and the concurrency cap are honoured.
-- The picked rows are updated through the CTE itself, so this statement locks only the rows it
-- picked (UPDLOCK) and steps over the ones another dispatcher holds (READPAST).
WITH picked AS (
    SELECT TOP ((SELECT CASE WHEN cap.free > 0 THEN cap.free ELSE 0 END
                 FROM (SELECT CAST(:max_in_flight AS INT) - COUNT(*) AS free
                       FROM agent.runs AS f WHERE f.status IN (N'queued', N'running')) AS cap))
           c.*
    FROM agent.runs AS c WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE c.status = N'pending' AND c.runnable_at <= CAST(:now AS DATETIME2(6))
      AND (c.overlap <> N'queue' OR c.job_name IS NULL OR NOT EXISTS (
            SELECT 1 FROM agent.runs AS o
            WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
              AND (o.status IN (N'queued', N'running')
                   OR (o.status = N'pending' AND o.scheduled_for < c.scheduled_for))))
      AND (c.task_order IS NULL OR NOT EXISTS (
            SELECT 1 FROM agent.runs AS t
            WHERE t.kind = N'task' AND t.task_order < c.task_order
              AND t.status IN (N'pending', N'queued', N'running')))
    ORDER BY c.runnable_at, c.run_id
)
UPDATE picked SET
    status = N'queued',
    token = token + 1,
    lease_expires_at = CAST(:lease_until AS DATETIME2(6)),
    dispatched_at = CAST(:now AS DATETIME2(6))
OUTPUT inserted.run_id, inserted.token, inserted.job_name, inserted.kind, inserted.operation_id,
       inserted.scheduled_for, inserted.attempt;

-- release_dispatch --
-- Put back runs whose queue message could not be sent (a JSON array of {run_id, token}); a later tick dispatches them again.
UPDATE r SET status = N'pending', lease_expires_at = NULL
FROM agent.runs AS r
JOIN OPENJSON(:runs) WITH (run_id BIGINT, token BIGINT) AS x ON r.run_id = x.run_id AND r.token = x.token
WHERE r.status = N'queued';

-- start_run --
-- Fenced start: only the holder of the current token starts a queued run; returns what the worker needs.
UPDATE agent.runs SET
    status = N'running',
    attempt = attempt + 1,
    started_at = CAST(:now AS DATETIME2(6)),
    heartbeat_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = DATEADD(second, lease_seconds, CAST(:now AS DATETIME2(6))),
    worker = :worker,
    dequeue_count = :dequeue_count
OUTPUT inserted.run_id, inserted.job_name, inserted.kind, inserted.command, inserted.target_database,
       inserted.attempt, inserted.max_attempts, inserted.token, inserted.timeout_seconds,
       inserted.lease_seconds, inserted.operation_id, inserted.scheduled_for, inserted.started_at
WHERE run_id = :run_id AND token = :token AND status = N'queued';

-- insert_attempt --
-- Open the history row of an attempt just started.
INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
VALUES (:run_id, :attempt, :token, :worker, :dequeue_count, CAST(:now AS DATETIME2(6)), N'running');

-- get_run --
-- One run, for the executor's explanation of a message it will not run, and for the CLI.
SELECT run_id, job_name, kind, scheduled_for, status, command, target_database, task_order,
       attempt, max_attempts, token, lease_expires_at, heartbeat_at, runnable_at, created_at,
       dispatched_at, started_at, finished_at, worker, operation_id, dequeue_count,
       last_error_number, last_error, note
FROM agent.runs WHERE run_id = :run_id;

-- heartbeat_run --
-- Renew the lease of a running run; zero rows means the lease was taken over (or the run cancelled).
UPDATE agent.runs SET heartbeat_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = DATEADD(second, lease_seconds, CAST(:now AS DATETIME2(6)))
WHERE run_id = :run_id AND token = :token AND status = N'running';

-- complete_run --
-- Fenced completion: succeeds only for the current token; run in the same transaction as control-database work.
UPDATE agent.runs SET status = N'succeeded', finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
WHERE run_id = :run_id AND token = :token AND status = N'running';

-- finish_attempt --
-- Close the history row of an attempt with its outcome and error.
UPDATE agent.attempts SET outcome = :outcome, finished_at = CAST(:now AS DATETIME2(6)),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = N'running';

-- fail_run --
-- Fenced failure: back to pending after a backoff while attempts remain, else failed.
UPDATE agent.runs SET
    status = CASE WHEN attempt < max_attempts THEN N'pending' ELSE N'failed' END,
    runnable_at = CAST(:retry_at AS DATETIME2(6)),
    finished_at = CASE WHEN attempt < max_attempts THEN NULL ELSE CAST(:now AS DATETIME2(6)) END,
    lease_expires_at = NULL,
    last_error_number = :error_number,
    last_error = :error_message
OUTPUT inserted.status, inserted.attempt, inserted.max_attempts
WHERE run_id = :run_id AND token = :token AND status = N'running';

-- requeue_transient --
-- Fenced: a transient failure hands the run back to the queue's redelivery (same token), with a dispatch lease in case the message is lost.
UPDATE agent.runs SET status = N'queued', lease_expires_at = CAST(:lease_until AS DATETIME2(6)),
    last_error_number = :error_number, last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = N'running';

-- poison_run --
-- Fenced: the current message of this run was poisoned; the run ends poisoned.
UPDATE agent.runs SET status = N'poisoned', finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL, last_error = :reason
WHERE run_id = :run_id AND token = :token AND status IN (N'queued', N'running');

-- list_run_errors --
-- Every error seen by a run's attempts, oldest first (kept with a poison message).
SELECT attempt, token, dequeue_count, started_at, finished_at, outcome, error_number,
       error_sqlstate, error_message
FROM agent.attempts WHERE run_id = :run_id ORDER BY attempt_id;

-- insert_poison --
-- Keep a poisoned message: body as received, dequeue count, every error, the run.
INSERT INTO agent.poison_messages (run_id, message_id, body, dequeue_count, reason, errors, poisoned_at)
OUTPUT inserted.poison_id
VALUES (:run_id, :message_id, :body, :dequeue_count, :reason, :errors, CAST(:now AS DATETIME2(6)));

-- list_poison --
-- Poison messages, newest first.
SELECT TOP (:limit) poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages ORDER BY poison_id DESC;

-- get_poison --
-- One poison message.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages WHERE poison_id = :poison_id;

-- requeue_run --
-- Give a poisoned or failed run one more attempt: back to pending; the next dispatch gives it a new token.
UPDATE agent.runs SET status = N'pending', runnable_at = CAST(:now AS DATETIME2(6)), finished_at = NULL,
    lease_expires_at = NULL, max_attempts = attempt + 1,
    note = N'requeued by operator'
WHERE run_id = :run_id AND status IN (N'poisoned', N'failed');

-- mark_poison_requeued --
-- Remember when a poison message was requeued.
UPDATE agent.poison_messages SET requeued_at = CAST(:now AS DATETIME2(6)) WHERE poison_id = :poison_id;

-- insert_manual_run --
-- run-now: a run of a job right away, keyed by the request time; the job's overlap policy applies.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note)
OUTPUT inserted.run_id, inserted.job_name, inserted.status, inserted.note, inserted.operation_id
SELECT j.job_name, N'manual', CAST(:now AS DATETIME2(6)), d.decision, j.command, j.target_database,
       j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, CAST(:now AS DATETIME2(6)),
       CAST(:now AS DATETIME2(6)), CASE WHEN d.decision = N'skipped' THEN CAST(:now AS DATETIME2(6)) END,
       :operation_id,
       CASE WHEN d.decision = N'skipped'
            THEN N'overlap: the previous run of this job was still in flight; policy skip'
            ELSE N'run-now' END
FROM agent.jobs AS j
CROSS APPLY (
    SELECT CASE WHEN j.overlap = N'skip' AND EXISTS (
                SELECT 1 FROM agent.runs AS a
                WHERE a.job_name = j.job_name AND a.status IN (N'pending', N'queued', N'running'))
           THEN N'skipped' ELSE N'pending' END AS decision) AS d
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1;

-- insert_task --
-- submit: an ad-hoc task; runs after every task with a lower order has finished.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                        overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                        created_at, operation_id, note)
OUTPUT inserted.run_id, inserted.status, inserted.operation_id
VALUES (NULL, N'task', CAST(:now AS DATETIME2(6)), N'pending', :command, :target_database, :task_order,
        N'allow', :max_attempts, :timeout_seconds, :lease_seconds, CAST(:now AS DATETIME2(6)),
        CAST(:now AS DATETIME2(6)), :operation_id, N'submitted');

-- cancel_run --
-- Cancel a run not yet finished; the token bump fences a worker still running it (its heartbeat stops the work).
UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL, note = N'cancelled by operator'
WHERE run_id = :run_id AND status IN (N'pending', N'queued', N'running');

-- list_jobs --
-- Every known job with its configuration state, next slot and latest run.
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at
FROM agent.jobs AS j
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.status, r.scheduled_for, r.finished_at FROM agent.runs AS r
    WHERE r.job_name = j.job_name ORDER BY r.scheduled_for DESC, r.run_id DESC) AS l
ORDER BY j.job_name;

-- list_history --
-- Runs, newest first, optionally of one job.
SELECT TOP (:limit) run_id, job_name, kind, scheduled_for, status, attempt, max_attempts, token, created_at,
       started_at, finished_at, worker, last_error_number, last_error, note, operation_id
FROM agent.runs
WHERE (CAST(:job_name AS NVARCHAR(64)) IS NULL OR job_name = CAST(:job_name AS NVARCHAR(64)))
ORDER BY run_id DESC;

-- list_attempts --
-- Attempts of the runs in a JSON array of run ids.
SELECT a.run_id, a.attempt, a.token, a.worker, a.dequeue_count, a.started_at, a.finished_at,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message
FROM agent.attempts AS a
WHERE a.run_id IN (SELECT CAST(x.value AS BIGINT) FROM OPENJSON(:run_ids) AS x)
ORDER BY a.run_id, a.attempt_id;

-- list_job_events --
-- Job events (invalid configuration, ...), newest first, optionally of one job.
SELECT TOP (:limit) event_id, job_name, event_at, kind, detail FROM agent.job_events
WHERE (CAST(:job_name AS NVARCHAR(64)) IS NULL OR job_name = CAST(:job_name AS NVARCHAR(64)))
ORDER BY event_id DESC;

-- list_stuck_runs --
-- Reconciliation: runs in flight past their lease, or runnable but not dispatched for longer than the given age.
SELECT run_id, job_name, kind, status, scheduled_for, runnable_at, lease_expires_at, token, attempt
FROM agent.runs
WHERE (status IN (N'queued', N'running') AND lease_expires_at < CAST(:now AS DATETIME2(6)))
   OR (status = N'pending' AND runnable_at < CAST(:stale_before AS DATETIME2(6)))
ORDER BY run_id;

-- queue_send --
-- Local queue: enqueue message bodies (a JSON array of strings), visible at once.
INSERT INTO agent.queue_messages (queue_name, body, dequeue_count, inserted_at, visible_at)
SELECT :queue_name, b.value, 0, CAST(:now AS DATETIME2(6)), CAST(:now AS DATETIME2(6))
FROM OPENJSON(:bodies) AS b
ORDER BY CAST(b.[key] AS INT);

-- queue_receive --
-- Local queue: take up to :limit visible messages, hide them for the visibility timeout and count the delivery.
WITH picked AS (
    SELECT TOP (:limit) m.*
    FROM agent.queue_messages AS m WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE m.queue_name = :queue_name AND m.visible_at <= CAST(:now AS DATETIME2(6))
    ORDER BY m.message_id
)
UPDATE picked SET
    dequeue_count = dequeue_count + 1,
    visible_at = CAST(:invisible_until AS DATETIME2(6)),
    pop_receipt = :pop_receipt
OUTPUT inserted.message_id, inserted.body, inserted.dequeue_count, inserted.pop_receipt, inserted.inserted_at;

-- queue_delete --
-- Local queue: delete a message, only with the receipt of its latest delivery.
DELETE FROM agent.queue_messages WHERE message_id = :message_id AND pop_receipt = :pop_receipt;

-- queue_release --
-- Local queue: make a message visible again after a failed delivery.
UPDATE agent.queue_messages SET visible_at = CAST(:visible_at AS DATETIME2(6))
WHERE message_id = :message_id AND pop_receipt = :pop_receipt;

-- queue_depth --
-- Local queue: messages in a queue, and how many are visible now.
SELECT COUNT(*) AS total,
       COALESCE(SUM(CASE WHEN visible_at <= CAST(:now AS DATETIME2(6)) THEN 1 ELSE 0 END), 0) AS visible
FROM agent.queue_messages WHERE queue_name = :queue_name;

-- count_runs_by_status --
-- Runs per status (the local runner's idle check and the doctor).
SELECT status, COUNT(*) AS runs FROM agent.runs GROUP BY status;

-- delete_run --
-- Remove a run and its attempts (the doctor's scratch run only).
DELETE FROM agent.attempts WHERE run_id = :run_id;
DELETE FROM agent.runs WHERE run_id = :run_id;
