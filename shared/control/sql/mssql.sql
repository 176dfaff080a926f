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
--   T-SQL form of FOR UPDATE SKIP LOCKED, in a TOP (n) ... ORDER BY subselect, and update them
--   by key (a locking read of the current rows, touching no row another worker holds);
-- * upserts update, then insert what is missing, under a lock the caller holds or key-range
--   locks (UPDLOCK, HOLDLOCK) on the keys, never MERGE;
-- * starts (claim_runs, start_run, dispatch_runs, insert_manual_run) take agent.start_lock's table
--   lock first, for the rest of their transaction: the concurrency cap, task order and overlap
--   are decided by one starter at a time, each statement reading what the others committed.
-- Sessions run with SET NOCOUNT ON: every statement whose effect the engine checks returns its
-- rows (OUTPUT ... INTO a table variable, then SELECT: an agent table may carry a DBA's
-- trigger, and OUTPUT without INTO is refused on such a table, error 334).
--
-- One dialect for SQL Server, Azure SQL and Babelfish for PostgreSQL (docs/azure-sql.md): no
-- MERGE, no UPDATE through a CTE, no deleted.* in OUTPUT, no INSERT ... OUTPUT INTO ... ORDER BY,
-- no STRING_AGG ... WITHIN GROUP, and an UPDATE ... OUTPUT reads the tables it joins through a
-- comma join and its WHERE clause (Babelfish refuses these; each rewrite argues its locking where
-- it is). Babelfish accepts and ignores the table hints: there the unique keys and the fencing
-- tokens keep the engine correct, as the comments next to the queries say.
-- A comment inside a query holds no apostrophe (the loader reads one as the start of a string).

-- bootstrap_schema --
-- Take the migration lock for the session (released by release_migration_lock after the migrations), checking that it was granted, then create the agent schema and the schema version table if missing: two first init-db runs cannot both create them. (An owner 'Transaction' lock taken by EXEC, which opens no implicit transaction, would not be taken at all: -999.)
DECLARE @lock_result INT;
EXEC @lock_result = sp_getapplock @Resource = N'agent.migrations', @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 120000;
IF @lock_result < 0 THROW 50001, N'init-db: the migration lock (sp_getapplock agent.migrations) was not granted within 120 s: another init-db is still running, or was refused', 1;
-- CREATE SCHEMA must be the only statement of its batch, hence sp_executesql.
DECLARE @create_schema NVARCHAR(100) = CASE WHEN SCHEMA_ID(N'agent') IS NULL THEN N'CREATE SCHEMA agent' ELSE N'' END; EXEC sp_executesql @create_schema;
IF OBJECT_ID(N'agent.schema_version', N'U') IS NULL
CREATE TABLE agent.schema_version (
    version     INT NOT NULL CONSTRAINT schema_version_pk PRIMARY KEY,
    description NVARCHAR(200) NOT NULL,
    applied_at  DATETIME2(6) NOT NULL
);
SELECT @lock_result AS locked;

-- release_migration_lock --
-- Release the session's migration lock taken by bootstrap_schema.
DECLARE @release_result INT;
EXEC @release_result = sp_releaseapplock @Resource = N'agent.migrations', @LockOwner = N'Session';
SELECT @release_result AS released;

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
-- Update, then insert if absent (no MERGE: Babelfish refuses it, and the SQL Server page on MERGE itself asks for HOLDLOCK before a MERGE is a safe upsert). On SQL Server (UPDLOCK, HOLDLOCK) makes the UPDATE hold a key-range lock on the key to the end of the transaction even when no row has it (HOLDLOCK is SERIALIZABLE for this table: "Table hints (Transact-SQL)", https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table), so a concurrent writer of the same key waits for this commit and then updates the row instead of inserting a second one; the probe of the INSERT holds the same lock. The settings sync calls it under the job-definitions applock as well. Babelfish ignores the hints: there the primary key refuses a second insert (error 2627) and the transaction of that caller rolls back and is retried.
UPDATE agent.state WITH (UPDLOCK, HOLDLOCK)
SET state_value = CAST(:state_value AS NVARCHAR(MAX)), updated_at = CAST(:now AS DATETIME2(6))
WHERE state_key = CAST(:state_key AS NVARCHAR(64));
INSERT INTO agent.state (state_key, state_value, updated_at)
SELECT CAST(:state_key AS NVARCHAR(64)), CAST(:state_value AS NVARCHAR(MAX)), CAST(:now AS DATETIME2(6))
WHERE NOT EXISTS (SELECT 1 FROM agent.state AS e WITH (UPDLOCK, HOLDLOCK)
                  WHERE e.state_key = CAST(:state_key AS NVARCHAR(64)));

-- claim_state --
-- Set one engine state value only if it is new or larger than the stored one (text order); a row back means this caller won (e.g. the one doorbell chain of a tick period).
-- Update-then-insert under one key-range lock, as set_state (the same hints and the same reference). Of two callers with the same value, the second waits on the lock of the first, then finds the value no longer smaller (no row) or the row there (no insert): exactly one wins. On Babelfish (hints ignored) PostgreSQL re-checks the condition of the UPDATE on the row the first caller committed, so the second still loses; two first-ever inserts of the key meet the primary key, and the statement of the loser fails (2627) instead of returning no row: it rang no doorbell, which is what losing means.
DECLARE @won TABLE (state_key NVARCHAR(64));
UPDATE agent.state WITH (UPDLOCK, HOLDLOCK)
SET state_value = CAST(:state_value AS NVARCHAR(MAX)), updated_at = CAST(:now AS DATETIME2(6))
OUTPUT inserted.state_key INTO @won
WHERE state_key = CAST(:state_key AS NVARCHAR(64)) AND state_value < CAST(:state_value AS NVARCHAR(MAX));
INSERT INTO agent.state (state_key, state_value, updated_at)
OUTPUT inserted.state_key INTO @won
SELECT CAST(:state_key AS NVARCHAR(64)), CAST(:state_value AS NVARCHAR(MAX)), CAST(:now AS DATETIME2(6))
WHERE NOT EXISTS (SELECT 1 FROM agent.state AS e WITH (UPDLOCK, HOLDLOCK)
                  WHERE e.state_key = CAST(:state_key AS NVARCHAR(64)));
SELECT state_key FROM @won;

-- server_version --
-- The server's product and version (doctor): SQL Server, Azure SQL, or Babelfish for PostgreSQL (whose @@VERSION names it).
SELECT @@VERSION AS server_version;

-- database_time --
-- The database server's clock (UTC): the agent's one clock.
SELECT SYSUTCDATETIME() AS server_now;

-- record_config_events --
-- Record each job whose configuration became invalid (or changed its error) since the last sync.
INSERT INTO agent.job_events (job_name, event_at, kind, detail)
-- Free text read from JSON goes through agent.json_text (migration 0011: Babelfish leaves JSON escapes in).
SELECT j.job_name, CAST(:now AS DATETIME2(6)), N'config_invalid', j.config_error
FROM (SELECT x.job_name, x.valid, agent.json_text(x.config_error) AS config_error
      FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64), valid INT, config_error NVARCHAR(MAX)) AS x) AS j
WHERE j.valid = 0
  AND NOT EXISTS (SELECT 1 FROM agent.jobs AS c
                  WHERE c.job_name = j.job_name AND c.valid = 0 AND c.configured = 1
                    AND c.config_error = j.config_error);

-- skip_runs_of_changed_jobs --
-- Slots claimed ahead for a job whose schedule or time zone changed, or that was disabled, became invalid or was removed, are recorded skipped instead of run (and so are the slots ahead a pause had recorded skipped: a resume must not bring back a slot of the old settings). A job whose calendars (EXCLUDE, ONLY, ON_EXCLUDED: the calendars JSON) or JITTER_SECONDS changed has its never-started scheduled runs keyed from its new next slot on (next_due_at, which upsert_jobs moves back to it) recorded skipped the same way: the claim plans them again under the new rules (a run keyed as before is taken back in place), so a run is neither duplicated under a new jitter nor left at a time a new calendar excludes. A run keyed before that slot stands for an earlier slot (a jittered run stays before the schedule's next slot) and is left as it is. A job with no next slot left (a one-time job once claimed, a schedule past its `until`) has its run not yet due and not held by a pause recorded skipped; upsert_jobs then has it decided again from its slot, or from now when that has passed; a run that came, ran or was skipped for good stands. A run a calendar moved (note '...; moved from ...'), not yet due, is recorded skipped whatever its key, with a note of its own ('... after a calendar moved this run here'), by which upsert_jobs has the job decided again from now: the slot it stood for is decided under the new calendars.
-- UPDATE ... FROM a derived table of the changed jobs (one row per job: the jobs key), joined in the WHERE clause: Babelfish refuses an UPDATE ... OUTPUT whose SET reads a table joined with JOIN ... ON. The locking on SQL Server is that of the UPDATE itself: update locks on the qualifying runs rows, current committed version (https://learn.microsoft.com/sql/t-sql/queries/update-transact-sql); the caller holds the job-definitions applock.
DECLARE @skipped TABLE (run_id BIGINT, job_name NVARCHAR(64), scheduled_for DATETIME2(6), status NVARCHAR(16),
                        note NVARCHAR(MAX), operation_id NVARCHAR(32));
UPDATE r SET status = N'skipped', finished_at = CAST(:now AS DATETIME2(6)), lease_expires_at = NULL,
    note = CASE WHEN d.since IS NOT NULL AND r.note LIKE N'%; moved from %' THEN N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here' ELSE d.note END
OUTPUT inserted.run_id, inserted.job_name, inserted.scheduled_for, inserted.status, inserted.note,
       inserted.operation_id INTO @skipped
FROM agent.runs AS r,
     (SELECT c.job_name,
             CASE WHEN j.job_name IS NULL THEN N'skipped: the job was removed from the settings after this slot was claimed'
                  WHEN j.valid = 0 THEN N'skipped: the job''s settings became invalid after this slot was claimed'
                  WHEN j.enabled = 0 THEN N'skipped: the job was disabled after this slot was claimed'
                  WHEN j.schedule <> c.schedule OR j.timezone <> c.timezone
                  THEN N'skipped: the job''s schedule or time zone changed after this slot was claimed'
                  ELSE N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed' END AS note,
             CASE WHEN j.job_name IS NULL OR j.valid = 0 OR j.enabled = 0 OR j.schedule <> c.schedule
                       OR j.timezone <> c.timezone THEN NULL
                  -- A job with no next slot left (a one-time job once claimed, a schedule past its
                  -- `until`): its run not yet due and not held by a pause (one a calendar moved);
                  -- one that came, ran, or was skipped or paused stands.
                  WHEN c.next_due_at IS NULL THEN CAST(:now AS DATETIME2(6))
                  ELSE j.next_due_at END AS since,
             CASE WHEN j.job_name IS NOT NULL AND j.valid = 1 AND j.enabled = 1 AND j.schedule = c.schedule
                       AND j.timezone = c.timezone AND c.next_due_at IS NULL THEN 1 ELSE 0 END AS open_only
      FROM agent.jobs AS c
      LEFT JOIN (SELECT x.job_name, agent.json_text(x.schedule) AS schedule, x.timezone, x.enabled, x.valid,
                        agent.json_text(x.calendars) AS calendars, COALESCE(x.jitter_seconds, 0) AS jitter_seconds,
                        CONVERT(DATETIME2(6), x.next_due_at, 121) AS next_due_at
                 FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64), schedule NVARCHAR(400), timezone NVARCHAR(64),
                                            enabled INT, valid INT, calendars NVARCHAR(MAX), jitter_seconds INT,
                                            next_due_at NVARCHAR(40)) AS x) AS j ON j.job_name = c.job_name
      WHERE c.configured = 1 AND c.defined_in_database = 0
        AND (j.job_name IS NULL OR j.valid = 0 OR j.enabled = 0 OR j.schedule <> c.schedule
             OR j.timezone <> c.timezone
             OR ((j.next_due_at IS NOT NULL OR c.next_due_at IS NULL)
                 AND (j.jitter_seconds <> c.jitter_seconds
                      OR j.calendars <> c.calendars OR (j.calendars IS NULL AND c.calendars IS NOT NULL)
                      OR (j.calendars IS NOT NULL AND c.calendars IS NULL))))) AS d
WHERE d.job_name = r.job_name AND r.kind IN (N'scheduled', N'backfill')
  AND (r.status IN (N'pending', N'queued')
       OR (r.status = N'skipped' AND r.note = N'paused' AND r.attempt = 0 AND r.scheduled_for >= CAST(:now AS DATETIME2(6))))
  AND (d.since IS NULL
       OR (r.kind = N'scheduled' AND r.attempt = 0
           AND ((r.scheduled_for >= d.since AND (d.open_only = 0 OR r.status IN (N'pending', N'queued')))
                -- A run a calendar moved, not yet due, keyed before that slot (a freeze extended
                -- over the time an earlier slot moved to): decided again from now.
                OR (d.open_only = 0 AND r.status IN (N'pending', N'queued') AND r.scheduled_for >= CAST(:now AS DATETIME2(6))
                    AND r.note LIKE N'%; moved from %'))));
SELECT run_id, job_name, scheduled_for, status, note, operation_id FROM @skipped;

-- upsert_jobs --
-- Write every configured job in one round trip; a new job, a changed schedule or time zone, or a job re-enabled starts from its new next_due_at. A job whose definition (definition_hash: every setting the sync writes, from shared/engine/scheduler.py) is what the last sync wrote is left as it is: its updated_at stays the time its definition last changed (the follow-up refusals are told once per definition from it).
-- Update-then-insert under the lock the caller already holds (no MERGE: Babelfish refuses it). The settings sync runs it under the job-definitions applock (lock_job_definitions; the T-SQL procedures take it too), so no other writer defines a job meanwhile. Within that, on SQL Server the UPDATE and the NOT EXISTS probe of the insert hold key-range locks on every job name they look up to the end of the transaction (UPDLOCK, HOLDLOCK: "Table hints (Transact-SQL)", https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table), the guarantee MERGE ... WITH (HOLDLOCK) gave. The JSON is read once, into a table variable.
DECLARE @s TABLE (job_name NVARCHAR(64), schedule NVARCHAR(400), timezone NVARCHAR(64), command NVARCHAR(MAX),
                  target_database NVARCHAR(128), enabled SMALLINT, valid SMALLINT, config_error NVARCHAR(MAX),
                  max_attempts INT, timeout_seconds INT, lease_seconds INT, misfire NVARCHAR(16), grace_seconds INT,
                  overlap NVARCHAR(16), next_due_at DATETIME2(6), steps NVARCHAR(MAX), notify NVARCHAR(16),
                  notify_webhook_url NVARCHAR(2000), after_job NVARCHAR(64), after_outcome NVARCHAR(16), calendars NVARCHAR(MAX), jitter_seconds INT,
                  max_duration_seconds INT, stop_after_seconds INT, slower_than FLOAT, deadline_seconds INT, catchup_seconds INT,
                  definition_hash NVARCHAR(64), params NVARCHAR(MAX));
INSERT INTO @s (job_name, schedule, timezone, command, target_database, enabled, valid, config_error, max_attempts,
                timeout_seconds, lease_seconds, misfire, grace_seconds, overlap, next_due_at, steps, notify,
                notify_webhook_url, after_job, after_outcome, calendars, jitter_seconds, max_duration_seconds, stop_after_seconds, slower_than,
                deadline_seconds, catchup_seconds, definition_hash, params)
SELECT j.job_name, agent.json_text(j.schedule), j.timezone, agent.json_text(j.command), j.target_database,
       j.enabled, j.valid, agent.json_text(j.config_error),
       j.max_attempts, j.timeout_seconds, j.lease_seconds, j.misfire, j.grace_seconds, j.overlap,
       CONVERT(DATETIME2(6), j.next_due_at, 121), agent.json_text(j.steps), j.notify,
       agent.json_text(j.notify_webhook_url), j.after_job, j.after_outcome, agent.json_text(j.calendars),
       COALESCE(j.jitter_seconds, 0), j.max_duration_seconds, j.stop_after_seconds, j.slower_than, j.deadline_seconds, COALESCE(j.catchup_seconds, 0),
       j.definition_hash, agent.json_text(j.params)
FROM OPENJSON(:jobs) WITH (
    job_name NVARCHAR(64), schedule NVARCHAR(400), timezone NVARCHAR(64), command NVARCHAR(MAX),
    target_database NVARCHAR(128), enabled SMALLINT, valid SMALLINT, config_error NVARCHAR(MAX),
    max_attempts INT, timeout_seconds INT, lease_seconds INT, misfire NVARCHAR(16),
    grace_seconds INT, overlap NVARCHAR(16), next_due_at NVARCHAR(40), steps NVARCHAR(MAX),
    notify NVARCHAR(16), notify_webhook_url NVARCHAR(2000), after_job NVARCHAR(64),
    after_outcome NVARCHAR(16), calendars NVARCHAR(MAX), jitter_seconds INT, max_duration_seconds INT, stop_after_seconds INT,
    slower_than FLOAT, deadline_seconds INT, catchup_seconds INT, definition_hash NVARCHAR(64),
    params NVARCHAR(MAX)) AS j;
-- Never over a job defined in the database (the sync renamed such rows; this guards the rule).
-- The names compare case-insensitively (the default collation): a settings job may take back, in
-- another letter case, the row of a removed job ('backup' removed, 'Backup' added). The row then
-- takes the spelling in force, job_name = s.job_name, so the job reads as the settings write it
-- (no foreign key refers to job_name; runs and events written under the old spelling still
-- compare equal to it).
UPDATE t SET
    job_name = s.job_name,
    next_due_at = CASE
        WHEN t.schedule <> s.schedule
          OR t.timezone <> s.timezone
          OR t.enabled <> s.enabled
          OR t.valid <> s.valid
          OR t.configured = 0
        THEN s.next_due_at
        -- Calendars or jitter changed: back to the new next slot (the runs claimed ahead from it
        -- on were recorded skipped by skip_runs_of_changed_jobs), never past a slot not yet claimed;
        -- a job with no next slot left (a one-time job once claimed) whose run not yet due (one a
        -- calendar moved) skip_runs_of_changed_jobs just recorded skipped is decided again. Never
        -- before now: a one-time job's slot that has passed is not a missed slot then.
        WHEN (t.jitter_seconds <> s.jitter_seconds OR t.calendars <> s.calendars
               OR (t.calendars IS NULL AND s.calendars IS NOT NULL) OR (t.calendars IS NOT NULL AND s.calendars IS NULL))
          AND s.next_due_at IS NOT NULL AND t.next_due_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = t.job_name AND o.status = N'skipped'
                        AND o.finished_at = CAST(:now AS DATETIME2(6))
                        AND o.note = N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here')
        THEN CAST(:now AS DATETIME2(6))
        WHEN (t.jitter_seconds <> s.jitter_seconds OR t.calendars <> s.calendars
               OR (t.calendars IS NULL AND s.calendars IS NOT NULL) OR (t.calendars IS NOT NULL AND s.calendars IS NULL))
          AND s.next_due_at IS NOT NULL AND t.next_due_at IS NOT NULL AND s.next_due_at < t.next_due_at
        THEN CASE WHEN s.next_due_at < CAST(:now AS DATETIME2(6)) THEN CAST(:now AS DATETIME2(6)) ELSE s.next_due_at END
        WHEN (t.jitter_seconds <> s.jitter_seconds OR t.calendars <> s.calendars
               OR (t.calendars IS NULL AND s.calendars IS NOT NULL) OR (t.calendars IS NOT NULL AND s.calendars IS NULL))
          AND t.next_due_at IS NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = t.job_name AND o.status = N'skipped'
                        AND o.finished_at = CAST(:now AS DATETIME2(6))
                        AND o.note IN (N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed', N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'))
        THEN CASE WHEN s.next_due_at > CAST(:now AS DATETIME2(6)) THEN s.next_due_at ELSE CAST(:now AS DATETIME2(6)) END ELSE t.next_due_at END,
    advanced_at = CASE
        WHEN t.schedule <> s.schedule
          OR t.timezone <> s.timezone
          OR t.enabled <> s.enabled
          OR t.valid <> s.valid
          OR t.configured = 0
        THEN CAST(:now AS DATETIME2(6))
        WHEN (t.jitter_seconds <> s.jitter_seconds OR t.calendars <> s.calendars
               OR (t.calendars IS NULL AND s.calendars IS NOT NULL) OR (t.calendars IS NOT NULL AND s.calendars IS NULL))
          AND s.next_due_at IS NOT NULL AND t.next_due_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = t.job_name AND o.status = N'skipped'
                        AND o.finished_at = CAST(:now AS DATETIME2(6))
                        AND o.note = N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here')
        THEN CAST(:now AS DATETIME2(6))
        WHEN (t.jitter_seconds <> s.jitter_seconds OR t.calendars <> s.calendars
               OR (t.calendars IS NULL AND s.calendars IS NOT NULL) OR (t.calendars IS NOT NULL AND s.calendars IS NULL))
          AND s.next_due_at IS NOT NULL AND t.next_due_at IS NOT NULL AND s.next_due_at < t.next_due_at
        THEN CAST(:now AS DATETIME2(6))
        WHEN (t.jitter_seconds <> s.jitter_seconds OR t.calendars <> s.calendars
               OR (t.calendars IS NULL AND s.calendars IS NOT NULL) OR (t.calendars IS NOT NULL AND s.calendars IS NULL))
          AND t.next_due_at IS NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = t.job_name AND o.status = N'skipped'
                        AND o.finished_at = CAST(:now AS DATETIME2(6))
                        AND o.note IN (N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed', N'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'))
        THEN CAST(:now AS DATETIME2(6)) ELSE t.advanced_at END,
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
    defined_in_database = 0,
    needs_planning = 0,
    updated_at = CAST(:now AS DATETIME2(6)),
    steps = s.steps,
    notify = s.notify,
    notify_webhook_url = s.notify_webhook_url,
    after_job = s.after_job,
    after_outcome = s.after_outcome,
    calendars = s.calendars,
    jitter_seconds = s.jitter_seconds,
    max_duration_seconds = s.max_duration_seconds,
    stop_after_seconds = s.stop_after_seconds,
    slower_than = s.slower_than,
    deadline_seconds = s.deadline_seconds,
    catchup_seconds = s.catchup_seconds,
    definition_hash = s.definition_hash,
    params = s.params
FROM agent.jobs AS t WITH (UPDLOCK, HOLDLOCK), @s AS s
WHERE t.job_name = s.job_name
  AND (t.configured = 0
       OR (t.defined_in_database = 0 AND (t.definition_hash IS NULL OR s.definition_hash IS NULL
                                          OR t.definition_hash <> s.definition_hash)));
INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid, config_error,
                        max_attempts, timeout_seconds, lease_seconds, misfire, grace_seconds, overlap,
                        next_due_at, advanced_at, configured, updated_at, steps, notify, notify_webhook_url,
                        after_job, after_outcome, calendars, jitter_seconds, max_duration_seconds, stop_after_seconds,
                        slower_than, deadline_seconds, catchup_seconds, definition_hash, params)
SELECT s.job_name, s.schedule, s.timezone, s.command, s.target_database, s.enabled, s.valid,
       s.config_error, s.max_attempts, s.timeout_seconds, s.lease_seconds, s.misfire,
       s.grace_seconds, s.overlap, s.next_due_at, CAST(:now AS DATETIME2(6)), 1, CAST(:now AS DATETIME2(6)),
       s.steps, s.notify, s.notify_webhook_url, s.after_job, s.after_outcome, s.calendars, s.jitter_seconds,
       s.max_duration_seconds, s.stop_after_seconds, s.slower_than, s.deadline_seconds, s.catchup_seconds, s.definition_hash, s.params
FROM @s AS s
WHERE NOT EXISTS (SELECT 1 FROM agent.jobs AS e WITH (UPDLOCK, HOLDLOCK) WHERE e.job_name = s.job_name);

-- refresh_runs_of_changed_jobs --
-- Runs claimed ahead that never started (pending or queued, attempt 0) of a settings job whose schedule, time zone and enabled state stand but whose other settings changed take the new ones (command, database, overlap, attempts, timeout, lease, steps): a slot after the change runs what the settings say now, not what they said when it was claimed. Before upsert_jobs (it compares with the job as stored).
-- UPDATE ... FROM a derived table joined in the WHERE clause; the caller holds the job-definitions applock.
UPDATE r SET command = x.command, target_database = x.target_database, overlap = x.overlap,
    max_attempts = x.max_attempts, timeout_seconds = x.timeout_seconds, lease_seconds = x.lease_seconds,
    steps = x.steps
FROM agent.runs AS r,
     (SELECT j.job_name, agent.json_text(j.command) AS command, j.target_database, j.overlap, j.max_attempts,
             j.timeout_seconds, j.lease_seconds, agent.json_text(j.steps) AS steps
      FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64), schedule NVARCHAR(400), timezone NVARCHAR(64),
                                 command NVARCHAR(MAX), target_database NVARCHAR(128), enabled INT, valid INT,
                                 max_attempts INT, timeout_seconds INT, lease_seconds INT, overlap NVARCHAR(16),
                                 steps NVARCHAR(MAX), definition_hash NVARCHAR(64)) AS j
      JOIN agent.jobs AS c ON c.job_name = j.job_name
      WHERE c.configured = 1 AND c.defined_in_database = 0 AND c.valid = 1 AND c.enabled = 1
        AND j.valid = 1 AND j.enabled = 1 AND agent.json_text(j.schedule) = c.schedule AND j.timezone = c.timezone
        AND (c.definition_hash IS NULL OR j.definition_hash IS NULL OR c.definition_hash <> j.definition_hash)) AS x
WHERE r.job_name = x.job_name AND r.kind = N'scheduled' AND r.status IN (N'pending', N'queued') AND r.attempt = 0;

-- unconfigure_missing_jobs --
-- Jobs no longer in the settings stop being scheduled; their history stays.
UPDATE agent.jobs SET configured = 0, next_due_at = NULL, updated_at = CAST(:now AS DATETIME2(6))
WHERE configured = 1 AND defined_in_database = 0
  AND job_name NOT IN (SELECT j.job_name FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64)) AS j);

-- insert_job_events --
-- Record things that happened to jobs outside any run (a JSON array of {job_name, kind, detail}).
INSERT INTO agent.job_events (job_name, event_at, kind, detail)
SELECT e.job_name, CAST(:now AS DATETIME2(6)), e.kind, agent.json_text(e.detail)
FROM OPENJSON(:events) WITH (job_name NVARCHAR(64), kind NVARCHAR(32), detail NVARCHAR(MAX)) AS e;

-- expire_leases --
-- Take back every run whose holder stopped renewing its lease (a lapse: the worker died or lost the database; counted apart from attempts, failed after AGENT_MAX_LAPSES) or whose message was lost, fencing it with a new token.
-- Two UPDATEs, one per former status, instead of reading deleted.status in the OUTPUT clause (Babelfish refuses deleted.* on a table named with its schema): each tells what the run was by which statement took it. The first leaves no run queued, so the second cannot take a run twice. Each qualifies its rows with update locks on their current committed version on SQL Server (https://learn.microsoft.com/sql/t-sql/queries/update-transact-sql), as the single statement did; the token bump fences the former holder on both engines.
DECLARE @expired TABLE (run_id BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16), status NVARCHAR(16), attempt INT,
                        lapses INT, token BIGINT, operation_id NVARCHAR(32), scheduled_for DATETIME2(6), was_running INT);
-- Lock order: the rows are locked first in key order (an ordered scan of the clustered key), so racing ticks never deadlock.
DECLARE @lock_runs TABLE (run_id BIGINT);
INSERT INTO @lock_runs (run_id)
SELECT run_id FROM agent.runs WITH (UPDLOCK, ROWLOCK, INDEX(runs_pk))
WHERE status IN (N'queued', N'running') AND lease_expires_at < CAST(:now AS DATETIME2(6)) AND awaiting_targets = 0
ORDER BY run_id;
UPDATE agent.runs SET
    status = CASE WHEN lapses + 1 > CAST(:max_lapses AS INT) THEN N'failed' ELSE N'pending' END,
    lapses = lapses + 1,
    token = token + 1,
    lease_expires_at = NULL,
    runnable_at = CAST(:now AS DATETIME2(6)),
    finished_at = CASE WHEN lapses + 1 > CAST(:max_lapses AS INT) THEN CAST(:now AS DATETIME2(6)) ELSE NULL END,
    last_error = N'lease lapsed: worker ' + COALESCE(worker, N'?') + N' stopped renewing its lease (lapse '
                 + CAST(lapses + 1 AS NVARCHAR(12)) + N' of AGENT_MAX_LAPSES='
                 + CAST(CAST(:max_lapses AS INT) AS NVARCHAR(12)) + N')'
OUTPUT inserted.run_id, inserted.job_name, inserted.kind, inserted.status, inserted.attempt, inserted.lapses,
       inserted.token, inserted.operation_id, inserted.scheduled_for, 1 INTO @expired
WHERE status = N'running' AND lease_expires_at < CAST(:now AS DATETIME2(6)) AND awaiting_targets = 0;
UPDATE agent.runs SET
    status = N'pending',
    token = token + 1,
    lease_expires_at = NULL,
    finished_at = NULL,
    last_error = N'dispatch lease expired: the message was not picked up in time; dispatching again'
OUTPUT inserted.run_id, inserted.job_name, inserted.kind, inserted.status, inserted.attempt, inserted.lapses,
       inserted.token, inserted.operation_id, inserted.scheduled_for, 0 INTO @expired
WHERE status = N'queued' AND lease_expires_at < CAST(:now AS DATETIME2(6)) AND awaiting_targets = 0;
SELECT run_id, job_name, kind, status, attempt, lapses, token, operation_id, scheduled_for, was_running FROM @expired;

-- close_dead_attempts --
-- Mark attempts still 'running' whose run has moved on to a newer token: their worker died or was fenced.
UPDATE a SET outcome = N'lease_expired', finished_at = CAST(:now AS DATETIME2(6)),
    error_message = N'lease lapsed: the worker stopped renewing its lease (killed, hung or cut off from the database)'
FROM agent.attempts AS a
JOIN agent.runs AS r ON r.run_id = a.run_id
WHERE a.outcome = N'running' AND a.token < r.token;

-- select_runaway_jobs --
-- Jobs whose next slot was moved by a tick whose clock ran ahead of this one by more than AGENT_MAX_CLOCK_SKEW_SECONDS.
SELECT job_name, schedule, timezone, next_due_at, advanced_at
FROM agent.jobs
WHERE advanced_at > CAST(:far AS DATETIME2(6)) AND configured = 1
ORDER BY job_name;

-- recover_runaway_runs --
-- Undo what a clock far ahead created: its never-started slots go, and the misfires it recorded (false: the slots had not come; they are claimed again when their time comes), other never-started runs become runnable now, and leases set far ahead come back within reach.
DECLARE @recovered TABLE (action NVARCHAR(20), run_id BIGINT, job_name NVARCHAR(64), scheduled_for DATETIME2(6));
DELETE r
OUTPUT N'removed', deleted.run_id, deleted.job_name, deleted.scheduled_for INTO @recovered
FROM agent.runs AS r
WHERE r.kind = N'scheduled' AND r.status IN (N'pending', N'queued', N'skipped') AND r.attempt = 0
  AND r.created_at > CAST(:far AS DATETIME2(6));
UPDATE agent.runs SET runnable_at = CAST(:now AS DATETIME2(6)), created_at = CAST(:now AS DATETIME2(6)),
    status = N'pending', lease_expires_at = NULL
OUTPUT N'made runnable', inserted.run_id, inserted.job_name, inserted.scheduled_for INTO @recovered
WHERE kind <> N'scheduled' AND status IN (N'pending', N'queued') AND created_at > CAST(:far AS DATETIME2(6));
UPDATE agent.runs SET lease_expires_at = DATEADD(second, lease_seconds, CAST(:now AS DATETIME2(6)))
OUTPUT N'lease shortened', inserted.run_id, inserted.job_name, inserted.scheduled_for INTO @recovered
WHERE status IN (N'queued', N'running') AND lease_expires_at > CAST(:far_lease AS DATETIME2(6));
SELECT action, run_id, job_name, scheduled_for FROM @recovered;

-- select_due_jobs --
-- Jobs with a slot at or before the claim horizon (the next tick plus a margin), each with whether a pause is in force at :now and its window (one that ended names the slots missed inside it); their slots are computed in Python, for these jobs only.
-- The job-definitions applock, then the pauses applock, are taken shared first, to the claim's commit (a table is read first: an owner 'Transaction' applock needs an open transaction; the order is the one agent.enable_job takes them in): a pause_job either committed before it (the claim sees the pause) or waits for this claim to commit (and skips what it claimed inside the pause); a definition (a settings sync, agent.add_scheduled_job, enable_job, remove_scheduled_job) either committed before it (the slots are computed from it) or waits for this claim to commit (and skips the slots it claimed under the old one).
DECLARE @pauses_read INT;
SELECT @pauses_read = COUNT(*) FROM agent.start_lock;
DECLARE @lock_result INT;
EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Shared', @LockOwner = N'Transaction', @LockTimeout = 30000;
IF @lock_result < 0 THROW 50001, N'the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Shared', @LockOwner = N'Transaction', @LockTimeout = 30000;
IF @lock_result < 0 THROW 50001, N'the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
SELECT j.job_name, j.schedule, j.timezone, j.next_due_at, j.misfire, j.grace_seconds, j.calendars, j.jitter_seconds, j.catchup_seconds,
       CASE WHEN p.job_name IS NULL THEN 0
            WHEN p.paused_until IS NULL OR p.paused_until > CAST(:now AS DATETIME2(6)) THEN 1 ELSE 0 END AS paused,
       p.paused_at, p.paused_until
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p ON p.job_name = j.job_name
WHERE j.next_due_at <= CAST(:horizon AS DATETIME2(6)) AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
ORDER BY j.job_name;

-- claim_slots --
-- Claim the given slots (a JSON array of {job_name, scheduled_for, status, note, runnable_at}) in one round trip; the duplicate probe holds key-range locks on the unique (job_name, scheduled_for) index it is forced to seek, so concurrent ticks insert nothing twice. A run becomes runnable at its slot (runnable_at, when given: later, the end of the pause that held it), never before. A slot whose run a change of the job's definition recorded skipped (note 'skipped: the job ...': disabled, removed, redefined, schedule changed) and that never started is the job's again when a claim under the definition now in force plans it (enabled again, added back, a new schedule with a slot at the same instant); so is a slot a calendar recorded skipped (note 'calendar: ...') that the calendars now in force decide otherwise (allowed, or moved elsewhere): its run takes the planned decision and the definition's values in place (the same run id; a new token fences a message sent before; the operation id chosen for the slot, by which it is read back with the runs inserted).
-- The revival is an UPDATE before the INSERT, under the claim lock, joined in the WHERE clause with no OUTPUT (Babelfish); the INSERT's probe then finds the run and inserts nothing for it.
-- The rows inserted are read back by their operation ids (chosen first, into @slots) instead of through OUTPUT: Babelfish refuses INSERT ... OUTPUT INTO ... SELECT ... ORDER BY, and the ORDER BY stays, since it is what makes SQL Server compute the identity values (run ids) in that order ("INSERT (Transact-SQL)", https://learn.microsoft.com/sql/t-sql/statements/insert-transact-sql). On SQL Server the (UPDLOCK, HOLDLOCK) of the probe holds a key-range lock on each (job_name, scheduled_for) to the end of the transaction (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table): a concurrent tick waits, then finds the row. Babelfish ignores the hints, so the claims of concurrent ticks also take the claim lock first: an exclusive applock to the end of the transaction, under which a second tick waits for the first one's commit and its INSERT (a new statement, a new snapshot on Babelfish) then finds the slots claimed and inserts nothing, instead of meeting the unique index runs_job_slot (2627) and rolling back its whole claim. On SQL Server it orders what the key-range locks already decided. Only claims take it (after select_due_jobs' shared pauses applock, which takes no row lock), so a transaction waiting for it holds nothing its holder will wait for: no deadlock.
-- A table is read first: an owner 'Transaction' applock needs an open transaction, and EXEC opens none.
DECLARE @claims_read INT;
SELECT @claims_read = COUNT(*) FROM agent.start_lock;
DECLARE @lock_result INT;
EXEC @lock_result = sp_getapplock @Resource = N'agent.claim_slots', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
IF @lock_result < 0 THROW 50001, N'the claim lock (sp_getapplock agent.claim_slots) was not granted within 30 s', 1;
DECLARE @slots TABLE (job_name NVARCHAR(64), scheduled_for DATETIME2(6), status NVARCHAR(16), note NVARCHAR(MAX),
                      operation_id NVARCHAR(32), runnable_at DATETIME2(6));
INSERT INTO @slots (job_name, scheduled_for, status, note, operation_id, runnable_at)
SELECT x.job_name, CONVERT(DATETIME2(6), x.scheduled_for, 121), x.status, agent.json_text(x.note),
       LOWER(REPLACE(CONVERT(VARCHAR(36), NEWID()), '-', '')),
       COALESCE(CONVERT(DATETIME2(6), x.runnable_at, 121), CONVERT(DATETIME2(6), x.scheduled_for, 121))
FROM OPENJSON(:slots) WITH (job_name NVARCHAR(64), scheduled_for NVARCHAR(40), status NVARCHAR(16),
                            note NVARCHAR(MAX), runnable_at NVARCHAR(40)) AS x;
UPDATE r SET status = d.status, note = d.note, runnable_at = d.runnable_at,
    finished_at = CASE WHEN d.status = N'skipped' THEN CAST(:now AS DATETIME2(6)) END, lease_expires_at = NULL,
    dispatched_at = NULL, last_error = NULL, last_error_number = NULL, token = r.token + 1,
    created_at = CAST(:now AS DATETIME2(6)), operation_id = d.operation_id, command = d.command,
    target_database = d.target_database, overlap = d.overlap, max_attempts = d.max_attempts,
    timeout_seconds = d.timeout_seconds, lease_seconds = d.lease_seconds, steps = d.steps
FROM agent.runs AS r WITH (FORCESEEK(runs_job_slot(job_name, scheduled_for))),
     (SELECT s.job_name, s.scheduled_for, s.operation_id, s.runnable_at,
             CASE WHEN p.job_name IS NULL THEN s.status ELSE N'skipped' END AS status,
             CASE WHEN p.job_name IS NULL THEN s.note ELSE N'paused' END AS note,
             j.command, j.target_database, j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, j.steps
      FROM @slots AS s
      JOIN agent.jobs AS j ON j.job_name = s.job_name AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
      LEFT JOIN agent.job_pauses AS p
             ON p.job_name = s.job_name AND p.paused_at <= CAST(:now AS DATETIME2(6))
            AND (p.paused_until IS NULL OR p.paused_until > CAST(:now AS DATETIME2(6)))
            AND (p.paused_until IS NULL OR s.runnable_at < p.paused_until)) AS d
WHERE r.job_name IS NOT NULL AND r.job_name = d.job_name AND r.scheduled_for = d.scheduled_for
  AND r.kind = N'scheduled' AND r.status = N'skipped' AND r.attempt = 0
  AND (r.note LIKE N'skipped: the job%'
       -- A slot a calendar excluded that the calendars now in force decide otherwise.
       OR (r.note LIKE N'calendar:%' AND (d.status <> N'skipped' OR (d.note LIKE N'calendar:%' AND d.note <> r.note))));
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note, steps)
SELECT j.job_name, N'scheduled', s.scheduled_for, CASE WHEN p.job_name IS NULL THEN s.status ELSE N'skipped' END,
       j.command, j.target_database, j.overlap,
       j.max_attempts, j.timeout_seconds, j.lease_seconds, s.runnable_at, CAST(:now AS DATETIME2(6)),
       CASE WHEN s.status = N'skipped' OR p.job_name IS NOT NULL THEN CAST(:now AS DATETIME2(6)) END,
       s.operation_id, CASE WHEN p.job_name IS NULL THEN s.note ELSE N'paused' END, j.steps
FROM @slots AS s
JOIN agent.jobs AS j ON j.job_name = s.job_name AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
-- A pause in force: a slot that would run before its end is recorded skipped 'paused', never claimed.
LEFT JOIN agent.job_pauses AS p
       ON p.job_name = s.job_name AND p.paused_at <= CAST(:now AS DATETIME2(6))
      AND (p.paused_until IS NULL OR p.paused_until > CAST(:now AS DATETIME2(6)))
      AND (p.paused_until IS NULL OR s.runnable_at < p.paused_until)
WHERE NOT EXISTS (
    SELECT 1 FROM agent.runs AS e WITH (UPDLOCK, HOLDLOCK, FORCESEEK(runs_job_slot(job_name, scheduled_for)))
    WHERE e.job_name IS NOT NULL AND e.job_name = s.job_name AND e.scheduled_for = s.scheduled_for)
ORDER BY j.job_name, s.scheduled_for;
SELECT r.run_id, r.job_name, r.scheduled_for, r.status, r.note, r.operation_id, r.token
FROM @slots AS s
JOIN agent.runs AS r ON r.job_name = s.job_name AND r.scheduled_for = s.scheduled_for
                    AND r.operation_id = s.operation_id;

-- advance_jobs --
-- Move jobs to their next slot, per schedule (a JSON array of {schedule, timezone, from_due, next_due_at, paused, misfire, job_name}; paused 1: only the jobs with a pause in force at :now, 0: only the others, absent: both; misfire, when given: only the jobs of that policy; job_name, when given: that job only, as for a paused job, whose next slot depends on its own pause); a job another tick already moved is left as it is.
-- UPDATE ... FROM a derived table joined in the WHERE clause (Babelfish refuses an UPDATE ... OUTPUT whose SET reads a table joined with JOIN ... ON). The condition on next_due_at is the fence: an UPDATE qualifies its rows on their current committed version under update locks on SQL Server, and PostgreSQL re-checks it on the version a concurrent tick committed, so a job is moved once.
DECLARE @advanced TABLE (job_name NVARCHAR(64));
-- Lock order: the jobs are locked first in key order (an ordered scan of the clustered key), so racing ticks never deadlock.
DECLARE @lock_jobs TABLE (job_name NVARCHAR(64));
INSERT INTO @lock_jobs (job_name)
SELECT x.job_name FROM agent.jobs AS x WITH (UPDLOCK, ROWLOCK, INDEX(jobs_pk))
WHERE EXISTS (SELECT 1 FROM OPENJSON(:advances) WITH (schedule NVARCHAR(400), timezone NVARCHAR(64),
                                                      from_due NVARCHAR(40)) AS v
              WHERE x.next_due_at = CONVERT(DATETIME2(6), v.from_due, 121) AND x.schedule = agent.json_text(v.schedule)
                AND x.timezone = v.timezone)
ORDER BY x.job_name;
UPDATE j SET next_due_at = a.next_due_at, advanced_at = CAST(:now AS DATETIME2(6))
OUTPUT inserted.job_name INTO @advanced
FROM agent.jobs AS j,
     (SELECT agent.json_text(x.schedule) AS schedule, x.timezone, CONVERT(DATETIME2(6), x.from_due, 121) AS from_due,
             CONVERT(DATETIME2(6), x.next_due_at, 121) AS next_due_at, x.paused, x.misfire, x.job_name
      FROM OPENJSON(:advances) WITH (schedule NVARCHAR(400), timezone NVARCHAR(64), from_due NVARCHAR(40),
                                     next_due_at NVARCHAR(40), paused INT, misfire NVARCHAR(16),
                                     job_name NVARCHAR(64)) AS x) AS a
WHERE j.next_due_at = a.from_due AND j.schedule = a.schedule AND j.timezone = a.timezone
  AND (a.misfire IS NULL OR j.misfire = a.misfire) AND (a.job_name IS NULL OR j.job_name = a.job_name)
  AND (a.paused IS NULL OR a.paused = CASE WHEN EXISTS (
           SELECT 1 FROM agent.job_pauses AS p
           WHERE p.job_name = j.job_name
             AND (p.paused_until IS NULL OR p.paused_until > CAST(:now AS DATETIME2(6)))) THEN 1 ELSE 0 END);
SELECT job_name FROM @advanced;

-- dispatch_runs --
-- Queue mode: under the start lock, skip the slots that may not run, then hand the queue every due run that may start (task order, overlap 'queue', the cap counting runs executing or due on the queue) and every run due within the lookahead (a delayed message; it holds no place). Each gets a new token and a dispatch lease. (agent.dispatch_runs, a procedure of migration 0023.)
EXEC agent.dispatch_runs :now, :late_cutoff, :max_concurrency, :lookahead_until, :ahead_limit, :dispatch_lease_seconds;

-- release_dispatch --
-- Put back runs whose queue message could not be sent (a JSON array of {run_id, token}); a later dispatch sends them again.
DECLARE @released TABLE (run_id BIGINT);
UPDATE r SET status = N'pending', lease_expires_at = NULL
OUTPUT inserted.run_id INTO @released
FROM agent.runs AS r
JOIN OPENJSON(:runs) WITH (run_id BIGINT, token BIGINT) AS x ON r.run_id = x.run_id AND r.token = x.token
WHERE r.status = N'queued';
SELECT run_id FROM @released;

-- start_run --
-- Queue mode, fenced start of the run a message names: only for the current token of a queued run, decided under the start lock: early (the slot has not come), skipped (overlap skip, misfire), held back to pending (task order, overlap queue, the cap) or started with its attempt opened. owner as claim_runs gives it. (agent.start_run, a procedure of migration 0023, in a transaction of its own.)
EXEC agent.start_run :now, :late_cutoff, :max_concurrency, :run_id, :token, :worker, :dequeue_count;

-- claim_runs --
-- Local runner: under the start lock, skip the slots that may not run, then start up to :batch runnable runs straight from agent.runs (task order, overlap, the cap), each with a new token and its attempt opened. :now NULL: decided on the database's own clock (the agent's one clock; an explicit :now is a test's clock). owner: whom the run's SQL runs as ('' the agent's user). (agent.claim_runs, a procedure of migration 0023, in a transaction of its own: one round trip, no COMMIT after it.)
EXEC agent.claim_runs :now, :late_cutoff, :batch, :max_concurrency, :worker;

-- next_runnable_at --
-- When the next pending run becomes runnable (the local runner's idle workers sleep until then, or the poll interval).
SELECT MIN(runnable_at) AS next_at FROM agent.runs
WHERE status = N'pending' AND runnable_at > CAST(:now AS DATETIME2(6));

-- renew_leases --
-- One statement renews the lease of every run a process holds (a JSON array of {run_id, token}); a run missing from the result was taken over or cancelled.
DECLARE @renewed TABLE (run_id BIGINT);
-- Lock order: the held runs are locked first in key order (an ordered seek of the clustered key).
DECLARE @lock_held TABLE (run_id BIGINT);
INSERT INTO @lock_held (run_id)
SELECT x.run_id FROM agent.runs AS x WITH (UPDLOCK, ROWLOCK, INDEX(runs_pk))
WHERE x.run_id IN (SELECT h.run_id FROM OPENJSON(:held) WITH (run_id BIGINT) AS h)
ORDER BY x.run_id;
UPDATE r SET heartbeat_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = DATEADD(second, r.lease_seconds, CAST(:now AS DATETIME2(6)))
OUTPUT inserted.run_id INTO @renewed
FROM agent.runs AS r
JOIN OPENJSON(:held) WITH (run_id BIGINT, token BIGINT) AS h ON r.run_id = h.run_id AND r.token = h.token
WHERE r.status = N'running' AND r.awaiting_targets = 0;
SELECT run_id FROM @renewed;

-- reset_session --
-- The job ran inside sp_executesql, whose scope restored its SET options and dropped its temporary tables; these make sure of what the agent's own statements need.
SET LOCK_TIMEOUT 30000;
SET NOCOUNT ON;
SET XACT_ABORT ON;
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SELECT 1 AS unlocked WHERE 1 = 0;

-- finish_run --
-- Fenced completion (in the job's transaction, after check_work_transaction, or alone after work in another database): the run and its open attempt succeed together, only for the current token; when the token moved on (the lease was taken over, or the run cancelled) it raises (50003), so that a batch ending with COMMIT stops before it. (agent.finish_run, a procedure of migration 0023.)
EXEC agent.finish_run :run_id, :token, :now;

-- fail_run --
-- Fenced failure (an error in the job's SQL, or its timeout): spends one of max_attempts; back to pending at :retry_at while attempts remain, else failed; the attempt closes with the error.
DECLARE @failed TABLE (run_id BIGINT, token BIGINT, status NVARCHAR(16), attempt INT, failures INT, max_attempts INT);
UPDATE agent.runs SET
    failures = failures + 1,
    status = CASE WHEN failures + 1 < max_attempts THEN N'pending' ELSE N'failed' END,
    runnable_at = CAST(:retry_at AS DATETIME2(6)),
    finished_at = CASE WHEN failures + 1 < max_attempts THEN NULL ELSE CAST(:now AS DATETIME2(6)) END,
    lease_expires_at = NULL,
    last_error_number = :error_number,
    last_error = :error_message
OUTPUT inserted.run_id, inserted.token, inserted.status, inserted.attempt, inserted.failures, inserted.max_attempts
  INTO @failed
WHERE run_id = :run_id AND token = :token AND status = N'running';
UPDATE a SET outcome = :outcome, finished_at = CAST(:now AS DATETIME2(6)),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
FROM agent.attempts AS a
JOIN @failed AS f ON a.run_id = f.run_id AND a.token = f.token
WHERE a.outcome = N'running';
SELECT status, attempt, failures, max_attempts FROM @failed;

-- retry_transient --
-- Local runner, fenced: a transient error spends no attempt; the run goes back to pending at :retry_at and counts the transient error; the attempt closes with it.
DECLARE @retried TABLE (run_id BIGINT, token BIGINT, status NVARCHAR(16), transient_errors INT);
UPDATE agent.runs SET status = N'pending', transient_errors = transient_errors + 1,
    runnable_at = CAST(:retry_at AS DATETIME2(6)), lease_expires_at = NULL,
    last_error_number = :error_number, last_error = :error_message
OUTPUT inserted.run_id, inserted.token, inserted.status, inserted.transient_errors INTO @retried
WHERE run_id = :run_id AND token = :token AND status = N'running';
UPDATE a SET outcome = N'transient', finished_at = CAST(:now AS DATETIME2(6)),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
FROM agent.attempts AS a
JOIN @retried AS t ON a.run_id = t.run_id AND a.token = t.token
WHERE a.outcome = N'running';
SELECT status, transient_errors FROM @retried;

-- requeue_transient --
-- Queue mode, fenced: a transient error spends no attempt; the run goes back to the queue's redelivery (same token) with a dispatch lease in case the message is lost; the attempt closes with the error.
DECLARE @requeued TABLE (run_id BIGINT, token BIGINT, status NVARCHAR(16));
UPDATE agent.runs SET status = N'queued', lease_expires_at = CAST(:lease_until AS DATETIME2(6)),
    last_error_number = :error_number, last_error = :error_message
OUTPUT inserted.run_id, inserted.token, inserted.status INTO @requeued
WHERE run_id = :run_id AND token = :token AND status = N'running';
UPDATE a SET outcome = N'transient', finished_at = CAST(:now AS DATETIME2(6)),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
FROM agent.attempts AS a
JOIN @requeued AS t ON a.run_id = t.run_id AND a.token = t.token
WHERE a.outcome = N'running';
SELECT status FROM @requeued;

-- poison_run --
-- Fenced: the run's current message (or, in the local runner, the run) is poisoned; the run ends poisoned and its open attempt closes with the last error.
DECLARE @poisoned TABLE (run_id BIGINT, token BIGINT);
UPDATE agent.runs SET status = N'poisoned', finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL, last_error = :reason
OUTPUT inserted.run_id, inserted.token INTO @poisoned
WHERE run_id = :run_id AND token = :token AND status IN (N'pending', N'queued', N'running');
UPDATE a SET outcome = N'poisoned', finished_at = CAST(:now AS DATETIME2(6)),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
FROM agent.attempts AS a
JOIN @poisoned AS p ON a.run_id = p.run_id AND a.token = p.token
WHERE a.outcome = N'running';
SELECT run_id FROM @poisoned;

-- close_fenced_attempt --
-- Close the attempt of a worker whose lease was taken over (its run belongs to someone else now).
DECLARE @closed TABLE (run_id BIGINT);
UPDATE agent.attempts SET outcome = N'lease_lost', finished_at = CAST(:now AS DATETIME2(6)),
    error_message = :error_message
OUTPUT inserted.run_id INTO @closed
WHERE run_id = :run_id AND token = :token AND outcome = N'running';
SELECT run_id FROM @closed;

-- get_run --
-- One run, for the executor's explanation of a message it will not run, and for the CLI.
SELECT run_id, job_name, kind, scheduled_for, status, command, target_database, task_order,
       attempt, failures, lapses, transient_errors, max_attempts, token, lease_expires_at, heartbeat_at,
       runnable_at, created_at, dispatched_at, started_at, finished_at, worker, operation_id, dequeue_count,
       last_error_number, last_error, note, step, steps, parent_run_id, parent_token, target_server,
       retry_interval_seconds, awaiting_targets, targets_total, targets_failed, followed_run_id,
       params
FROM agent.runs WHERE run_id = :run_id;

-- list_run_errors --
-- Every error seen by a run's attempts, oldest first (kept with a poison message).
SELECT attempt, token, dequeue_count, started_at, finished_at, outcome, error_number,
       error_sqlstate, error_message
FROM agent.attempts WHERE run_id = :run_id ORDER BY attempt_id;

-- insert_poison --
-- Keep a poisoned message: body as received, dequeue count, every error, the run.
DECLARE @poison TABLE (poison_id BIGINT);
INSERT INTO agent.poison_messages (run_id, message_id, body, dequeue_count, reason, errors, poisoned_at)
OUTPUT inserted.poison_id INTO @poison
VALUES (:run_id, :message_id, :body, :dequeue_count, :reason, :errors, CAST(:now AS DATETIME2(6)));
SELECT poison_id FROM @poison;

-- list_poison --
-- Poison messages, newest first.
SELECT TOP (:limit) poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages ORDER BY poison_id DESC;

-- get_poison --
-- One poison message.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages WHERE poison_id = :poison_id;

-- requeue_run --
-- Give a poisoned or failed run one more attempt (and fresh lapse and transient budgets): back to pending, runnable now; the next start gives it a new token.
DECLARE @requeued TABLE (run_id BIGINT);
UPDATE agent.runs SET status = N'pending', runnable_at = CAST(:now AS DATETIME2(6)), finished_at = NULL,
    lease_expires_at = NULL, max_attempts = failures + 1, lapses = 0, transient_errors = 0,
    note = N'requeued by operator'
OUTPUT inserted.run_id INTO @requeued
WHERE run_id = :run_id AND status IN (N'poisoned', N'failed');
SELECT run_id FROM @requeued;

-- mark_poison_requeued --
-- Remember when a poison message was requeued.
UPDATE agent.poison_messages SET requeued_at = CAST(:now AS DATETIME2(6)) WHERE poison_id = :poison_id;

-- insert_manual_run --
-- run-now: a run of a job right away, keyed by the request time; the job's overlap policy applies, decided under the start lock (another run-now still waiting counts as in flight whatever its requester's clock said).
-- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
-- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
DECLARE @manual TABLE (run_id BIGINT, job_name NVARCHAR(64), status NVARCHAR(16), note NVARCHAR(MAX),
                       operation_id NVARCHAR(32));
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note, steps, params)
OUTPUT inserted.run_id, inserted.job_name, inserted.status, inserted.note, inserted.operation_id INTO @manual
SELECT j.job_name, N'manual', CAST(:now AS DATETIME2(6)), d.decision, j.command, j.target_database,
       j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, CAST(:now AS DATETIME2(6)),
       CAST(:now AS DATETIME2(6)), CASE WHEN d.decision = N'skipped' THEN CAST(:now AS DATETIME2(6)) END,
       :operation_id,
       CASE WHEN d.decision = N'skipped'
            THEN N'overlap: the previous run of this job was still in flight; policy skip'
            ELSE N'run-now' END, j.steps, CAST(:params AS NVARCHAR(MAX))
FROM agent.jobs AS j
CROSS APPLY (
    SELECT CASE WHEN j.overlap = N'skip' AND EXISTS (
                SELECT 1 FROM agent.runs AS a
                WHERE a.job_name = j.job_name
                  AND (a.status = N'running'
                       OR (a.status IN (N'pending', N'queued') AND (a.runnable_at <= CAST(:now AS DATETIME2(6)) OR a.kind = N'manual'))))
           THEN N'skipped' ELSE N'pending' END AS decision) AS d
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1;
SELECT run_id, job_name, status, note, operation_id FROM @manual;

-- backfill_runs --
-- sql-agent backfill JOB --from --to: each slot of the past window (a JSON array of {scheduled_for, runnable_at}, oldest first, computed as the planner computes them: calendars and jitter applied) becomes a recorded run of its slot, kind 'backfill', runnable at once in slot order: a slot without a run gets one (the unique (job, slot) key: two backfills at once insert it once); a slot recorded skipped that never started is run now (its row, with the job's definition of now); a slot that ran, runs or waits is left alone. Backfill runs are outside the misfire rules (kind is not 'scheduled') and wait for each other (overlap queue; allow when the job allows). Rows back: the runs made, with how (inserted or rerun).
DECLARE @made TABLE (run_id BIGINT, scheduled_for DATETIME2(6), action NVARCHAR(16));
DECLARE @slots TABLE (scheduled_for DATETIME2(6) PRIMARY KEY, runnable_at DATETIME2(6));
INSERT INTO @slots (scheduled_for, runnable_at)
SELECT x.scheduled_for, x.runnable_at
FROM OPENJSON(:slots) WITH (scheduled_for DATETIME2(6), runnable_at DATETIME2(6)) AS x;
UPDATE r SET status = N'pending', kind = N'backfill', runnable_at = s.runnable_at, finished_at = NULL,
    lease_expires_at = NULL, command = j.command, target_database = j.target_database,
    overlap = CASE WHEN j.overlap = N'allow' THEN N'allow' ELSE N'queue' END, max_attempts = j.max_attempts,
    timeout_seconds = j.timeout_seconds, lease_seconds = j.lease_seconds, steps = j.steps,
    operation_id = :operation_id,
    note = CAST(:note AS NVARCHAR(MAX)) + N' (the slot had been skipped: ' + COALESCE(r.note, N'') + N')'
OUTPUT inserted.run_id, inserted.scheduled_for, N'rerun' INTO @made
FROM agent.runs AS r WITH (UPDLOCK, HOLDLOCK), @slots AS s, agent.jobs AS j
WHERE r.scheduled_for = s.scheduled_for AND j.job_name = r.job_name
  AND j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
  AND r.status = N'skipped' AND r.attempt = 0;
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        operation_id, note, steps)
OUTPUT inserted.run_id, inserted.scheduled_for, N'inserted' INTO @made
SELECT j.job_name, N'backfill', s.scheduled_for, N'pending', j.command, j.target_database,
       CASE WHEN j.overlap = N'allow' THEN N'allow' ELSE N'queue' END, j.max_attempts, j.timeout_seconds,
       j.lease_seconds, s.runnable_at, CAST(:now AS DATETIME2(6)), :operation_id, CAST(:note AS NVARCHAR(MAX)), j.steps
FROM @slots AS s
CROSS JOIN agent.jobs AS j
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
  AND NOT EXISTS (SELECT 1 FROM agent.runs AS r WITH (UPDLOCK, HOLDLOCK)
                  WHERE r.job_name = j.job_name AND r.scheduled_for = s.scheduled_for);
SELECT run_id, scheduled_for, action FROM @made;

-- list_slot_runs --
-- backfill: the scheduled and backfill runs of one job keyed from :since to before :horizon (the spans of the window's slots, each from its time to the schedule's next slot): a slot's run is found whatever jitter keyed it.
SELECT scheduled_for, status, attempt, kind FROM agent.runs
WHERE job_name = :job_name AND kind IN (N'scheduled', N'backfill')
  AND scheduled_for >= CAST(:since AS DATETIME2(6)) AND scheduled_for < CAST(:horizon AS DATETIME2(6))
ORDER BY scheduled_for;

-- insert_task --
-- submit: an ad-hoc task; it starts once every task of a lower order submitted before it has finished.
DECLARE @task TABLE (run_id BIGINT, status NVARCHAR(16), operation_id NVARCHAR(32));
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                        overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                        created_at, operation_id, note)
OUTPUT inserted.run_id, inserted.status, inserted.operation_id INTO @task
VALUES (NULL, N'task', CAST(:now AS DATETIME2(6)), N'pending', :command, :target_database, :task_order,
        N'allow', :max_attempts, :timeout_seconds, :lease_seconds, CAST(:now AS DATETIME2(6)),
        CAST(:now AS DATETIME2(6)), :operation_id, N'submitted');
SELECT run_id, status, operation_id FROM @task;

-- cancel_run --
-- Cancel a run not yet finished (a fleet's execution not yet let in too); the token bump fences a worker still running it (the lease renewal finds it gone and stops the work).
DECLARE @cancelled TABLE (run_id BIGINT);
UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL, note = N'cancelled by operator'
OUTPUT inserted.run_id INTO @cancelled
WHERE run_id = :run_id AND status IN (N'pending', N'queued', N'running', N'waiting');
SELECT run_id FROM @cancelled;

-- list_jobs --
-- Every known job with its configuration state, the parameters it declares, next slot and latest run.
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at, j.after_job, j.after_outcome, j.calendars, j.jitter_seconds, j.params,
       j.max_duration_seconds, j.stop_after_seconds, j.slower_than, j.deadline_seconds, COALESCE(j.catchup_seconds, 0) AS catchup_seconds,
       CASE WHEN j.defined_in_database = 1 THEN N'database' ELSE N'settings' END AS source, j.needs_planning,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at, l.targets_total AS last_targets_total,
       l.targets_failed AS last_targets_failed
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p ON p.job_name = j.job_name
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.status, r.scheduled_for, r.finished_at, r.targets_total, r.targets_failed
    FROM agent.runs AS r
    WHERE r.job_name IS NOT NULL AND r.job_name = j.job_name AND r.status NOT IN (N'pending', N'queued')
    ORDER BY r.scheduled_for DESC, r.run_id DESC) AS l
ORDER BY j.job_name;

-- list_history --
-- Runs, newest first, optionally of one job.
SELECT TOP (:limit) run_id, job_name, kind, scheduled_for, status, attempt, failures, lapses, max_attempts, token,
       created_at, started_at, finished_at, worker, last_error_number, last_error, note, operation_id,
       step, failed_step, parent_run_id, target_server, target_database, targets_total, targets_failed, followed_run_id,
       params
FROM agent.runs
WHERE (CAST(:job_name AS NVARCHAR(64)) IS NULL OR job_name = CAST(:job_name AS NVARCHAR(64)))
ORDER BY run_id DESC
OPTION (RECOMPILE);

-- list_attempts --
-- Attempts of the runs in a JSON array of run ids.
SELECT a.run_id, a.attempt, a.token, a.worker, a.dequeue_count, a.started_at, a.finished_at,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.step, a.target_database
FROM agent.attempts AS a
WHERE a.run_id IN (SELECT CAST(x.value AS BIGINT) FROM OPENJSON(:run_ids) AS x)
ORDER BY a.run_id, a.attempt_id;

-- list_job_events --
-- Job events (invalid configuration, clock recovery, ...), newest first, optionally of one job.
SELECT TOP (:limit) event_id, job_name, event_at, kind, detail FROM agent.job_events
WHERE (CAST(:job_name AS NVARCHAR(64)) IS NULL OR job_name = CAST(:job_name AS NVARCHAR(64)))
ORDER BY event_id DESC
OPTION (RECOMPILE);

-- insert_audit --
-- One row of the audit trail (shared/engine/audit.py), in the operator action's own transaction, or alone after it was refused: the principal is :principal when the front end signed its user in (the monitor), else the connection's login (ORIGINAL_LOGIN(): the Entra or SQL principal), else :fallback_principal; :client says from where. The time is the agent's clock (the database's).
DECLARE @audited TABLE (audit_id BIGINT);
INSERT INTO agent.audit (acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail)
OUTPUT inserted.audit_id INTO @audited
VALUES (CAST(:now AS DATETIME2(6)),
        LEFT(COALESCE(CAST(:principal AS NVARCHAR(256)), ORIGINAL_LOGIN(), CAST(:fallback_principal AS NVARCHAR(256))), 256),
        LEFT(CAST(:client AS NVARCHAR(4000)), 400), CAST(:source AS NVARCHAR(16)), CAST(:action AS NVARCHAR(32)),
        LEFT(CAST(:job_name AS NVARCHAR(4000)), 200), CAST(:run_id AS BIGINT), CAST(:arguments AS NVARCHAR(MAX)),
        CAST(:audit_outcome AS NVARCHAR(8)), LEFT(CAST(:detail AS NVARCHAR(4000)), 2000));
SELECT audit_id FROM @audited;

-- audit_row_committed --
-- An operator action whose connection was lost at its COMMIT (shared/engine/audit.py): whether its row 'done', written as the transaction's last statement, is there (the transaction committed) or not.
SELECT audit_id FROM agent.audit
WHERE audit_id = CAST(:audit_id AS BIGINT) AND action = CAST(:action AS NVARCHAR(32)) AND outcome = N'done'
  AND acted_at = CAST(:now AS DATETIME2(6));

-- list_audit --
-- sql-agent audit and the monitor's audit page: the audit trail, newest first, optionally of one job and from a time on.
SELECT TOP (CAST(:limit AS INT)) audit_id, acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail
FROM agent.audit
WHERE (CAST(:job_name AS NVARCHAR(200)) IS NULL OR job_name = CAST(:job_name AS NVARCHAR(200)))
  AND (CAST(:since AS DATETIME2(6)) IS NULL OR acted_at >= CAST(:since AS DATETIME2(6)))
ORDER BY audit_id DESC
OPTION (RECOMPILE);

-- count_runs_by_status --
-- Runs per status (the doctor and the tests' reconciliation).
SELECT status, COUNT(*) AS runs FROM agent.runs GROUP BY status;

-- delete_run --
-- Remove a run and its attempts (the doctor's scratch run only).
DELETE FROM agent.attempts WHERE run_id = :run_id;
DELETE FROM agent.runs WHERE run_id = :run_id;

-- purge_history --
-- Retention, a bounded batch per tick: finished runs (with their attempts) and job events older than AGENT_HISTORY_RETENTION_DAYS — the latest run of each job, and a run with a poison message not yet requeued, always stay — and poison messages older than AGENT_POISON_RETENTION_DAYS; the audit trail is kept as long as the history. The runs are locked first (UPDLOCK), then their attempts and they go.
DECLARE @old TABLE (run_id BIGINT PRIMARY KEY);
INSERT INTO @old (run_id)
SELECT TOP (CAST(:batch AS INT)) r.run_id FROM agent.runs AS r WITH (UPDLOCK, READPAST, ROWLOCK)
WHERE r.finished_at < CAST(:history_before AS DATETIME2(6))
  AND r.status IN (N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled')
  AND (r.job_name IS NULL OR EXISTS (
        SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.scheduled_for > r.scheduled_for))
  AND NOT EXISTS (SELECT 1 FROM agent.poison_messages AS p WHERE p.run_id = r.run_id AND p.requeued_at IS NULL)
ORDER BY r.finished_at;
DELETE a FROM agent.attempts AS a JOIN @old AS o ON a.run_id = o.run_id;
DELETE r FROM agent.runs AS r JOIN @old AS o ON r.run_id = o.run_id;
DECLARE @events INT;
DELETE FROM agent.job_events WHERE event_id IN (
    SELECT TOP (CAST(:batch AS INT)) event_id FROM agent.job_events
    WHERE event_at < CAST(:history_before AS DATETIME2(6)) ORDER BY event_id);
SET @events = @@ROWCOUNT;
DECLARE @poison INT;
DELETE FROM agent.poison_messages WHERE poison_id IN (
    SELECT TOP (CAST(:batch AS INT)) poison_id FROM agent.poison_messages
    WHERE poisoned_at < CAST(:poison_before AS DATETIME2(6)) ORDER BY poison_id);
SET @poison = @@ROWCOUNT;
DECLARE @audit INT;
DELETE FROM agent.audit WHERE audit_id IN (
    SELECT TOP (CAST(:batch AS INT)) audit_id FROM agent.audit
    WHERE acted_at < CAST(:history_before AS DATETIME2(6)) ORDER BY audit_id);
SET @audit = @@ROWCOUNT;
SELECT N'runs' AS purged, COUNT(*) AS rows_purged FROM @old
UNION ALL SELECT N'job_events', @events
UNION ALL SELECT N'poison_messages', @poison
UNION ALL SELECT N'audit', @audit;

-- identity_rights --
-- The doctor's view of what the agent's database user reaches beyond the agent's rights (docs/deploying.md, "What the agent's identity can do"): sysadmin, db_owner, db_securityadmin, db_accessadmin, or NULL (STUFF of an empty string is NULL).
SELECT CAST(USER_NAME() AS NVARCHAR(128)) AS login_name,
       STUFF(CONCAT(CASE WHEN IS_SRVROLEMEMBER(N'sysadmin') = 1 THEN N', sysadmin' END,
                    CASE WHEN IS_ROLEMEMBER(N'db_owner') = 1 THEN N', db_owner' END,
                    CASE WHEN IS_ROLEMEMBER(N'db_securityadmin') = 1 THEN N', db_securityadmin' END,
                    CASE WHEN IS_ROLEMEMBER(N'db_accessadmin') = 1 THEN N', db_accessadmin' END), 1, 2, N'') AS reaches;

-- connection_limit --
-- The doctor's view of how many connections the server lets the agent hold (AGENT_MAX_CONNECTIONS x processes must fit): on Azure SQL Database the service objective and edition (the doctor maps them to the tier's documented worker limit: Basic 30, S0 60, GP_S_Gen5_1 75, ...; sys.dm_db_resource_stats shows how much of it is used), on SQL Server @@MAX_CONNECTIONS; the user sessions open now (only the caller's own without VIEW DATABASE STATE).
SELECT CAST(@@MAX_CONNECTIONS AS INT) AS max_connections,
       0 AS reserved_connections,
       -1 AS role_limit,
       -1 AS database_limit,
       (SELECT COUNT(*) FROM sys.dm_exec_sessions AS s WHERE s.is_user_process = 1) AS connections_now,
       CAST(SUSER_SNAME() AS NVARCHAR(128)) AS login_name,
       CAST(DATABASEPROPERTYEX(DB_NAME(), 'ServiceObjective') AS NVARCHAR(128)) AS service_objective,
       CAST(DATABASEPROPERTYEX(DB_NAME(), 'Edition') AS NVARCHAR(128)) AS edition;

-- doctor_session --
-- The doctor's view of the agent's session (lock timeout, isolation, XACT_ABORT, QUOTED_IDENTIFIER, ANSI_NULLS, NOCOUNT, the database's read committed snapshot) and of the triggers a DBA put on agent tables (INSTEAD OF triggers replace the agent's fenced writes: refused).
SELECT CAST(@@LOCK_TIMEOUT AS NVARCHAR(20)) + N' ms' AS lock_timeout,
       (SELECT CASE s.transaction_isolation_level WHEN 1 THEN N'read uncommitted' WHEN 2 THEN N'read committed'
                    WHEN 3 THEN N'repeatable read' WHEN 4 THEN N'serializable' WHEN 5 THEN N'snapshot'
                    ELSE N'unspecified' END
        FROM sys.dm_exec_sessions AS s WHERE s.session_id = @@SPID)
       + CASE WHEN (SELECT d.is_read_committed_snapshot_on FROM sys.databases AS d WHERE d.database_id = DB_ID()) = 1
              THEN N' (read committed snapshot on)' ELSE N'' END AS isolation,
       CONCAT(N'XACT_ABORT ', CASE WHEN (@@OPTIONS & 16384) <> 0 THEN N'ON' ELSE N'OFF' END,
              N', NOCOUNT ', CASE WHEN (@@OPTIONS & 512) <> 0 THEN N'ON' ELSE N'OFF' END,
              N', QUOTED_IDENTIFIER ', CASE WHEN SESSIONPROPERTY(N'QUOTED_IDENTIFIER') = 1 THEN N'ON' ELSE N'OFF' END,
              N', ANSI_NULLS ', CASE WHEN SESSIONPROPERTY(N'ANSI_NULLS') = 1 THEN N'ON' ELSE N'OFF' END) AS session_options,
       (SELECT STRING_AGG(CAST(t.name + N' on ' + o.name + N' ('
                               + CASE WHEN t.is_instead_of_trigger = 1 THEN N'instead of' ELSE N'after' END + N')' AS NVARCHAR(MAX)), N', ')
        FROM sys.triggers AS t JOIN sys.tables AS o ON o.object_id = t.parent_id
        WHERE o.schema_id = SCHEMA_ID(N'agent')) AS triggers,
       (SELECT COUNT(*) FROM sys.triggers AS t JOIN sys.tables AS o ON o.object_id = t.parent_id
        WHERE o.schema_id = SCHEMA_ID(N'agent') AND t.is_instead_of_trigger = 1) AS instead_of_triggers;

-- list_job_activity --
-- The monitor's status now: each job's unfinished runs grouped by status and by whether they are retries (a few rows per job, never one per run), optionally of one job.
SELECT job_name, status, CASE WHEN attempt > 0 THEN 1 ELSE 0 END AS retry, COUNT(*) AS runs,
       MIN(scheduled_for) AS first_scheduled_for, MIN(started_at) AS first_started_at,
       MIN(runnable_at) AS first_runnable_at, MAX(runnable_at) AS last_runnable_at, MIN(worker) AS worker
FROM agent.runs
WHERE status IN (N'pending', N'queued', N'running') AND job_name IS NOT NULL
  AND (CAST(:job_name AS NVARCHAR(64)) IS NULL OR job_name = CAST(:job_name AS NVARCHAR(64)))
GROUP BY job_name, status, CASE WHEN attempt > 0 THEN 1 ELSE 0 END
ORDER BY job_name, status
OPTION (RECOMPILE);

-- list_job_timeline --
-- The monitor's timeline: a job's runs whose slot is at or after :since, newest first, at most :limit (the unique (job_name, scheduled_for) index serves it).
SELECT TOP (:limit) run_id, kind, scheduled_for, status, attempt, max_attempts, started_at, finished_at, last_error, note
FROM agent.runs
WHERE job_name = CAST(:job_name AS NVARCHAR(64)) AND scheduled_for >= CAST(:since AS DATETIME2(6))
ORDER BY scheduled_for DESC, run_id DESC;

-- list_run_poison --
-- The poison messages of one run, newest first.
SELECT TOP (:limit) poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages WHERE run_id = :run_id ORDER BY poison_id DESC;

-- list_stuck_runs_page --
-- Reconciliation (the stuck command and page): runs in flight past their lease, or runnable but not started for longer than the given age; at most :limit runs.
SELECT TOP (:limit) run_id, job_name, kind, status, scheduled_for, runnable_at, lease_expires_at, token, attempt
FROM agent.runs
WHERE (status IN (N'queued', N'running') AND lease_expires_at < CAST(:now AS DATETIME2(6)))
   OR (status = N'pending' AND runnable_at < CAST(:stale_before AS DATETIME2(6)))
ORDER BY run_id;

-- get_job --
-- One job as list_jobs shows it (the monitor's job page: one index lookup, not every job).
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at, j.after_job, j.after_outcome, j.calendars, j.jitter_seconds, j.params,
       j.max_duration_seconds, j.stop_after_seconds, j.slower_than, j.deadline_seconds, COALESCE(j.catchup_seconds, 0) AS catchup_seconds,
       CASE WHEN j.defined_in_database = 1 THEN N'database' ELSE N'settings' END AS source,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at, l.targets_total AS last_targets_total,
       l.targets_failed AS last_targets_failed
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p ON p.job_name = j.job_name
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.status, r.scheduled_for, r.finished_at, r.targets_total, r.targets_failed
    FROM agent.runs AS r
    WHERE r.job_name IS NOT NULL AND r.job_name = j.job_name AND r.status NOT IN (N'pending', N'queued')
    ORDER BY r.scheduled_for DESC, r.run_id DESC) AS l
WHERE j.job_name = CAST(:job_name AS NVARCHAR(64));

-- lock_job_definitions --
-- The job-definitions lock for the rest of the transaction: the settings sync and the T-SQL interface's procedures (agent.add_scheduled_job, ...) decide job names one at a time. A table is read first: an owner 'Transaction' applock needs an open transaction, and EXEC opens none.
DECLARE @definitions_read INT;
SELECT @definitions_read = COUNT(*) FROM agent.start_lock;
DECLARE @lock_result INT;
EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
IF @lock_result < 0 THROW 50001, N'the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
SELECT @lock_result AS locked;

-- list_database_job_names --
-- Jobs defined in the database (agent.add_scheduled_job) and not removed, with the job each follows (@after): a settings job of the same name is refused, and one whose AFTER would close a cycle through them.
SELECT job_name, after_job FROM agent.jobs WHERE defined_in_database = 1 AND configured = 1 ORDER BY job_name;

-- list_database_fleet_jobs --
-- The valid jobs defined from T-SQL with fleet targets (agent.add_scheduled_job @targets), their one fleet step as planned: for doctor and grant-sql --targets.
SELECT job_name, steps FROM agent.jobs
WHERE defined_in_database = 1 AND configured = 1 AND valid = 1 AND needs_planning = 0 AND steps IS NOT NULL
ORDER BY job_name;

-- select_unplanned_jobs --
-- Jobs defined or changed in the database that wait for the engine to check their schedule (and fleet targets) and plan their first slot (the jobs_needs_planning index).
SELECT job_name, schedule, timezone, enabled, updated_at, command, max_attempts, timeout_seconds,
       requested_targets, requested_target_parallelism, requested_target_stagger_seconds, requested_exclude, requested_only, requested_on_excluded,
       replan_runs, calendars,
       target_database, requested_steps
FROM agent.jobs WHERE needs_planning = 1 ORDER BY job_name;

-- list_calendars --
-- The calendars defined from T-SQL (agent.add_calendar): read when a planned database job names one.
SELECT name, dates, weekly FROM agent.calendars ORDER BY name;

-- plan_jobs --
-- Record every verdict and first slot of the planned jobs (a JSON array of {job_name, schedule, timezone, enabled, updated_at, valid, config_error, next_due_at, steps}; steps: a fleet job's one step, as the settings sync writes it) in one statement, fenced on the definition that was planned: a job redefined meanwhile waits for the next planning.
-- UPDATE ... FROM a derived table joined in the WHERE clause (Babelfish refuses an UPDATE ... OUTPUT whose SET reads a table joined with JOIN ... ON); the fence is the condition on needs_planning and the definition, checked on the current committed version of each row (update locks on SQL Server, a re-check on PostgreSQL).
DECLARE @planned TABLE (job_name NVARCHAR(64), valid SMALLINT, config_error NVARCHAR(MAX), next_due_at DATETIME2(6));
UPDATE j SET needs_planning = 0, replan_runs = 0, valid = p.valid, config_error = p.config_error,
    next_due_at = p.next_due_at, advanced_at = CAST(:now AS DATETIME2(6)), steps = p.steps,
    calendars = p.calendars
OUTPUT inserted.job_name, inserted.valid, inserted.config_error, inserted.next_due_at INTO @planned
FROM agent.jobs AS j,
     (SELECT x.job_name, agent.json_text(x.schedule) AS schedule, x.timezone, x.enabled,
             CONVERT(DATETIME2(6), x.updated_at, 121) AS updated_at, x.valid,
             agent.json_text(x.config_error) AS config_error, CONVERT(DATETIME2(6), x.next_due_at, 121) AS next_due_at,
             agent.json_text(x.steps) AS steps, agent.json_text(x.calendars) AS calendars
      FROM OPENJSON(:plans) WITH (job_name NVARCHAR(64), schedule NVARCHAR(400), timezone NVARCHAR(64),
                                  enabled SMALLINT, updated_at NVARCHAR(40), valid SMALLINT,
                                  config_error NVARCHAR(MAX), next_due_at NVARCHAR(40), steps NVARCHAR(MAX),
                                  calendars NVARCHAR(MAX)) AS x) AS p
WHERE j.job_name = p.job_name AND j.needs_planning = 1 AND j.updated_at = p.updated_at
  AND j.schedule = p.schedule AND j.timezone = p.timezone AND j.enabled = p.enabled;
SELECT job_name, valid, config_error, next_due_at FROM @planned;

-- skip_replanned_runs --
-- A database job planned again after its calendars or jitter changed (agent.set_job_calendars set replan_runs, or the calendars the planning resolved differ from those in force: a calendar redefined or removed): its never-started scheduled runs keyed from its new first slot on (:jobs, a JSON array of {job_name, since, open_only}), and the slots ahead a pause recorded skipped, are recorded skipped (open_only: a job with no next slot left, a one-time job or a schedule past its `until`, whose runs not yet due alone are decided again: a slot a pause holds stays held); the claim that follows plans them again under the new rules (a run keyed as before is taken back in place, claim_slots). A run keyed before that slot stands for an earlier slot and is left as it is.
DECLARE @replanned TABLE (run_id BIGINT, job_name NVARCHAR(64), scheduled_for DATETIME2(6));
UPDATE r SET status = N'skipped', finished_at = CAST(:now AS DATETIME2(6)), lease_expires_at = NULL,
    note = CASE WHEN r.note LIKE N'%; moved from %' THEN N'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here' ELSE N'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after this slot was claimed' END
OUTPUT inserted.run_id, inserted.job_name, inserted.scheduled_for INTO @replanned
FROM agent.runs AS r,
     (SELECT x.job_name, CONVERT(DATETIME2(6), x.since, 121) AS since, x.open_only
      FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64), since NVARCHAR(40), open_only INT) AS x) AS d
WHERE r.job_name = d.job_name AND r.kind = N'scheduled' AND r.attempt = 0
  AND (r.status IN (N'pending', N'queued') OR (r.status = N'skipped' AND r.note = N'paused' AND d.open_only IS NULL))
  AND (r.scheduled_for >= d.since
       -- A run a calendar moved, not yet due, keyed before that slot: decided again from now.
       OR (r.status IN (N'pending', N'queued') AND r.scheduled_for >= CAST(:now AS DATETIME2(6))
           AND r.note LIKE N'%; moved from %'));
SELECT run_id, job_name, scheduled_for FROM @replanned;

-- settle_replanned_jobs --
-- The database jobs planned again after their calendars or jitter changed (:jobs, a JSON array of {job_name, open_only}; plan_jobs set next_due_at to the job's first slot, NULL when none), after skip_replanned_runs. open_only (a job with no next slot left: a one-time job, a schedule past its `until`): one whose run not yet due it just recorded skipped (one a calendar moved) is decided again from its slot, or from now when that has passed or there is none (the run was waiting for the time its calendars allowed, not missed); one whose slot has a run standing for it (ran, runs, waits, backfilled, held by a pause, skipped for good; not one a redefinition recorded skipped, nor the slot a calendar moved) keeps no slot (next_due_at NULL, as its claim left it): it never runs twice, and a slot skipped for good is not brought back; one never claimed keeps its slot. The others: one whose run a calendar moved, keyed before its first slot, was just recorded skipped is decided again from now (the earlier slot's moved run, under the new calendars).
UPDATE j SET next_due_at = CASE
        WHEN d.open_only = 1
         AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = j.job_name AND o.status = N'skipped'
                       AND o.finished_at = CAST(:now AS DATETIME2(6)) AND o.note IN (N'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after this slot was claimed', N'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here'))
        THEN CASE WHEN j.next_due_at > CAST(:now AS DATETIME2(6)) THEN j.next_due_at ELSE CAST(:now AS DATETIME2(6)) END
        WHEN d.open_only = 1 AND j.next_due_at IS NOT NULL
         AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = j.job_name AND o.scheduled_for >= j.next_due_at
                       AND NOT (o.status = N'skipped' AND (o.note LIKE N'skipped: the job%' OR o.note LIKE N'calendar:%; moved to %')))
        THEN NULL
        WHEN d.open_only IS NULL AND j.next_due_at IS NOT NULL
         AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = j.job_name AND o.status = N'skipped'
                       AND o.finished_at = CAST(:now AS DATETIME2(6))
                       AND o.note = N'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here')
        THEN CASE WHEN j.next_due_at < CAST(:now AS DATETIME2(6)) THEN j.next_due_at ELSE CAST(:now AS DATETIME2(6)) END
        ELSE j.next_due_at END
FROM agent.jobs AS j,
     (SELECT x.job_name, x.open_only FROM OPENJSON(:jobs) WITH (job_name NVARCHAR(64), open_only INT) AS x) AS d
WHERE j.job_name = d.job_name;

-- stop_job --
-- stop JOB (SQL Agent's sp_stop_job): cancel the job's runs in flight (running, due, queued due, or waiting for a retry), never its future slots; the token bump fences a worker still running one (its lease renewal finds it gone and stops the work).
DECLARE @stopped TABLE (run_id BIGINT, status NVARCHAR(16));
UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL, note = N'stopped by operator (stop JOB)'
OUTPUT inserted.run_id, inserted.status INTO @stopped
WHERE job_name = :job_name AND status IN (N'pending', N'queued', N'running')
  AND (status = N'running' OR runnable_at <= CAST(:now AS DATETIME2(6)) OR attempt > 0);
SELECT run_id, status FROM @stopped;

-- begin_step_attempt --
-- A run of a multi-step job started: its open attempt says which step it runs and where.
UPDATE agent.attempts SET step = :step, target_database = :target_database
WHERE run_id = :run_id AND token = :token AND attempt = :attempt AND outcome = N'running';

-- step_transition --
-- A step of a multi-step run ended (fenced by the token; in the step's own transaction when it works in the control database, so the step's work and its transition commit together): the attempt closes with its outcome and output, and the run follows the flow: on to :next_step at once (status running, same worker and token, a new attempt opened), the same step again at :runnable_at (pending: a retry), or the end (succeeded or failed, with the failing step). No row back: the lease was taken over; roll back.
DECLARE @moved TABLE (run_id BIGINT, token BIGINT, status NVARCHAR(16), step INT, attempt INT, failures INT,
                      dequeue_count INT);
UPDATE agent.runs SET
    status = CAST(:run_status AS NVARCHAR(16)),
    step = CAST(:next_step AS INT),
    failures = CAST(:failures AS INT),
    attempt = CASE WHEN CAST(:run_status AS NVARCHAR(16)) = N'running' THEN attempt + 1 ELSE attempt END,
    runnable_at = CAST(:runnable_at AS DATETIME2(6)),
    heartbeat_at = CASE WHEN CAST(:run_status AS NVARCHAR(16)) = N'running' THEN CAST(:now AS DATETIME2(6))
                        ELSE heartbeat_at END,
    lease_expires_at = CASE WHEN CAST(:run_status AS NVARCHAR(16)) = N'running'
                            THEN CAST(:lease_until AS DATETIME2(6)) END,
    finished_at = CASE WHEN CAST(:run_status AS NVARCHAR(16)) IN (N'succeeded', N'failed')
                       THEN CAST(:now AS DATETIME2(6)) END,
    failed_step = COALESCE(CAST(:failed_step AS INT), failed_step,
                           CASE WHEN CAST(:run_status AS NVARCHAR(16)) = N'failed' THEN CAST(:step AS INT) END),
    last_error_number = :error_number,
    last_error = :error_message
OUTPUT inserted.run_id, inserted.token, inserted.status, inserted.step, inserted.attempt, inserted.failures,
       inserted.dequeue_count INTO @moved
WHERE run_id = :run_id AND token = :token AND status = N'running';
UPDATE a SET outcome = :outcome, finished_at = CAST(:now AS DATETIME2(6)), step = CAST(:step AS INT),
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message,
    [output] = :step_output
FROM agent.attempts AS a
JOIN @moved AS m ON a.run_id = m.run_id AND a.token = m.token
WHERE a.attempt = CAST(:attempt AS INT) AND a.outcome = N'running';
INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome, step, target_database)
SELECT m.run_id, m.attempt, m.token, CAST(:worker AS NVARCHAR(200)), m.dequeue_count, CAST(:now AS DATETIME2(6)),
       N'running', m.step, CAST(:next_database AS NVARCHAR(128))
FROM @moved AS m WHERE m.status = N'running';
SELECT run_id, status, step, attempt, failures FROM @moved;

-- record_attempt_output --
-- Keep what the server said while an attempt ran (messages, rows affected), in the transaction that closes it.
UPDATE agent.attempts SET [output] = :step_output
WHERE run_id = :run_id AND token = :token AND attempt = :attempt;

-- list_attempt_output --
-- The output of the attempts of the runs in a JSON array of run ids (history --output, --json).
SELECT a.run_id, a.attempt, a.[output]
FROM agent.attempts AS a
WHERE a.run_id IN (SELECT CAST(x.[value] AS BIGINT) FROM OPENJSON(:run_ids) AS x) AND a.[output] IS NOT NULL
ORDER BY a.run_id, a.attempt_id;

-- enqueue_notifications --
-- The notification outbox, in the transaction that ends runs: one row for each run it ended (finished at :now) whose outcome its job's NOTIFY asks for and that has a webhook (the job's, else :default_url); a run already notified is left alone (the key-range lock of the probe keeps a concurrent enqueue out).
INSERT INTO agent.notifications (run_id, job_name, outcome, url, status, attempts, created_at, next_attempt_at)
SELECT r.run_id, r.job_name, r.status, COALESCE(j.notify_webhook_url, CAST(:default_url AS NVARCHAR(2000))),
       N'pending', 0, CAST(:now AS DATETIME2(6)), CAST(:now AS DATETIME2(6))
FROM agent.runs AS r
JOIN agent.jobs AS j ON j.job_name = r.job_name
WHERE r.finished_at = CAST(:now AS DATETIME2(6)) AND r.status IN (N'succeeded', N'failed', N'poisoned')
  AND COALESCE(j.notify_webhook_url, CAST(:default_url AS NVARCHAR(2000))) IS NOT NULL
  AND (COALESCE(j.notify, N'on_failure') = N'on_completion'
       OR (COALESCE(j.notify, N'on_failure') = N'on_success' AND r.status = N'succeeded')
       OR (COALESCE(j.notify, N'on_failure') = N'on_failure' AND r.status IN (N'failed', N'poisoned')))
  AND NOT EXISTS (SELECT 1 FROM agent.notifications AS n WITH (UPDLOCK, HOLDLOCK) WHERE n.run_id = r.run_id AND n.kind = N'outcome');

-- start_follow_up_runs --
-- In the transaction that ends runs (each finished at :now): a run of every job that follows the job of a run it ended, when the end is the follower's AFTER_OUTCOME; a follow-up of a job already in the ended run's chain of jobs, or past :max_chain_jobs jobs, is recorded skipped with the reason (note 'chain: ...') and a job event 'follow_up_refused'. (agent.start_follow_up_runs, a procedure of migration 0023: the statements of 0020's named query.)
EXEC agent.start_follow_up_runs :now, :max_chain_jobs;

-- claim_notifications --
-- Take up to :batch notifications due for delivery (new, a retry whose time came, or one whose sender died mid-way) under a new claim token, so that two processes never send the same one.
-- UPDATE ... WHERE key IN (SELECT TOP (n) ... ORDER BY ...): TOP with ORDER BY in a subselect is how SQL Server orders the rows an UPDATE takes ("TOP (Transact-SQL)", https://learn.microsoft.com/sql/t-sql/queries/top-transact-sql; Babelfish refuses an UPDATE through a CTE). On SQL Server the (UPDLOCK, READPAST, ROWLOCK) of the subselect skips the rows another sender holds and keeps update locks on the ones it picks to the end of the transaction (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table), so two senders take disjoint rows. The outer WHERE repeats the due condition: Babelfish ignores the hints and two senders may pick the same row, but PostgreSQL re-checks that condition on the row the first one committed (claimed_until in the future), so the second takes nothing.
DECLARE @taken TABLE (notification_id BIGINT, run_id BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16), outcome NVARCHAR(16),
                      detail NVARCHAR(MAX),
                      url NVARCHAR(2000), attempts INT, claim_token NVARCHAR(32));
UPDATE agent.notifications SET status = N'sending', claim_token = CAST(:claim_token AS NVARCHAR(32)),
    claimed_until = CAST(:claimed_until AS DATETIME2(6)), attempts = attempts + 1
OUTPUT inserted.notification_id, inserted.run_id, inserted.job_name, inserted.kind, inserted.outcome, inserted.detail, inserted.url,
       inserted.attempts, inserted.claim_token INTO @taken
WHERE ((status = N'pending' AND next_attempt_at <= CAST(:now AS DATETIME2(6)))
       OR (status = N'sending' AND claimed_until < CAST(:now AS DATETIME2(6))))
  AND notification_id IN (
    SELECT TOP (CAST(:batch AS INT)) p.notification_id
    FROM agent.notifications AS p WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE (p.status = N'pending' AND p.next_attempt_at <= CAST(:now AS DATETIME2(6)))
       OR (p.status = N'sending' AND p.claimed_until < CAST(:now AS DATETIME2(6)))
    ORDER BY p.notification_id);
SELECT notification_id, run_id, job_name, kind, outcome, detail, url, attempts, claim_token FROM @taken;

-- notification_runs --
-- What a notification says about its run (a JSON array of run ids): slot, outcome, failing step, error, when it first started and ended, operation id; and the latest failed attempt's error and step (a run its flow failed, quit_failure after a step that failed, keeps no error of its own).
SELECT r.run_id, r.job_name, r.scheduled_for, r.status, r.failed_step, r.last_error_number, r.last_error,
       r.finished_at, r.operation_id, r.followed_run_id,
       (SELECT MIN(a.started_at) FROM agent.attempts AS a WHERE a.run_id = r.run_id) AS first_started_at,
       (SELECT TOP (1) a.error_message FROM agent.attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC) AS attempt_error,
       (SELECT TOP (1) a.error_number FROM agent.attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC) AS attempt_error_number,
       (SELECT TOP (1) a.step FROM agent.attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC) AS attempt_step
FROM agent.runs AS r
WHERE r.run_id IN (SELECT CAST(x.[value] AS BIGINT) FROM OPENJSON(:run_ids) AS x);

-- finish_notification --
-- Record one delivery attempt of a claimed notification (sent, to be retried at :next_attempt_at, or failed for good), only while the claim is still this sender's.
DECLARE @recorded TABLE (notification_id BIGINT);
UPDATE agent.notifications SET status = CAST(:status AS NVARCHAR(16)),
    next_attempt_at = CAST(:next_attempt_at AS DATETIME2(6)),
    sent_at = CASE WHEN CAST(:status AS NVARCHAR(16)) = N'sent' THEN CAST(:now AS DATETIME2(6)) END,
    last_error = :last_error, claim_token = NULL, claimed_until = NULL
OUTPUT inserted.notification_id INTO @recorded
WHERE notification_id = :notification_id AND claim_token = :claim_token;
SELECT notification_id FROM @recorded;

-- check_work_transaction --
-- Before the success of a job or step that worked in the agent's own transaction is recorded there: a transaction the SQL committed, rolled back or doomed is never recorded as a success (XACT_STATE decides; :work_transaction is PostgreSQL's). (agent.check_work_transaction, a procedure of migration 0023.)
EXEC agent.check_work_transaction :work_transaction;

-- purge_notifications --
-- Retention, a bounded batch per tick (with purge_history): notifications delivered or given up older than AGENT_HISTORY_RETENTION_DAYS; one row back with the count.
DECLARE @notifications INT;
DELETE FROM agent.notifications WHERE notification_id IN (
    SELECT TOP (CAST(:batch AS INT)) notification_id FROM agent.notifications
    WHERE status IN (N'sent', N'failed', N'unsent') AND next_attempt_at < CAST(:history_before AS DATETIME2(6))
    ORDER BY notification_id);
SET @notifications = @@ROWCOUNT;
SELECT N'notifications' AS purged, @notifications AS rows_purged;
DECLARE @firings INT;
DELETE FROM agent.alert_firings WHERE firing_id IN (
    SELECT TOP (CAST(:batch AS INT)) firing_id FROM agent.alert_firings
    WHERE raised_at < CAST(:history_before AS DATETIME2(6)) ORDER BY firing_id);
SET @firings = @@ROWCOUNT;
SELECT N'alert firings' AS purged, @firings AS rows_purged;

-- list_server_databases --
-- Fleet targets, run in the server's master: its databases, for server: members and db: globs (the system databases are left out by the caller; resolved at every run).
SELECT name FROM sys.databases ORDER BY name;

-- list_pool_databases --
-- Fleet targets, run in the server's master: the databases of an elastic pool (resolved at every run). SQL Server outside Azure has no pools (nor this view): one clear error instead of "invalid object name".
DECLARE @pools_view INT = OBJECT_ID(N'sys.database_service_objectives');
IF @pools_view IS NULL THROW 51400, N'pool: members need Azure SQL Database: this server has no elastic pools (no sys.database_service_objectives)', 1;
SELECT d.name
FROM sys.databases AS d
JOIN sys.database_service_objectives AS o ON o.database_id = d.database_id
WHERE o.elastic_pool_name = CAST(:pool AS NVARCHAR(128))
ORDER BY d.name;

-- fan_out_targets --
-- A run reached a fleet step (fenced by its token): it waits for its targets (no lease, no worker slot) and one execution per target database is created in one statement (a JSON array of {n, target_server, target_database}, n from 1), the first :parallelism let in, the others waiting for the window; execution n runnable from :now + (n - 1) * :stagger_seconds (TARGET_STAGGER_SECONDS), which the window keeps when it lets a waiting one in. No row back: the lease was taken over; roll back.
DECLARE @fanned TABLE (run_id BIGINT, token BIGINT, operation_id NVARCHAR(32), lease_seconds INT);
UPDATE agent.runs SET awaiting_targets = 1, lease_expires_at = NULL, heartbeat_at = CAST(:now AS DATETIME2(6)),
    target_parallelism = CAST(:parallelism AS INT),
    next_step_on_success = CAST(:next_on_success AS INT), next_step_on_failure = CAST(:next_on_failure AS INT),
    targets_total = COALESCE(targets_total, 0) + CAST(:target_count AS INT), targets_failed = COALESCE(targets_failed, 0)
OUTPUT inserted.run_id, inserted.token, inserted.operation_id, inserted.lease_seconds INTO @fanned
WHERE run_id = :run_id AND token = :token AND status = N'running';
DECLARE @created TABLE (run_id BIGINT);
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, target_server, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at, operation_id, note,
                        parent_run_id, parent_token, retry_interval_seconds, step, params)
OUTPUT inserted.run_id INTO @created
SELECT NULL, N'target', CAST(:now AS DATETIME2(6)),
       CASE WHEN t.n <= CAST(:parallelism AS INT) THEN N'pending' ELSE N'waiting' END,
       CAST(:command AS NVARCHAR(MAX)), t.target_database, t.target_server, N'allow', CAST(:max_attempts AS INT),
       CAST(:timeout_seconds AS INT), p.lease_seconds,
       DATEADD(second, (t.n - 1) * CAST(:stagger_seconds AS INT), CAST(:now AS DATETIME2(6))), CAST(:now AS DATETIME2(6)),
       p.operation_id, CONCAT(N'target of run ', p.run_id, N', step ', CAST(:step AS INT)), p.run_id, p.token,
       CAST(:retry_interval_seconds AS INT), CAST(:step AS INT), CAST(:params AS NVARCHAR(MAX))
FROM @fanned AS p
CROSS JOIN OPENJSON(:targets) WITH (n INT, target_server NVARCHAR(256), target_database NVARCHAR(128)) AS t;
SELECT p.run_id, (SELECT COUNT(*) FROM @created) AS created FROM @fanned AS p;

-- progress_fleets --
-- After an execution ended (:parent_run_id its run, :run_id at :token the execution, in the transaction that ends it) or at every tick (all NULL: every run waiting for its targets). The next waiting execution takes the ended one's place (READPAST: no wait on the run's other executions, no lock on the run); only when none was waiting (@tail), and at ticks: cancel the executions of runs that no longer wait for them, let waiting executions in up to TARGET_PARALLELISM (each keeping its staggered start), and move on each run whose executions all ended (its next step runnable now, or its end). The waiting runs' rows are locked first (UPDLOCK, HOLDLOCK), so two executions ending at once are counted one after the other: each later statement reads what the other committed.
DECLARE @parent BIGINT = CAST(:parent_run_id AS BIGINT);
DECLARE @now DATETIME2(6) = CAST(:now AS DATETIME2(6));
DECLARE @swapped TABLE (run_id BIGINT);
UPDATE w SET status = N'pending', runnable_at = CASE WHEN w.runnable_at > @now THEN w.runnable_at ELSE @now END
OUTPUT inserted.run_id INTO @swapped
FROM agent.runs AS w
WHERE w.run_id = (
    SELECT TOP (1) x.run_id
    FROM agent.runs AS e
    JOIN agent.runs AS p ON p.run_id = e.parent_run_id AND p.token = e.parent_token
                        AND p.awaiting_targets = 1 AND p.status = N'running'
    JOIN agent.runs AS x WITH (UPDLOCK, READPAST, ROWLOCK)
        ON x.parent_run_id = e.parent_run_id AND x.parent_token = e.parent_token AND x.status = N'waiting'
    WHERE e.run_id = CAST(:run_id AS BIGINT) AND e.token = CAST(:token AS BIGINT)
      AND e.status IN (N'succeeded', N'failed', N'poisoned')
    ORDER BY x.run_id)
  AND w.status = N'waiting';
DECLARE @tail BIT = CASE WHEN EXISTS (SELECT 1 FROM @swapped) THEN 0 ELSE 1 END;
-- Babelfish ignores the UPDLOCK, HOLDLOCK below: there two executions ending at once each saw
-- the other still open and neither moved the run on (it waited for the next tick). So the
-- tail takes the fleet-progress applock first, to the end of the transaction: on both engines
-- the second waits for the first's commit and its later statements (new snapshots) read it.
-- (Taken also when a waiting execution was let in instead, which then changes nothing more.)
-- Only this statement takes it, after its execution's own row changed, and a holder's
-- statements lock no execution that is still open (their conditions skip them), so none waits
-- for a waiter: no deadlock. An EXEC needs an open transaction: the execution's end opened it.
DECLARE @lock_result INT;
EXEC @lock_result = sp_getapplock @Resource = N'agent.progress_fleets', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
IF @lock_result < 0 THROW 50001, N'the fleet-progress lock (sp_getapplock agent.progress_fleets) was not granted within 30 s', 1;
DECLARE @locked TABLE (run_id BIGINT);
INSERT INTO @locked (run_id)
SELECT p.run_id FROM agent.runs AS p WITH (UPDLOCK, HOLDLOCK, ROWLOCK)
WHERE @tail = 1 AND p.awaiting_targets = 1 AND (@parent IS NULL OR p.run_id = @parent);
UPDATE c SET status = N'cancelled', token = c.token + 1, finished_at = @now, lease_expires_at = NULL,
    note = N'cancelled: its run no longer waits for its targets'
FROM agent.runs AS c
JOIN agent.runs AS p ON p.run_id = c.parent_run_id
WHERE @tail = 1 AND c.parent_run_id IS NOT NULL AND (@parent IS NULL OR p.run_id = @parent)
  AND c.status IN (N'waiting', N'pending', N'queued', N'running')
  AND (p.awaiting_targets = 0 OR p.status <> N'running' OR p.token <> c.parent_token);
UPDATE agent.runs SET awaiting_targets = 0
WHERE @tail = 1 AND awaiting_targets = 1 AND status <> N'running' AND (@parent IS NULL OR run_id = @parent);
UPDATE c SET status = N'pending', runnable_at = CASE WHEN c.runnable_at > @now THEN c.runnable_at ELSE @now END
FROM agent.runs AS c
JOIN (SELECT w.run_id
      FROM (SELECT p.run_id, p.token,
                   p.target_parallelism - (SELECT COUNT(*) FROM agent.runs AS f
                                           WHERE f.parent_run_id = p.run_id AND f.parent_token = p.token
                                             AND f.status IN (N'pending', N'queued', N'running')) AS free
            FROM agent.runs AS p
            WHERE @tail = 1 AND p.awaiting_targets = 1 AND p.status = N'running'
              AND (@parent IS NULL OR p.run_id = @parent)) AS q
      CROSS APPLY (SELECT TOP (CASE WHEN q.free > 0 THEN q.free ELSE 0 END) x.run_id
                   FROM agent.runs AS x
                   WHERE x.parent_run_id = q.run_id AND x.parent_token = q.token AND x.status = N'waiting'
                   ORDER BY x.run_id) AS w) AS let_in ON let_in.run_id = c.run_id
WHERE c.status = N'waiting';
DECLARE @verdicts TABLE (run_id BIGINT PRIMARY KEY, token BIGINT, at_step INT, total INT, failed INT, next_step INT,
                         summary NVARCHAR(MAX));
INSERT INTO @verdicts (run_id, token, at_step, total, failed, next_step, summary)
SELECT v.run_id, v.token, v.at_step, v.total, v.failed,
       CASE WHEN v.failed = 0 THEN v.on_success ELSE v.on_failure END,
       CASE WHEN v.failed = 0 THEN NULL ELSE
            CONCAT(N'step ', v.at_step, N': ', v.failed, N' of ', v.total, N' target(s) failed: ',
                   -- The first 20 failed targets in name order, numbered by ROW_NUMBER and put together by
                   -- position: ordered on every engine (the order of STRING_AGG needs WITHIN GROUP, which
                   -- Babelfish refuses, and is otherwise not guaranteed: "STRING_AGG (Transact-SQL)",
                   -- https://learn.microsoft.com/sql/t-sql/functions/string-agg-transact-sql).
                   (SELECT CONCAT(MAX(CASE WHEN n.i = 1 THEN n.name END), MAX(CASE WHEN n.i = 2 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 3 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 4 THEN N', ' + n.name END),
                                   MAX(CASE WHEN n.i = 5 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 6 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 7 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 8 THEN N', ' + n.name END),
                                   MAX(CASE WHEN n.i = 9 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 10 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 11 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 12 THEN N', ' + n.name END),
                                   MAX(CASE WHEN n.i = 13 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 14 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 15 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 16 THEN N', ' + n.name END),
                                   MAX(CASE WHEN n.i = 17 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 18 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 19 THEN N', ' + n.name END), MAX(CASE WHEN n.i = 20 THEN N', ' + n.name END))
                    FROM (SELECT m.name, ROW_NUMBER() OVER (ORDER BY m.name) AS i
                          FROM (SELECT TOP (20) CONCAT(f.target_server + N'/', f.target_database, N' (', f.status, N')') AS name
                                FROM agent.runs AS f
                                WHERE f.parent_run_id = v.run_id AND f.parent_token = v.token AND f.status <> N'succeeded'
                                ORDER BY f.target_server, f.target_database) AS m) AS n),
                   CASE WHEN v.failed > 20 THEN N', ...' ELSE N'' END) END
FROM (SELECT p.run_id, p.token, p.step AS at_step, p.next_step_on_success AS on_success,
             p.next_step_on_failure AS on_failure, COUNT(c.run_id) AS total,
             COALESCE(SUM(CASE WHEN c.status <> N'succeeded' THEN 1 ELSE 0 END), 0) AS failed,
             COALESCE(SUM(CASE WHEN c.status IN (N'waiting', N'pending', N'queued', N'running') THEN 1 ELSE 0 END), 0)
                 AS still_open
      FROM agent.runs AS p
      LEFT JOIN agent.runs AS c ON c.parent_run_id = p.run_id AND c.parent_token = p.token
      WHERE @tail = 1 AND p.awaiting_targets = 1 AND p.status = N'running' AND (@parent IS NULL OR p.run_id = @parent)
      GROUP BY p.run_id, p.token, p.step, p.next_step_on_success, p.next_step_on_failure) AS v
WHERE v.still_open = 0;
UPDATE a SET outcome = CASE WHEN v.failed = 0 THEN N'succeeded' ELSE N'failed' END,
    finished_at = @now, error_message = v.summary,
    [output] = CONCAT(v.total, N' target(s): ', v.total - v.failed, N' succeeded, ', v.failed, N' failed')
FROM agent.attempts AS a
JOIN @verdicts AS v ON a.run_id = v.run_id AND a.token = v.token
WHERE a.outcome = N'running';
DECLARE @moved TABLE (run_id BIGINT, job_name NVARCHAR(64), status NVARCHAR(16), step INT, targets_total INT,
                      targets_failed INT, last_error NVARCHAR(MAX), operation_id NVARCHAR(32));
UPDATE r SET
    awaiting_targets = 0,
    status = CASE WHEN v.next_step > 0 THEN N'pending' WHEN v.next_step = 0 THEN N'succeeded' ELSE N'failed' END,
    step = CASE WHEN v.next_step > 0 THEN v.next_step ELSE r.step END,
    failures = 0,
    runnable_at = @now,
    lease_expires_at = NULL,
    finished_at = CASE WHEN v.next_step > 0 THEN NULL ELSE @now END,
    failed_step = CASE WHEN v.failed > 0 THEN v.at_step ELSE r.failed_step END,
    targets_failed = COALESCE(r.targets_failed, 0) + v.failed,
    last_error = v.summary,
    last_error_number = NULL
OUTPUT inserted.run_id, inserted.job_name, inserted.status, inserted.step, inserted.targets_total,
       inserted.targets_failed, inserted.last_error, inserted.operation_id INTO @moved
FROM agent.runs AS r, @verdicts AS v
WHERE r.run_id = v.run_id AND r.token = v.token;
SELECT run_id, job_name, status, step, targets_total, targets_failed, last_error, operation_id FROM @moved;

-- list_run_targets --
-- Fleet runs: the executions (one per target database and visit of a fleet step) of the runs in a JSON array of run ids, in one query whatever the number of runs and targets (history, the job and run pages; the runs_parent index serves it).
SELECT e.parent_run_id, e.parent_token, e.run_id, e.step, e.target_server, e.target_database, e.status, e.attempt,
       e.max_attempts, e.started_at, e.finished_at, e.last_error_number, e.last_error
FROM agent.runs AS e
WHERE e.parent_run_id IN (SELECT CAST(x.value AS BIGINT) FROM OPENJSON(:run_ids) AS x)
ORDER BY e.parent_run_id, e.run_id;

-- lock_starts --
-- Queue mode, first in a chain that ends with the hand-on dispatch: the start lock before any row (a completion that locked its rows, then waited for the start lock, deadlocked with a start holding the start lock and waiting for one of those rows: a run's last executions lock the run itself). (agent.lock_starts, a procedure of migration 0023: the lock is held to the end of the caller's transaction.)
EXEC agent.lock_starts;

-- run_owner --
-- Whom a run's SQL runs as (migration 0007): a task's own owner (agent.exec_async), else its job's when a procedure defined the job (agent.add_scheduled_job; also its agent.start_job runs and fleet executions). No row: the agent's user, or AGENT_JOB_PRINCIPAL.
SELECT COALESCE(r.owner, j.owner) AS owner
FROM agent.runs r
LEFT JOIN agent.runs p ON p.run_id = r.parent_run_id
LEFT JOIN agent.jobs j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
WHERE r.run_id = :run_id;

-- session_identity --
-- The connection's session id and whether the server is Babelfish for PostgreSQL (asked once per connection, before its first job: Babelfish acts on a cancel only after the statement ended, so the agent stops a job there with KILL of this session).
SELECT @@SPID AS spid, CAST(SERVERPROPERTY('Babelfish') AS NVARCHAR(10)) AS babelfish, USER_NAME() AS user_name;

-- lock_job_pauses --
-- The pauses lock for the rest of the transaction (exclusive): `pause` and `resume`, as agent.pause_job and agent.resume_job do; a tick's claim holds it shared (select_due_jobs). A table is read first: an owner 'Transaction' applock needs an open transaction.
DECLARE @pauses_read INT;
SELECT @pauses_read = COUNT(*) FROM agent.start_lock;
DECLARE @lock_result INT;
EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
IF @lock_result < 0 THROW 50001, N'the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
SELECT @lock_result AS locked;

-- pause_job --
-- Pause a job the agent knows (no row: there is none): a pause in force keeps its start and takes the new end, paused_by and reason; one that ended is replaced. Update-then-insert under lock_job_pauses (no MERGE: Babelfish refuses it).
DECLARE @known INT = (SELECT COUNT(*) FROM agent.jobs WHERE job_name = CAST(:job_name AS NVARCHAR(64)) AND configured = 1);
UPDATE agent.job_pauses
SET paused_at = CASE WHEN paused_until IS NULL OR paused_until > CAST(:now AS DATETIME2(6)) THEN paused_at
                     ELSE CAST(:now AS DATETIME2(6)) END,
    paused_until = CAST(:paused_until AS DATETIME2(6)), paused_by = CAST(:paused_by AS NVARCHAR(256)),
    reason = CAST(:reason AS NVARCHAR(400))
WHERE job_name = CAST(:job_name AS NVARCHAR(64)) AND @known = 1;
INSERT INTO agent.job_pauses (job_name, paused_at, paused_until, paused_by, reason)
SELECT j.job_name, CAST(:now AS DATETIME2(6)), CAST(:paused_until AS DATETIME2(6)), CAST(:paused_by AS NVARCHAR(256)),
       CAST(:reason AS NVARCHAR(400))
FROM agent.jobs AS j
WHERE j.job_name = CAST(:job_name AS NVARCHAR(64)) AND j.configured = 1
  AND NOT EXISTS (SELECT 1 FROM agent.job_pauses AS x WHERE x.job_name = j.job_name);
SELECT x.job_name, x.paused_at, x.paused_until, x.paused_by, x.reason
FROM agent.job_pauses AS x WHERE x.job_name = CAST(:job_name AS NVARCHAR(64)) AND @known = 1;

-- settle_paused_runs --
-- After a pause changed (pause, a new --until, resume): decide again the job's scheduled slots that never started and that a pause decided or may decide, against the pause as it now stands, [:pause_start, :pause_end) (:pause_end NULL: until resumed; resume passes :now): held slots are recorded skipped 'paused', slots at or after its end run at their time (brought back if a pause had skipped them), and under run-once the last slot before a known end is the catch-up, runnable at the end. One row: how many runs it skipped, brought back, and made the catch-up. (agent.settle_paused_runs, a procedure of migration 0012, which agent.pause_job and agent.resume_job call too.) Under lock_job_pauses.
DECLARE @runs_skipped INT = 0;
DECLARE @runs_resumed INT = 0;
DECLARE @runs_caught_up INT = 0;
DECLARE @settle_start DATETIME2(6) = CAST(:pause_start AS DATETIME2(6));
DECLARE @settle_end DATETIME2(6) = CAST(:pause_end AS DATETIME2(6));
DECLARE @settle_now DATETIME2(6) = CAST(:now AS DATETIME2(6));
DECLARE @settle_job NVARCHAR(64) = CAST(:job_name AS NVARCHAR(64));
EXEC agent.settle_paused_runs @job_name = @settle_job, @now = @settle_now, @pause_start = @settle_start,
     @pause_end = @settle_end, @runs_skipped = @runs_skipped OUTPUT, @runs_resumed = @runs_resumed OUTPUT,
     @runs_caught_up = @runs_caught_up OUTPUT;
SELECT @runs_skipped AS runs_skipped, @runs_resumed AS runs_resumed, @runs_caught_up AS runs_caught_up;

-- resume_job --
-- End a job's pause in force (no row: it is not paused); a pause that already ended is removed too. Read, then deleted, under lock_job_pauses.
DECLARE @resumed TABLE (job_name NVARCHAR(64), paused_at DATETIME2(6), paused_until DATETIME2(6), in_force INT);
INSERT INTO @resumed (job_name, paused_at, paused_until, in_force)
SELECT job_name, paused_at, paused_until,
       CASE WHEN paused_until IS NULL OR paused_until > CAST(:now AS DATETIME2(6)) THEN 1 ELSE 0 END
FROM agent.job_pauses WHERE job_name = CAST(:job_name AS NVARCHAR(64));
DELETE FROM agent.job_pauses WHERE job_name = CAST(:job_name AS NVARCHAR(64));
SELECT job_name, paused_at, paused_until, in_force FROM @resumed;

-- stop_overdue_runs --
-- STOP_AFTER_SECONDS (issue 32 item 1), in the tick: every run of a job with the limit still running that long after its attempt started is stopped as `stop JOB` stops a run (stop_job: cancelled, the token bump fences the worker, whose lease renewal finds it gone and stops the work), with a note naming the limit. One statement whatever the number of jobs; the update lock makes a second tick racing find the run no longer running. (The join in the WHERE clause: Babelfish refuses an UPDATE ... OUTPUT whose SET reads a table joined with ON.)
DECLARE @stopped TABLE (run_id BIGINT, job_name NVARCHAR(64), scheduled_for DATETIME2(6), status NVARCHAR(16),
                        note NVARCHAR(MAX), operation_id NVARCHAR(32));
UPDATE r SET status = N'cancelled', token = r.token + 1, finished_at = CAST(:now AS DATETIME2(6)),
    lease_expires_at = NULL,
    note = CONCAT(N'stopped: running longer than STOP_AFTER_SECONDS=', j.stop_after_seconds, N' (since ',
                  CONVERT(NVARCHAR(19), r.started_at, 126), N'Z)')
OUTPUT inserted.run_id, inserted.job_name, inserted.scheduled_for, inserted.status, inserted.note, inserted.operation_id
    INTO @stopped
FROM agent.runs AS r WITH (UPDLOCK, ROWLOCK), agent.jobs AS j
WHERE j.job_name = r.job_name AND j.stop_after_seconds IS NOT NULL AND r.status = N'running'
  AND r.started_at <= DATEADD(second, -j.stop_after_seconds, CAST(:now AS DATETIME2(6)));
SELECT run_id, job_name, scheduled_for, status, note, operation_id FROM @stopped;

-- raise_alerts --
-- The alerts of issue 32 items 1-2, in one statement whatever the number of jobs, each written to the outbox at most once per (run, kind): the unique index, and the key-range lock of the NOT EXISTS probe (UPDLOCK, HOLDLOCK) that keeps a racing tick out; see the PostgreSQL query of the same name. The p95 is the nearest rank over the job's last :history successful runs (CROSS APPLY TOP).
DECLARE @raised TABLE (notification_id BIGINT, run_id BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16),
                       outcome NVARCHAR(16), detail NVARCHAR(MAX), status NVARCHAR(16));
WITH recent AS (
    SELECT j.job_name, h.duration
    FROM agent.jobs AS j
    CROSS APPLY (
        SELECT TOP (CAST(:history AS INT)) DATEDIFF_BIG(millisecond, r.started_at, r.finished_at) / 1000.0 AS duration
        FROM agent.runs AS r
        WHERE r.job_name = j.job_name AND r.status = N'succeeded' AND r.started_at IS NOT NULL
          AND r.finished_at < CAST(:since AS DATETIME2(6))
          AND NOT EXISTS (SELECT 1 FROM agent.notifications AS n WHERE n.run_id = r.run_id AND n.kind = N'slower')
        ORDER BY r.scheduled_for DESC) AS h
    WHERE j.slower_than IS NOT NULL),
ranked AS (
    SELECT job_name, duration, ROW_NUMBER() OVER (PARTITION BY job_name ORDER BY duration) AS rank_no,
           COUNT(*) OVER (PARTITION BY job_name) AS runs
    FROM recent),
p95 AS (
    SELECT job_name, MIN(duration) AS p95_seconds FROM ranked
    WHERE runs >= CAST(:min_history AS INT) AND rank_no >= (95 * runs + 99) / 100
    GROUP BY job_name),
alerts AS (
    SELECT r.run_id, r.job_name, CAST(N'duration' AS NVARCHAR(16)) AS kind, r.status AS outcome,
           CONCAT(N'running for more than MAX_DURATION_SECONDS=', j.max_duration_seconds, N' s (started ',
                  CONVERT(NVARCHAR(19), r.started_at, 126), N'Z)') AS detail
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.max_duration_seconds IS NOT NULL AND r.status = N'running'
      AND r.started_at <= DATEADD(second, -j.max_duration_seconds, CAST(:now AS DATETIME2(6)))
    UNION ALL
    SELECT r.run_id, r.job_name, N'stopped', r.status, r.note
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.stop_after_seconds IS NOT NULL AND r.status = N'cancelled' AND r.finished_at >= CAST(:since AS DATETIME2(6))
      AND r.scheduled_for >= CAST(:oldest_slot AS DATETIME2(6))
      AND r.note LIKE N'stopped: running longer than STOP[_]AFTER[_]SECONDS=%'
    UNION ALL
    SELECT r.run_id, r.job_name, N'slower', r.status,
           CONCAT(N'took ', CAST(DATEDIFF_BIG(millisecond, r.started_at, COALESCE(r.finished_at, CAST(:now AS DATETIME2(6)))) / 1000.0 AS DECIMAL(18, 1)),
                  N' s, more than SLOWER_THAN=', j.slower_than, N' x the p95 of its recent successful runs (',
                  CAST(p.p95_seconds AS DECIMAL(18, 1)), N' s)')
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name JOIN p95 AS p ON p.job_name = r.job_name
    WHERE r.started_at IS NOT NULL AND p.p95_seconds > 0
      AND (r.status = N'running' OR (r.status IN (N'succeeded', N'failed') AND r.finished_at >= CAST(:since AS DATETIME2(6))
                                       AND r.scheduled_for >= CAST(:oldest_slot AS DATETIME2(6))))
      AND DATEDIFF_BIG(millisecond, r.started_at, COALESCE(r.finished_at, CAST(:now AS DATETIME2(6)))) / 1000.0
          > j.slower_than * p.p95_seconds
    UNION ALL
    SELECT r.run_id, r.job_name, N'deadline', r.status,
           CONCAT(N'no success within DEADLINE_SECONDS=', j.deadline_seconds, N' s of the slot ',
                  CONVERT(NVARCHAR(19), r.scheduled_for, 126), N'Z: the run is ', r.status,
                  CASE WHEN r.note IS NOT NULL THEN CONCAT(N' (', r.note, N')') ELSE N'' END)
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.deadline_seconds IS NOT NULL AND r.kind = N'scheduled'
      AND r.scheduled_for <= DATEADD(second, -j.deadline_seconds, CAST(:now AS DATETIME2(6)))
      AND r.scheduled_for > DATEADD(second, -j.deadline_seconds, CAST(:since AS DATETIME2(6)))
      AND NOT (r.status = N'succeeded' AND r.finished_at <= DATEADD(second, j.deadline_seconds, r.scheduled_for))
      AND NOT (r.status = N'skipped' AND (r.note LIKE N'paused%' OR r.note LIKE N'calendar:%' OR r.note LIKE N'skipped: the job%')))
INSERT INTO agent.notifications (run_id, job_name, kind, outcome, detail, url, status, attempts, created_at, next_attempt_at)
OUTPUT inserted.notification_id, inserted.run_id, inserted.job_name, inserted.kind, inserted.outcome, inserted.detail,
       inserted.status INTO @raised
SELECT a.run_id, a.job_name, a.kind, a.outcome, a.detail,
       COALESCE(j.notify_webhook_url, CAST(:default_url AS NVARCHAR(2000)), N''),
       CASE WHEN COALESCE(j.notify_webhook_url, CAST(:default_url AS NVARCHAR(2000))) IS NULL THEN N'unsent' ELSE N'pending' END,
       0, CAST(:now AS DATETIME2(6)), CAST(:now AS DATETIME2(6))
FROM alerts AS a JOIN agent.jobs AS j ON j.job_name = a.job_name
WHERE NOT EXISTS (SELECT 1 FROM agent.notifications AS n WITH (UPDLOCK, HOLDLOCK)
                  WHERE n.run_id = a.run_id AND n.kind = a.kind);
SELECT notification_id, run_id, job_name, kind, outcome, detail, status FROM @raised;

-- next_alert_moment --
-- The earliest moment after :now at which raise_alerts (or stop_overdue_runs) may have something new to say; see the PostgreSQL query of the same name.
SELECT MIN(m.moment) AS next_alert_at FROM (
    SELECT DATEADD(second, j.max_duration_seconds, r.started_at) AS moment
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.max_duration_seconds IS NOT NULL AND r.status = N'running'
      AND DATEADD(second, j.max_duration_seconds, r.started_at) > CAST(:now AS DATETIME2(6))
    UNION ALL
    SELECT DATEADD(second, j.stop_after_seconds, r.started_at)
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.stop_after_seconds IS NOT NULL AND r.status = N'running'
      AND DATEADD(second, j.stop_after_seconds, r.started_at) > CAST(:now AS DATETIME2(6))
    UNION ALL
    SELECT DATEADD(second, j.deadline_seconds, r.scheduled_for)
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.deadline_seconds IS NOT NULL AND r.kind = N'scheduled' AND r.status <> N'succeeded'
      AND DATEADD(second, j.deadline_seconds, r.scheduled_for) > CAST(:now AS DATETIME2(6))
    UNION ALL
    SELECT DATEADD(second, j.deadline_seconds, j.next_due_at)
    FROM agent.jobs AS j
    WHERE j.deadline_seconds IS NOT NULL AND j.next_due_at IS NOT NULL AND j.enabled = 1 AND j.valid = 1) AS m;

-- quiet_horizon --
-- What a quiet tick needs to know (shared/engine/quiet.py): the earliest time anything in the control database can come due: a job's next slot, a pending run (a retry, a delayed or held run), a lease in flight (its expiry), a pause's end, a notification's next delivery; and whether anything is due now or a fleet run waits (then every tick connects). One statement, whatever the job count.
SELECT (SELECT MIN(next_due_at) FROM agent.jobs WHERE next_due_at IS NOT NULL) AS next_slot_at,
       (SELECT MIN(runnable_at) FROM agent.runs WHERE status = N'pending') AS next_runnable_at,
       (SELECT MIN(lease_expires_at) FROM agent.runs WHERE status IN (N'queued', N'running')) AS next_lease_at,
       (SELECT COUNT(*) FROM agent.runs WHERE status IN (N'queued', N'running') AND lease_expires_at IS NULL) AS unleased,
       (SELECT COUNT(*) FROM agent.runs WHERE status = N'waiting') AS waiting,
       (SELECT MIN(paused_until) FROM agent.job_pauses WHERE paused_until > CAST(:now AS DATETIME2(6))) AS next_pause_end_at,
       (SELECT MIN(CASE WHEN status = N'sending' THEN claimed_until ELSE next_attempt_at END) FROM agent.notifications
        WHERE status IN (N'pending', N'sending')) AS next_notification_at,
       (SELECT MIN(CASE WHEN a.valid IS NULL THEN CAST(:now AS DATETIME2(6))
                        WHEN a.probe_query IS NOT NULL THEN COALESCE(a.next_check_at, CAST(:now AS DATETIME2(6)))
                        WHEN EXISTS (SELECT 1 FROM agent.attempts AS t WHERE t.finished_at > a.checked_until
                                     AND t.outcome NOT IN (N'running', N'succeeded')) THEN CAST(:now AS DATETIME2(6)) END)
        FROM agent.alerts AS a WHERE a.enabled = 1 AND (a.valid IS NULL OR a.valid = 1)) AS next_condition_alert_at;

-- token_context --
-- What a run's SQL Agent tokens need besides the run (shared/jobs/tokens.py): its job's name (a fleet execution's through its run) and time zone. Read only for a command that has a token.
SELECT COALESCE(r.job_name, p.job_name) AS job_name, j.timezone
FROM agent.runs AS r
LEFT JOIN agent.runs AS p ON p.run_id = r.parent_run_id
LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name)
WHERE r.run_id = :run_id;

-- sync_settings_alerts --
-- Condition alerts from the settings (a JSON array of {alert_name, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify, notify_webhook_url, response_job, enabled, valid, config_error}): each written as source 'settings', checked again by the next tick when its definition changed (valid NULL), its counters and times kept; a name an alert defined with agent.add_alert holds is left to that alert; settings alerts no longer in the settings are removed. Returns the names a database alert holds.
DECLARE @given TABLE (alert_name NVARCHAR(64) PRIMARY KEY, probe_query NVARCHAR(MAX), schedule NVARCHAR(400), timezone NVARCHAR(64),
                      errors NVARCHAR(400), timeout_seconds INT, delay_seconds INT, notify INT, notify_webhook_url NVARCHAR(2000),
                      response_job NVARCHAR(64), enabled INT, valid INT, config_error NVARCHAR(MAX));
INSERT INTO @given
SELECT agent.json_text(x.alert_name), agent.json_text(x.probe_query), agent.json_text(x.schedule), x.timezone,
       agent.json_text(x.errors), x.timeout_seconds, x.delay_seconds, x.notify, agent.json_text(x.notify_webhook_url),
       agent.json_text(x.response_job), x.enabled, CASE WHEN x.valid = 0 THEN 0 END, agent.json_text(x.config_error)
FROM OPENJSON(:alerts) WITH (alert_name NVARCHAR(200), probe_query NVARCHAR(MAX), schedule NVARCHAR(800), timezone NVARCHAR(64),
                             errors NVARCHAR(800), timeout_seconds INT, delay_seconds INT, notify INT,
                             notify_webhook_url NVARCHAR(4000), response_job NVARCHAR(200), enabled INT, valid INT,
                             config_error NVARCHAR(MAX)) AS x;
UPDATE a SET probe_query = g.probe_query, schedule = g.schedule, timezone = g.timezone, errors = g.errors,
       timeout_seconds = g.timeout_seconds, delay_seconds = g.delay_seconds, notify = g.notify,
       notify_webhook_url = g.notify_webhook_url, response_job = g.response_job, enabled = g.enabled, valid = g.valid,
       config_error = g.config_error, next_check_at = NULL, updated_at = CAST(:now AS DATETIME2(6))
FROM agent.alerts AS a WITH (UPDLOCK, HOLDLOCK), @given AS g
WHERE a.alert_name = g.alert_name AND a.source = N'settings'
  AND (EXISTS (SELECT a.probe_query, a.schedule, a.timezone, a.errors, a.timeout_seconds, a.delay_seconds, a.notify,
                      a.notify_webhook_url, a.response_job, a.enabled, a.config_error
               EXCEPT SELECT g.probe_query, g.schedule, g.timezone, g.errors, g.timeout_seconds, g.delay_seconds, g.notify,
                             g.notify_webhook_url, g.response_job, g.enabled, g.config_error)
       OR a.valid = 0);
INSERT INTO agent.alerts (alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds,
                          notify, notify_webhook_url, response_job, enabled, valid, config_error, created_at, updated_at)
SELECT g.alert_name, N'settings', NULL, g.probe_query, g.schedule, g.timezone, g.errors, g.timeout_seconds, g.delay_seconds,
       g.notify, g.notify_webhook_url, g.response_job, g.enabled, g.valid, g.config_error,
       CAST(:now AS DATETIME2(6)), CAST(:now AS DATETIME2(6))
FROM @given AS g
WHERE NOT EXISTS (SELECT 1 FROM agent.alerts AS a WITH (UPDLOCK, HOLDLOCK) WHERE a.alert_name = g.alert_name);
DELETE FROM agent.alerts WHERE source = N'settings' AND alert_name NOT IN (SELECT alert_name FROM @given);
SELECT a.alert_name FROM agent.alerts AS a WHERE a.source = N'database' AND a.alert_name IN (SELECT alert_name FROM @given);

-- select_alert_work --
-- The condition alerts a tick looks at (shared/engine/condition_alerts.py): every enabled alert not yet checked (valid NULL), every valid probe due at :now, and every valid ERRORS alert (each tick reads the failures since its last check). One statement, whatever the number of alerts.
SELECT alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify,
       notify_webhook_url, response_job, valid, next_check_at, checked_until, updated_at
FROM agent.alerts
WHERE enabled = 1 AND (valid IS NULL OR (valid = 1 AND (errors IS NOT NULL OR next_check_at IS NULL
                                                       OR next_check_at <= CAST(:now AS DATETIME2(6)))))
ORDER BY alert_name;

-- claim_alert_checks --
-- Claim this tick's checks (a JSON array of {alert_name, seen_check_at, updated_at, next_check_at, valid, config_error}): each alert's next check moves on (and a definition checked records valid and why not), only where no other tick moved it since it was read and the definition is the one read; the alerts returned are this tick's to check. An ERRORS alert starts watching the failures from its first check.
DECLARE @claimed TABLE (alert_name NVARCHAR(64), valid INT, checked_until DATETIME2(6));
UPDATE a SET next_check_at = c.next_check_at, valid = c.valid, config_error = c.config_error,
       checked_until = CASE WHEN c.valid = 1 THEN COALESCE(a.checked_until, CAST(:now AS DATETIME2(6))) END
OUTPUT inserted.alert_name, inserted.valid, inserted.checked_until INTO @claimed
FROM agent.alerts AS a,
     (SELECT agent.json_text(x.alert_name) AS alert_name, CONVERT(DATETIME2(6), x.seen_check_at, 121) AS seen_check_at,
             CONVERT(DATETIME2(6), x.updated_at, 121) AS updated_at, CONVERT(DATETIME2(6), x.next_check_at, 121) AS next_check_at,
             x.valid, agent.json_text(x.config_error) AS config_error
      FROM OPENJSON(:checks) WITH (alert_name NVARCHAR(200), seen_check_at NVARCHAR(40), updated_at NVARCHAR(40),
                                   next_check_at NVARCHAR(40), valid INT, config_error NVARCHAR(MAX)) AS x) AS c
WHERE a.alert_name = c.alert_name AND a.updated_at = c.updated_at
  AND (a.next_check_at = c.seen_check_at OR (a.next_check_at IS NULL AND c.seen_check_at IS NULL));
SELECT alert_name, valid, checked_until FROM @claimed;

-- alert_failures --
-- The attempts that failed with an error after :since and up to :now, oldest first, at most :limit (ERRORS alerts: shared/engine/condition_alerts.py matches each against each alert's list). One indexed range read; started_by_alert: the alert whose response started the run (its own response's failure does not trigger that alert again).
SELECT TOP (CAST(:limit AS INT)) a.attempt_id, a.run_id, r.job_name, a.finished_at, a.outcome, a.error_number, a.error_sqlstate,
       LEFT(a.error_message, 400) AS error_message,
       (SELECT MIN(f.alert_name) FROM agent.alert_firings AS f WHERE f.response_run_id = a.run_id) AS started_by_alert
FROM agent.attempts AS a JOIN agent.runs AS r ON r.run_id = a.run_id
WHERE a.finished_at > CAST(:since AS DATETIME2(6)) AND a.finished_at <= CAST(:now AS DATETIME2(6))
  AND a.outcome NOT IN (N'running', N'succeeded') AND a.error_message IS NOT NULL
ORDER BY a.finished_at, a.attempt_id;

-- record_alert_results --
-- What this tick's checks found (a JSON array of {alert_name, triggered, error, checked_until, next_response_at}), in one statement: counts and times of occurrences; the probe's error (error_since: when it started failing); the failures looked at; and a response where one occurred and the delay since the last response has passed (next_response_at <= :now). Returns each alert with fired 1 when this check responds, and failing 1 when its probe has just started failing.
DECLARE @now DATETIME2(6) = CAST(:now AS DATETIME2(6));
-- OUTPUT copies plain columns: Babelfish refuses an expression of inserted.* in an UPDATE's OUTPUT
-- ("missing FROM-clause entry for table inserted"); the CASEs are in the SELECT after it.
DECLARE @recorded TABLE (alert_name NVARCHAR(64), last_response_at DATETIME2(6), last_error NVARCHAR(MAX),
                         error_since DATETIME2(6));
UPDATE a SET
    last_checked_at = @now,
    last_error = r.error,
    error_since = CASE WHEN r.error IS NULL THEN NULL ELSE COALESCE(a.error_since, @now) END,
    occurrences = a.occurrences + r.triggered,
    last_occurred_at = CASE WHEN r.triggered = 1 THEN @now ELSE a.last_occurred_at END,
    checked_until = COALESCE(r.checked_until, a.checked_until),
    last_response_at = CASE WHEN r.triggered = 1 AND (a.next_response_at IS NULL OR a.next_response_at <= @now)
                            THEN @now ELSE a.last_response_at END,
    responses = a.responses + CASE WHEN r.triggered = 1 AND (a.next_response_at IS NULL OR a.next_response_at <= @now)
                                   THEN 1 ELSE 0 END,
    next_response_at = CASE WHEN r.triggered = 1 AND (a.next_response_at IS NULL OR a.next_response_at <= @now)
                            THEN r.next_response_at ELSE a.next_response_at END
OUTPUT inserted.alert_name, inserted.last_response_at, inserted.last_error, inserted.error_since INTO @recorded
FROM agent.alerts AS a,
     (SELECT agent.json_text(x.alert_name) AS alert_name, x.triggered, agent.json_text(x.error) AS error,
             CONVERT(DATETIME2(6), x.checked_until, 121) AS checked_until,
             CONVERT(DATETIME2(6), x.next_response_at, 121) AS next_response_at
      FROM OPENJSON(:results) WITH (alert_name NVARCHAR(200), triggered INT, error NVARCHAR(MAX), checked_until NVARCHAR(40),
                                    next_response_at NVARCHAR(40)) AS x) AS r
WHERE a.alert_name = r.alert_name;
SELECT alert_name, CASE WHEN last_response_at = @now THEN 1 ELSE 0 END AS fired,
       CASE WHEN last_error IS NOT NULL AND error_since = @now THEN 1 ELSE 0 END AS failing
FROM @recorded;

-- insert_alert_firings --
-- The responses of this tick (a JSON array of {alert_name, kind, detail, url, notify}): one row of agent.alert_firings each and, when it notifies, its notification in the outbox (run_id: the firing's id, kind 'condition', 'errors' or 'alert_error'; with no webhook, recorded 'unsent'). Returns each firing.
DECLARE @fired TABLE (firing_id BIGINT, alert_name NVARCHAR(64), kind NVARCHAR(16), detail NVARCHAR(MAX));
DECLARE @x TABLE (alert_name NVARCHAR(64), kind NVARCHAR(16), detail NVARCHAR(MAX), url NVARCHAR(2000), notify INT);
INSERT INTO @x
SELECT agent.json_text(v.alert_name), v.kind, agent.json_text(v.detail), agent.json_text(v.url), v.notify
FROM OPENJSON(:firings) WITH (alert_name NVARCHAR(200), kind NVARCHAR(16), detail NVARCHAR(MAX), url NVARCHAR(4000), notify INT) AS v;
INSERT INTO agent.alert_firings (alert_name, kind, raised_at, detail)
OUTPUT inserted.firing_id, inserted.alert_name, inserted.kind, inserted.detail INTO @fired
SELECT x.alert_name, x.kind, CAST(:now AS DATETIME2(6)), x.detail FROM @x AS x;
INSERT INTO agent.notifications (run_id, job_name, outcome, url, status, attempts, created_at, next_attempt_at, kind, detail)
SELECT f.firing_id, f.alert_name, N'alert', COALESCE(x.url, N''), CASE WHEN x.url IS NULL THEN N'unsent' ELSE N'pending' END,
       0, CAST(:now AS DATETIME2(6)), CAST(:now AS DATETIME2(6)), f.kind, f.detail
FROM @fired AS f JOIN @x AS x ON x.alert_name = f.alert_name AND x.kind = f.kind
WHERE x.notify = 1;
SELECT firing_id, alert_name, kind FROM @fired ORDER BY firing_id;

-- set_alert_response --
-- The run a firing started (RESPONSE_JOB), or why none was started.
UPDATE agent.alert_firings SET response_run_id = CAST(:run_id AS BIGINT), response_error = CAST(:response_error AS NVARCHAR(MAX))
WHERE firing_id = CAST(:firing_id AS BIGINT);

-- list_alerts --
-- sql-agent alerts and the monitor: every condition alert with its state, by name.
SELECT alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify,
       notify_webhook_url, response_job, enabled, valid, config_error, next_check_at, last_checked_at, last_occurred_at,
       last_response_at, next_response_at, occurrences, responses, last_error, error_since, updated_at
FROM agent.alerts ORDER BY alert_name;

-- list_alert_firings --
-- The latest responses of condition alerts (optionally of one alert), newest first.
SELECT TOP (CAST(:limit AS INT)) firing_id, alert_name, kind, raised_at, detail, response_run_id, response_error
FROM agent.alert_firings WHERE (CAST(:alert_name AS NVARCHAR(64)) IS NULL OR alert_name = CAST(:alert_name AS NVARCHAR(64)))
ORDER BY firing_id DESC;

-- set_probe_timeout --
-- A probe's time limit: on SQL Server the ODBC query timeout of its connection (shared/engine/condition_alerts.py): nothing to do here.
SELECT CAST(:timeout_ms AS NVARCHAR(20)) AS timeout_ms WHERE 1 = 0;

-- prepare_probe --
-- A temporary table for a probe's rows, in the probe's transaction (rolled back with it); the owner's batch writes to it.
IF OBJECT_ID(N'tempdb..#agent_probe') IS NOT NULL DROP TABLE #agent_probe;
CREATE TABLE #agent_probe (rows_json NVARCHAR(MAX) NULL);
SELECT 1 AS prepared WHERE 1 = 0;

-- probe_rows --
-- A probe's rows, as the JSON array its SELECT ... FOR JSON PATH wrote.
SELECT TOP (1) rows_json FROM #agent_probe;

-- probe_read_only --
-- A condition alert's probe run as the agent itself: its transaction is read-only from the first statement (PostgreSQL); SQLite sets query_only on the probe's connection instead, SQL Server relies on the rollback.
UPDATE agent.state SET state_value = state_value WHERE 1 = 0;

-- get_job_definition --
-- One job as agent.add_scheduled_job's arguments hold it (the monitor's job form, issue 32 item 6: an edit starts from what is defined), with where it is defined and its owner.
SELECT j.job_name, j.schedule, j.timezone, j.command, j.target_database, j.enabled, j.max_attempts, j.timeout_seconds,
       j.lease_seconds, j.misfire, j.grace_seconds, j.overlap, j.requested_targets, j.requested_target_parallelism,
       COALESCE(j.requested_target_stagger_seconds, 0) AS requested_target_stagger_seconds, j.after_job, j.after_outcome,
       COALESCE(j.catchup_seconds, 0) AS catchup_seconds, j.owner, j.defined_in_database, j.configured, j.valid,
       j.config_error, j.calendars, j.jitter_seconds,
       j.requested_steps
FROM agent.jobs AS j
WHERE j.job_name = CAST(:job_name AS NVARCHAR(64));

-- define_job --
-- The monitor's job form (issue 32 item 6): agent.add_scheduled_job's body (agent.add_scheduled_job_unaudited, migration 0024: its checks, its refusals, its redefinition of a job of the same name) with every argument (:run_at an ISO 8601 text with its offset, converted into a DATETIMEOFFSET variable first: an EXEC argument is a constant or a variable, and an untyped NULL bound for a DATETIMEOFFSET parameter is refused by Babelfish), in the caller's transaction (its own BEGIN/COMMIT nest in it). The monitor writes the audit row itself (source monitor, the signed-in principal) and the owner (set_job_owner) in the same transaction; the audited procedure would record the app's own user for both.
DECLARE @run_at DATETIMEOFFSET = CAST(:run_at AS DATETIMEOFFSET);
EXEC agent.add_scheduled_job_unaudited :job_name, :sql, :schedule, @run_at, :timezone, :enabled, :max_attempts,
    :timeout_seconds, :overlap, :database, :misfire, :grace_seconds, :lease_seconds, :targets, :target_parallelism,
    :after, :after_outcome, :target_stagger_seconds, :catchup_seconds;

-- remove_job --
-- The monitor's job form: agent.remove_scheduled_job's body (agent.remove_scheduled_job_unaudited: a job defined in the database only; its claimed slots skipped) in the caller's transaction, audited by the monitor.
EXEC agent.remove_scheduled_job_unaudited :job_name;

-- set_job_owner --
-- Whom a job defined from the monitor runs as: the signed-in principal, as the monitor names it (the procedure recorded the app's own user, the caller of its connection), in the transaction that defined it.
UPDATE agent.jobs SET owner = CAST(:owner AS NVARCHAR(256)) WHERE job_name = CAST(:job_name AS NVARCHAR(64)) AND defined_in_database = 1;

-- set_job_steps --
-- The monitor's job form: agent.set_job_steps's body (agent.set_job_steps_unaudited, migration 0028: a database job's steps as requested, NULL or '[]' clears them; the engine's planning checks them) in the transaction that defined the job and made the signed-in principal its owner (its own BEGIN/COMMIT nest in it), audited by the monitor as part of that 'define'.
EXEC agent.set_job_steps_unaudited :job_name, :steps;
