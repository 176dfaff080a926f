-- Named queries for PostgreSQL (through pyodbc and the PostgreSQL ODBC driver).
-- Format: "-- name --", a one-line description, then the query. Parameters are :name;
-- the store turns them into qmark placeholders. Timestamps are UTC, naive, always passed
-- in (CAST(:x AS timestamp)): the agent's clock, never the server's.

-- bootstrap_schema --
-- Take the migration lock for the session (released by release_migration_lock after the migrations), then create the agent schema and the schema version table if missing: two first init-db runs cannot both create them (CREATE ... IF NOT EXISTS alone races on the catalog). The schema is created only when missing, because CREATE SCHEMA IF NOT EXISTS checks CREATE on the database first: a least-privilege login owns the schema an admin made for it (grant-sql --agent-login) and has no CREATE on the database.
SELECT pg_advisory_lock(7428001) AS locked;
DO $$ BEGIN IF to_regnamespace('agent') IS NULL THEN CREATE SCHEMA agent; END IF; END $$;
CREATE TABLE IF NOT EXISTS agent.schema_version (
    version     INT PRIMARY KEY,
    description VARCHAR(200) NOT NULL,
    applied_at  TIMESTAMP NOT NULL
);

-- release_migration_lock --
-- Release the session's migration lock taken by bootstrap_schema.
SELECT pg_advisory_unlock(7428001) AS released;

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

-- claim_state --
-- Set one engine state value only if it is new or larger than the stored one (text order); a row back means this caller won (e.g. the one doorbell chain of a tick period).
INSERT INTO agent.state (state_key, state_value, updated_at)
VALUES (:state_key, :state_value, CAST(:now AS timestamp))
ON CONFLICT (state_key) DO UPDATE SET state_value = EXCLUDED.state_value, updated_at = EXCLUDED.updated_at
WHERE agent.state.state_value < EXCLUDED.state_value
RETURNING state_key;

-- server_version --
-- The server's product and version (doctor).
SELECT version() AS server_version;

-- database_time --
-- The database server's clock (UTC): the agent's one clock. clock_timestamp(), not now(): the time of this statement even inside a transaction.
SELECT CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamp) AS server_now;

-- record_config_events --
-- Record each job whose configuration became invalid (or changed its error) since the last sync.
INSERT INTO agent.job_events (job_name, event_at, kind, detail)
SELECT j.job_name, CAST(:now AS timestamp), 'config_invalid', j.config_error
FROM json_to_recordset(CAST(:jobs AS json)) AS j(job_name VARCHAR, valid INT, config_error TEXT)
WHERE j.valid = 0
  AND NOT EXISTS (SELECT 1 FROM agent.jobs c
                  WHERE c.job_name = j.job_name AND c.valid = 0 AND c.configured = 1
                    AND c.config_error = j.config_error);

-- skip_runs_of_changed_jobs --
-- Slots claimed ahead for a job whose schedule or time zone changed, or that was disabled, became invalid or was removed, are recorded skipped instead of run (and so are the slots ahead a pause had recorded skipped: a resume must not bring back a slot of the old settings). A job whose calendars (EXCLUDE, ONLY, ON_EXCLUDED: the calendars JSON) or JITTER_SECONDS changed has its never-started scheduled runs keyed from its new next slot on (next_due_at, which upsert_jobs moves back to it) recorded skipped the same way: the claim plans them again under the new rules (a run keyed as before is taken back in place), so a run is neither duplicated under a new jitter nor left at a time a new calendar excludes. A run keyed before that slot stands for an earlier slot (a jittered run stays before the schedule's next slot) and is left as it is. A job with no next slot left (a one-time job once claimed, a schedule past its `until`) has its run not yet due and not held by a pause recorded skipped; upsert_jobs then has it decided again from its slot, or from now when that has passed; a run that came, ran or was skipped for good stands. A run a calendar moved (note '...; moved from ...'), not yet due, is recorded skipped whatever its key, with a note of its own ('... after a calendar moved this run here'), by which upsert_jobs has the job decided again from now: the slot it stood for is decided under the new calendars.
UPDATE agent.runs AS r SET status = 'skipped', finished_at = CAST(:now AS timestamp), lease_expires_at = NULL,
    note = CASE WHEN j.job_name IS NULL THEN 'skipped: the job was removed from the settings after this slot was claimed'
                WHEN j.valid = 0 THEN 'skipped: the job''s settings became invalid after this slot was claimed'
                WHEN j.enabled = 0 THEN 'skipped: the job was disabled after this slot was claimed'
                WHEN j.schedule <> c.schedule OR j.timezone <> c.timezone
                THEN 'skipped: the job''s schedule or time zone changed after this slot was claimed'
                WHEN r.note LIKE '%; moved from %' THEN 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'
                ELSE 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed' END
FROM agent.jobs AS c
LEFT JOIN json_to_recordset(CAST(:jobs AS json)) AS j(job_name VARCHAR, schedule VARCHAR, timezone VARCHAR,
                                                      enabled INT, valid INT, calendars TEXT, jitter_seconds INT,
                                                      next_due_at VARCHAR)
       ON j.job_name = c.job_name
WHERE r.job_name = c.job_name AND r.kind IN ('scheduled', 'backfill')
  AND (r.status IN ('pending', 'queued')
       OR (r.status = 'skipped' AND r.note = 'paused' AND r.attempt = 0 AND r.scheduled_for >= CAST(:now AS timestamp)))
  AND c.configured = 1 AND c.defined_in_database = 0
  AND (j.job_name IS NULL OR j.valid = 0 OR j.enabled = 0 OR j.schedule <> c.schedule OR j.timezone <> c.timezone
       OR ((j.calendars IS DISTINCT FROM c.calendars OR COALESCE(j.jitter_seconds, 0) <> c.jitter_seconds)
           AND r.kind = 'scheduled' AND r.attempt = 0
           AND ((c.next_due_at IS NOT NULL
                 AND (r.scheduled_for >= CAST(j.next_due_at AS timestamp)
                      -- A run a calendar moved, not yet due, keyed before that slot (a freeze
                      -- extended over the time an earlier slot moved to): decided again from now.
                      OR (r.status IN ('pending', 'queued') AND r.scheduled_for >= CAST(:now AS timestamp)
                          AND r.note LIKE '%; moved from %')))
                -- A job with no next slot left (a one-time job once claimed, a schedule past its
                -- `until`): its run not yet due and not held by a pause (one a calendar moved);
                -- one that came, ran, or was skipped or paused stands.
                OR (c.next_due_at IS NULL AND r.status IN ('pending', 'queued')
                    AND r.scheduled_for >= CAST(:now AS timestamp)))))
RETURNING r.run_id, r.job_name, r.scheduled_for, r.status, r.note, r.operation_id;

-- upsert_jobs --
-- Write every configured job in one statement; a new job, a changed schedule or time zone, or a job re-enabled starts from its new next_due_at. A job whose definition (definition_hash: every setting the sync writes, from shared/engine/scheduler.py) is what the last sync wrote is left as it is: its updated_at stays the time its definition last changed (the follow-up refusals are told once per definition from it).
INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                        config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                        grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                        steps, notify, notify_webhook_url, after_job, after_outcome, calendars, jitter_seconds,
                        max_duration_seconds, stop_after_seconds, slower_than, deadline_seconds, catchup_seconds, definition_hash, params)
SELECT j.job_name, j.schedule, j.timezone, j.command, j.target_database, j.enabled, j.valid,
       j.config_error, j.max_attempts, j.timeout_seconds, j.lease_seconds, j.misfire,
       j.grace_seconds, j.overlap, CAST(j.next_due_at AS timestamp), CAST(:now AS timestamp), 1,
       CAST(:now AS timestamp), j.steps, j.notify, j.notify_webhook_url, j.after_job, j.after_outcome, j.calendars, COALESCE(j.jitter_seconds, 0),
       j.max_duration_seconds, j.stop_after_seconds, j.slower_than, j.deadline_seconds, COALESCE(j.catchup_seconds, 0), j.definition_hash, j.params
FROM json_to_recordset(CAST(:jobs AS json)) AS j(
    job_name VARCHAR, schedule VARCHAR, timezone VARCHAR, command TEXT, target_database VARCHAR,
    enabled INT, valid INT, config_error TEXT, max_attempts INT, timeout_seconds INT,
    lease_seconds INT, misfire VARCHAR, grace_seconds INT, overlap VARCHAR, next_due_at VARCHAR,
    steps TEXT, notify VARCHAR, notify_webhook_url VARCHAR, after_job VARCHAR, after_outcome VARCHAR, calendars TEXT, jitter_seconds INT,
    max_duration_seconds INT, stop_after_seconds INT, slower_than DOUBLE PRECISION, deadline_seconds INT, catchup_seconds INT, definition_hash VARCHAR, params TEXT)
ORDER BY j.job_name
ON CONFLICT (job_name) DO UPDATE SET
    next_due_at = CASE
        WHEN agent.jobs.schedule <> EXCLUDED.schedule
          OR agent.jobs.timezone <> EXCLUDED.timezone
          OR agent.jobs.enabled <> EXCLUDED.enabled
          OR agent.jobs.valid <> EXCLUDED.valid
          OR agent.jobs.configured = 0
        THEN EXCLUDED.next_due_at
        -- Calendars or jitter changed: back to the new next slot (the runs claimed ahead from it
        -- on were recorded skipped by skip_runs_of_changed_jobs), never past a slot not yet claimed;
        -- a job with no next slot left (a one-time job once claimed) whose run not yet due (one a
        -- calendar moved) skip_runs_of_changed_jobs just recorded skipped is decided again. Never
        -- before now: a one-time job's slot that has passed is not a missed slot then.
        WHEN (agent.jobs.calendars IS DISTINCT FROM EXCLUDED.calendars OR agent.jobs.jitter_seconds <> EXCLUDED.jitter_seconds)
          AND EXCLUDED.next_due_at IS NOT NULL AND agent.jobs.next_due_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = agent.jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = CAST(:now AS timestamp)
                        AND o.note = 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here')
        THEN CAST(:now AS timestamp)
        WHEN (agent.jobs.calendars IS DISTINCT FROM EXCLUDED.calendars OR agent.jobs.jitter_seconds <> EXCLUDED.jitter_seconds)
          AND EXCLUDED.next_due_at IS NOT NULL AND agent.jobs.next_due_at IS NOT NULL AND EXCLUDED.next_due_at < agent.jobs.next_due_at
        THEN GREATEST(EXCLUDED.next_due_at, CAST(:now AS timestamp))
        WHEN (agent.jobs.calendars IS DISTINCT FROM EXCLUDED.calendars OR agent.jobs.jitter_seconds <> EXCLUDED.jitter_seconds)
          AND agent.jobs.next_due_at IS NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = agent.jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = CAST(:now AS timestamp)
                        AND o.note IN ('skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed', 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'))
        THEN GREATEST(COALESCE(EXCLUDED.next_due_at, CAST(:now AS timestamp)), CAST(:now AS timestamp)) ELSE agent.jobs.next_due_at END,
    advanced_at = CASE
        WHEN agent.jobs.schedule <> EXCLUDED.schedule
          OR agent.jobs.timezone <> EXCLUDED.timezone
          OR agent.jobs.enabled <> EXCLUDED.enabled
          OR agent.jobs.valid <> EXCLUDED.valid
          OR agent.jobs.configured = 0
        THEN EXCLUDED.advanced_at
        WHEN (agent.jobs.calendars IS DISTINCT FROM EXCLUDED.calendars OR agent.jobs.jitter_seconds <> EXCLUDED.jitter_seconds)
          AND EXCLUDED.next_due_at IS NOT NULL AND agent.jobs.next_due_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = agent.jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = CAST(:now AS timestamp)
                        AND o.note = 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here')
        THEN EXCLUDED.advanced_at
        WHEN (agent.jobs.calendars IS DISTINCT FROM EXCLUDED.calendars OR agent.jobs.jitter_seconds <> EXCLUDED.jitter_seconds)
          AND EXCLUDED.next_due_at IS NOT NULL AND agent.jobs.next_due_at IS NOT NULL AND EXCLUDED.next_due_at < agent.jobs.next_due_at
        THEN EXCLUDED.advanced_at
        WHEN (agent.jobs.calendars IS DISTINCT FROM EXCLUDED.calendars OR agent.jobs.jitter_seconds <> EXCLUDED.jitter_seconds)
          AND agent.jobs.next_due_at IS NULL
          AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = agent.jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = CAST(:now AS timestamp)
                        AND o.note IN ('skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed', 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'))
        THEN EXCLUDED.advanced_at ELSE agent.jobs.advanced_at END,
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
    defined_in_database = 0,
    needs_planning = 0,
    updated_at = EXCLUDED.updated_at,
    steps = EXCLUDED.steps,
    notify = EXCLUDED.notify,
    notify_webhook_url = EXCLUDED.notify_webhook_url,
    after_job = EXCLUDED.after_job,
    after_outcome = EXCLUDED.after_outcome,
    calendars = EXCLUDED.calendars,
    jitter_seconds = EXCLUDED.jitter_seconds,
    max_duration_seconds = EXCLUDED.max_duration_seconds,
    stop_after_seconds = EXCLUDED.stop_after_seconds,
    slower_than = EXCLUDED.slower_than,
    deadline_seconds = EXCLUDED.deadline_seconds,
    catchup_seconds = EXCLUDED.catchup_seconds,
    definition_hash = EXCLUDED.definition_hash,
    params = EXCLUDED.params
-- Never over a job defined in the database (the sync renamed such rows; this guards the rule).
WHERE agent.jobs.configured = 0
   OR (agent.jobs.defined_in_database = 0 AND agent.jobs.definition_hash IS DISTINCT FROM EXCLUDED.definition_hash);

-- refresh_runs_of_changed_jobs --
-- Runs claimed ahead that never started (pending or queued, attempt 0) of a settings job whose schedule, time zone and enabled state stand but whose other settings changed take the new ones (command, database, overlap, attempts, timeout, lease, steps): a slot after the change runs what the settings say now, not what they said when it was claimed. Before upsert_jobs (it compares with the job as stored).
UPDATE agent.runs AS r SET command = x.command, target_database = x.target_database, overlap = x.overlap,
    max_attempts = x.max_attempts, timeout_seconds = x.timeout_seconds, lease_seconds = x.lease_seconds,
    steps = x.steps
FROM (SELECT j.job_name, j.command, j.target_database, j.overlap, j.max_attempts, j.timeout_seconds,
             j.lease_seconds, j.steps
      FROM json_to_recordset(CAST(:jobs AS json)) AS j(
          job_name VARCHAR, schedule VARCHAR, timezone VARCHAR, command TEXT, target_database VARCHAR,
          enabled INT, valid INT, max_attempts INT, timeout_seconds INT, lease_seconds INT, overlap VARCHAR,
          steps TEXT, definition_hash VARCHAR)
      JOIN agent.jobs AS c ON c.job_name = j.job_name
      WHERE c.configured = 1 AND c.defined_in_database = 0 AND c.valid = 1 AND c.enabled = 1
        AND j.valid = 1 AND j.enabled = 1 AND j.schedule = c.schedule AND j.timezone = c.timezone
        AND c.definition_hash IS DISTINCT FROM j.definition_hash) AS x
WHERE r.job_name = x.job_name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued') AND r.attempt = 0;

-- unconfigure_missing_jobs --
-- Jobs no longer in the settings stop being scheduled; their history stays.
UPDATE agent.jobs SET configured = 0, next_due_at = NULL, updated_at = CAST(:now AS timestamp)
WHERE configured = 1 AND defined_in_database = 0
  AND job_name NOT IN (SELECT j.job_name FROM json_to_recordset(CAST(:jobs AS json)) AS j(job_name VARCHAR));

-- insert_job_events --
-- Record things that happened to jobs outside any run (a JSON array of {job_name, kind, detail}).
INSERT INTO agent.job_events (job_name, event_at, kind, detail)
SELECT e.job_name, CAST(:now AS timestamp), e.kind, e.detail
FROM json_to_recordset(CAST(:events AS json)) AS e(job_name VARCHAR, kind VARCHAR, detail TEXT);

-- expire_leases --
-- Take back every run whose holder stopped renewing its lease (a lapse: the worker died or lost the database; counted apart from attempts, failed after AGENT_MAX_LAPSES) or whose message was lost, fencing it with a new token.
UPDATE agent.runs SET
    status = CASE WHEN status = 'running' AND lapses + 1 > CAST(:max_lapses AS INT) THEN 'failed' ELSE 'pending' END,
    lapses = CASE WHEN status = 'running' THEN lapses + 1 ELSE lapses END,
    token = token + 1,
    lease_expires_at = NULL,
    runnable_at = CASE WHEN status = 'running' THEN CAST(:now AS timestamp) ELSE runnable_at END,
    finished_at = CASE WHEN status = 'running' AND lapses + 1 > CAST(:max_lapses AS INT)
                       THEN CAST(:now AS timestamp) ELSE NULL END,
    last_error = CASE WHEN status = 'running'
                      THEN 'lease lapsed: worker ' || COALESCE(worker, '?') || ' stopped renewing its lease (lapse '
                           || CAST(lapses + 1 AS VARCHAR) || ' of AGENT_MAX_LAPSES='
                           || CAST(CAST(:max_lapses AS INT) AS VARCHAR) || ')'
                      ELSE 'dispatch lease expired: the message was not picked up in time; dispatching again' END
WHERE run_id IN (
        -- Locked in key order first (racing ticks never lock the same rows in different orders).
        SELECT run_id FROM agent.runs
        WHERE status IN ('queued', 'running') AND lease_expires_at < CAST(:now AS timestamp) AND awaiting_targets = 0
        ORDER BY run_id FOR UPDATE)
  AND status IN ('queued', 'running') AND lease_expires_at < CAST(:now AS timestamp) AND awaiting_targets = 0
RETURNING run_id, job_name, kind, status, attempt, lapses, token, operation_id, scheduled_for,
          CASE WHEN last_error LIKE 'lease lapsed:%' THEN 1 ELSE 0 END AS was_running;

-- close_dead_attempts --
-- Mark attempts still 'running' whose run has moved on to a newer token: their worker died or was fenced.
UPDATE agent.attempts SET outcome = 'lease_expired', finished_at = CAST(:now AS timestamp),
    error_message = 'lease lapsed: the worker stopped renewing its lease (killed, hung or cut off from the database)'
WHERE attempt_id IN (
        SELECT a.attempt_id FROM agent.attempts AS a
        WHERE a.outcome = 'running' AND a.token < (SELECT r.token FROM agent.runs r WHERE r.run_id = a.run_id)
        ORDER BY a.attempt_id FOR UPDATE OF a)
  AND outcome = 'running'
  AND token < (SELECT r.token FROM agent.runs r WHERE r.run_id = agent.attempts.run_id);

-- select_runaway_jobs --
-- Jobs whose next slot was moved by a tick whose clock ran ahead of this one by more than AGENT_MAX_CLOCK_SKEW_SECONDS.
SELECT job_name, schedule, timezone, next_due_at, advanced_at
FROM agent.jobs
WHERE advanced_at > CAST(:far AS timestamp) AND configured = 1
ORDER BY job_name;

-- recover_runaway_runs --
-- Undo what a clock far ahead created: its never-started slots go, and the misfires it recorded (false: the slots had not come; they are claimed again when their time comes), other never-started runs become runnable now, and leases set far ahead come back within reach.
DELETE FROM agent.runs
WHERE kind = 'scheduled' AND status IN ('pending', 'queued', 'skipped') AND attempt = 0
  AND created_at > CAST(:far AS timestamp)
RETURNING 'removed' AS action, run_id, job_name, scheduled_for;
UPDATE agent.runs SET runnable_at = CAST(:now AS timestamp), created_at = CAST(:now AS timestamp),
    status = 'pending', lease_expires_at = NULL
WHERE kind <> 'scheduled' AND status IN ('pending', 'queued') AND created_at > CAST(:far AS timestamp)
RETURNING 'made runnable' AS action, run_id, job_name, scheduled_for;
UPDATE agent.runs SET lease_expires_at = CAST(:now AS timestamp) + lease_seconds * INTERVAL '1 second'
WHERE status IN ('queued', 'running') AND lease_expires_at > CAST(:far_lease AS timestamp)
RETURNING 'lease shortened' AS action, run_id, job_name, scheduled_for;

-- select_due_jobs --
-- Jobs with a slot at or before the claim horizon (the next tick plus a margin), each with whether a pause is in force at :now and its window (one that ended names the slots missed inside it); their slots are computed in Python, for these jobs only.
-- The job-definitions lock (advisory 7428014), then the pauses lock (advisory 7428015), are taken shared, to the claim's commit, before the scan (a scalar subquery: a one-time filter, evaluated even when no job is due; not EXISTS, whose select list the planner drops; the concatenation takes them in that order, the order agent.enable_job takes them): a pause_job either committed before it (claim_slots, a later statement, sees the pause) or waits for this claim to commit (and skips what it claimed inside the pause); a definition (a settings sync, agent.add_scheduled_job, enable_job, remove_scheduled_job) either committed before it (the slots are computed from it) or waits for this claim to commit (and skips the slots it claimed under the old one), so no claim computed from a definition that is gone is written after it.
SELECT j.job_name, j.schedule, j.timezone, j.next_due_at, j.misfire, j.grace_seconds, j.calendars, j.jitter_seconds, j.catchup_seconds,
       CASE WHEN p.job_name IS NULL THEN 0
            WHEN p.paused_until IS NULL OR p.paused_until > CAST(:now AS timestamp) THEN 1 ELSE 0 END AS paused,
       p.paused_at, p.paused_until
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p ON p.job_name = j.job_name
WHERE j.next_due_at <= CAST(:horizon AS timestamp) AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
  AND (SELECT CAST(pg_advisory_xact_lock_shared(7428014) AS text) || CAST(pg_advisory_xact_lock_shared(7428015) AS text))
      IS NOT NULL
ORDER BY j.job_name;

-- claim_slots --
-- Claim the given slots (a JSON array of {job_name, scheduled_for, status, note, runnable_at}) in one statement; the unique (job_name, scheduled_for) key arbitrates between concurrent ticks. A run becomes runnable at its slot (runnable_at, when given: later, the end of the pause that held it), never before. A slot whose run a change of the job's definition recorded skipped (note 'skipped: the job ...': disabled, removed, redefined, schedule changed) and that never started is the job's again when a claim under the definition now in force plans it (enabled again, added back, a new schedule with a slot at the same instant); so is a slot a calendar recorded skipped (note 'calendar: ...') that the calendars now in force decide otherwise (allowed, or moved elsewhere): its run takes the planned decision and the definition's values in place (the same run id; a new token fences a message sent before, a new operation id), and is returned with the runs inserted.
-- The run of each slot is found by the unique (job_name, scheduled_for) index (a LATERAL with OFFSET 0: one index probe per slot, never a scan of the skipped runs, whatever the statistics say), then updated by its primary key (= ANY of their run ids: the UPDATE reads no other run; racing ticks lock them in the same order), checked again once locked (a racing tick that claimed one first leaves it pending); the INSERT finds them (its conflict check sees the row whatever this statement did to it) and inserts nothing for them.
WITH planned AS MATERIALIZED (
    SELECT j.job_name, CAST(s.scheduled_for AS timestamp) AS scheduled_for,
           CASE WHEN p.paused = 1 THEN 'skipped' ELSE s.status END AS status,
           CASE WHEN p.paused = 1 THEN 'paused' ELSE s.note END AS note,
           COALESCE(CAST(s.runnable_at AS timestamp), CAST(s.scheduled_for AS timestamp)) AS runnable_at,
           md5(random()::text || clock_timestamp()::text || j.job_name || s.scheduled_for) AS operation_id,
           j.command, j.target_database, j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, j.steps
    FROM json_to_recordset(CAST(:slots AS json)) AS s(job_name VARCHAR, scheduled_for VARCHAR, status VARCHAR, note TEXT,
                                                       runnable_at VARCHAR)
    -- LATERAL with OFFSET 0 (kept as is, not flattened): one primary-key lookup per slot. The
    -- planner cannot size a JSON argument, and a scan of agent.jobs per slot would cost slots x jobs.
    CROSS JOIN LATERAL (
        SELECT * FROM agent.jobs AS x
        WHERE x.job_name = s.job_name AND x.enabled = 1 AND x.valid = 1 AND x.configured = 1 OFFSET 0) AS j
    -- A pause in force that select_due_jobs did not see (committed while it waited for the pauses
    -- lock): a slot that would run before its end is recorded skipped 'paused', never claimed.
    LEFT JOIN LATERAL (
        SELECT 1 AS paused FROM agent.job_pauses AS y
        WHERE y.job_name = s.job_name AND y.paused_at <= CAST(:now AS timestamp)
          AND (y.paused_until IS NULL OR y.paused_until > CAST(:now AS timestamp))
          AND (y.paused_until IS NULL
               OR COALESCE(CAST(s.runnable_at AS timestamp), CAST(s.scheduled_for AS timestamp)) < y.paused_until)
        OFFSET 0) AS p ON TRUE),
found AS MATERIALIZED (
    SELECT y.*, o.run_id
    FROM planned AS y
    CROSS JOIN LATERAL (
        SELECT o.run_id, o.kind, o.status, o.attempt, o.note FROM agent.runs AS o
        WHERE o.job_name = y.job_name AND o.scheduled_for = y.scheduled_for OFFSET 0) AS o
    WHERE o.kind = 'scheduled' AND o.status = 'skipped' AND o.attempt = 0
      AND (o.note LIKE 'skipped: the job%'
           -- A slot a calendar excluded that the calendars now in force decide otherwise.
           OR (o.note LIKE 'calendar:%' AND (y.status <> 'skipped' OR (y.note LIKE 'calendar:%' AND y.note <> o.note))))),
revived AS (
    UPDATE agent.runs AS r SET status = x.status, note = x.note, runnable_at = x.runnable_at,
        finished_at = CASE WHEN x.status = 'skipped' THEN CAST(:now AS timestamp) END, lease_expires_at = NULL,
        dispatched_at = NULL, last_error = NULL, last_error_number = NULL, token = r.token + 1,
        created_at = CAST(:now AS timestamp), operation_id = x.operation_id, command = x.command,
        target_database = x.target_database, overlap = x.overlap, max_attempts = x.max_attempts,
        timeout_seconds = x.timeout_seconds, lease_seconds = x.lease_seconds, steps = x.steps
    FROM found AS x
    WHERE r.run_id = x.run_id AND r.run_id = ANY (ARRAY(SELECT f.run_id FROM found AS f))
      AND r.kind = 'scheduled' AND r.status = 'skipped' AND r.attempt = 0
      AND (r.note LIKE 'skipped: the job%' OR r.note LIKE 'calendar:%')
    RETURNING r.run_id, r.job_name, r.scheduled_for, r.status, r.note, r.operation_id, r.token),
inserted AS (
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                            max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                            finished_at, operation_id, note, steps)
    SELECT x.job_name, 'scheduled', x.scheduled_for, x.status, x.command, x.target_database, x.overlap,
           x.max_attempts, x.timeout_seconds, x.lease_seconds, x.runnable_at, CAST(:now AS timestamp),
           CASE WHEN x.status = 'skipped' THEN CAST(:now AS timestamp) END, x.operation_id, x.note, x.steps
    FROM planned AS x
    ORDER BY x.job_name, x.scheduled_for
    ON CONFLICT (job_name, scheduled_for) DO NOTHING
    RETURNING run_id, job_name, scheduled_for, status, note, operation_id, token)
SELECT run_id, job_name, scheduled_for, status, note, operation_id, token FROM revived
UNION ALL
SELECT run_id, job_name, scheduled_for, status, note, operation_id, token FROM inserted;

-- advance_jobs --
-- Move jobs to their next slot, per schedule (a JSON array of {schedule, timezone, from_due, next_due_at, paused, misfire, job_name}; paused 1: only the jobs with a pause in force at :now, 0: only the others, absent: both; misfire, when given: only the jobs of that policy; job_name, when given: that job only, as for a paused job, whose next slot depends on its own pause); a job another tick already moved is left as it is.
-- The jobs are locked in key order first: racing ticks never lock them in different orders (a deadlock).
UPDATE agent.jobs AS j SET next_due_at = CAST(a.next_due_at AS timestamp), advanced_at = CAST(:now AS timestamp)
FROM (SELECT x.job_name, v.next_due_at, v.from_due
      FROM agent.jobs AS x
      JOIN json_to_recordset(CAST(:advances AS json)) AS v(schedule VARCHAR, timezone VARCHAR, from_due VARCHAR,
                                                           next_due_at VARCHAR, paused INT, misfire VARCHAR,
                                                           job_name VARCHAR)
        ON x.next_due_at = CAST(v.from_due AS timestamp) AND x.schedule = v.schedule AND x.timezone = v.timezone
       AND (v.misfire IS NULL OR x.misfire = v.misfire) AND (v.job_name IS NULL OR x.job_name = v.job_name)
       AND (v.paused IS NULL OR v.paused = CASE WHEN EXISTS (
                SELECT 1 FROM agent.job_pauses AS p
                WHERE p.job_name = x.job_name
                  AND (p.paused_until IS NULL OR p.paused_until > CAST(:now AS timestamp))) THEN 1 ELSE 0 END)
      ORDER BY x.job_name FOR UPDATE OF x) AS a
WHERE j.job_name = a.job_name AND j.next_due_at = CAST(a.from_due AS timestamp)
RETURNING j.job_name;

-- dispatch_runs --
-- Queue mode: under the start lock, skip the slots that may not run, then hand the queue every due run that may start (task order, overlap 'queue', the cap counting runs executing or due on the queue) and every run due within the lookahead (a delayed message; it holds no place). Each gets a new token and a dispatch lease. (agent.dispatch_runs, a function of migration 0002, replaced in 0006, 0022 and 0026: planned once per session.) The rare policies' statements (misfire and overlap skip, buffer-one, cancel-previous) run only when a run they could act on exists (0026: an index probe first), so little is done under the lock.
SELECT decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note
FROM agent.dispatch_runs(CAST(:now AS TIMESTAMP), CAST(:late_cutoff AS TIMESTAMP), CAST(:max_concurrency AS INT), CAST(:lookahead_until AS TIMESTAMP), CAST(:ahead_limit AS INT), CAST(:dispatch_lease_seconds AS INT));

-- release_dispatch --
-- Put back runs whose queue message could not be sent (a JSON array of {run_id, token}); a later dispatch sends them again.
UPDATE agent.runs AS r SET status = 'pending', lease_expires_at = NULL
FROM json_to_recordset(CAST(:runs AS json)) AS x(run_id BIGINT, token BIGINT)
WHERE r.run_id = x.run_id AND r.token = x.token AND r.status = 'queued'
RETURNING r.run_id;

-- start_run --
-- Queue mode, fenced start of the run a message names: only for the current token of a queued run, decided under the start lock: early (the slot has not come), skipped (overlap skip, misfire), held back to pending (task order, overlap queue, the cap) or started with its attempt opened. owner as claim_runs gives it. (agent.start_run, a function of migration 0002, replaced in 0006, 0013, 0018, 0022 and 0026: planned once per session.) Its cancel-previous statements run only when the run it names is of a job with that policy (0026: a primary key probe first).
SELECT c.decision, c.run_id, c.job_name, c.kind, c.command, c.target_database, c.attempt, c.failures, c.max_attempts, c.lapses, c.transient_errors, c.token, c.timeout_seconds, c.lease_seconds, c.operation_id, c.scheduled_for, c.runnable_at, c.started_at, c.note, c.step, c.steps, c.parent_run_id, c.parent_token, c.target_server, c.retry_interval_seconds, c.owner, c.params, c.job_params
FROM agent.start_run(CAST(:now AS TIMESTAMP), CAST(:late_cutoff AS TIMESTAMP), CAST(:max_concurrency AS INT), CAST(:run_id AS BIGINT), CAST(:token AS BIGINT), CAST(:worker AS VARCHAR), CAST(:dequeue_count AS INT)) AS c;

-- claim_runs --
-- Local runner: under the start lock, skip the slots that may not run, then start up to :batch runnable runs straight from agent.runs (task order, overlap, the cap), each with a new token and its attempt opened. :now NULL: decided on the database's own clock (the agent's one clock; an explicit :now is a test's clock). owner: whom the run's SQL runs as ('' the agent's user), read by the function from the very row it claimed (never unseen). (agent.claim_runs, a function of migration 0002, replaced in 0006, 0013, 0018, 0022 and 0026: planned once per session, the owner with it; the run's params and the job's declared ones with it.) The rare policies' statements (misfire and overlap skip, buffer-one, cancel-previous) run only when a run they could act on exists (0026: an index probe first), so little is done under the lock.
SELECT c.decision, c.run_id, c.job_name, c.kind, c.command, c.target_database, c.attempt, c.failures, c.max_attempts, c.lapses, c.transient_errors, c.token, c.timeout_seconds, c.lease_seconds, c.operation_id, c.scheduled_for, c.runnable_at, c.started_at, c.note, c.step, c.steps, c.parent_run_id, c.parent_token, c.target_server, c.retry_interval_seconds, c.owner, c.params, c.job_params
FROM agent.claim_runs(CAST(:now AS TIMESTAMP), CAST(:late_cutoff AS TIMESTAMP), CAST(:batch AS INT), CAST(:max_concurrency AS INT), CAST(:worker AS VARCHAR)) AS c
ORDER BY c.runnable_at, c.run_id;

-- next_runnable_at --
-- When the next pending run becomes runnable (the local runner's idle workers sleep until then, or the poll interval).
SELECT MIN(runnable_at) AS next_at FROM agent.runs
WHERE status = 'pending' AND runnable_at > CAST(:now AS timestamp);

-- renew_leases --
-- One statement renews the lease of every run a process holds (a JSON array of {run_id, token}); a run missing from the result was taken over or cancelled.
UPDATE agent.runs AS r SET heartbeat_at = CAST(:now AS timestamp),
    lease_expires_at = CAST(:now AS timestamp) + r.lease_seconds * INTERVAL '1 second'
FROM (SELECT x.run_id, x.token FROM agent.runs AS x
      JOIN json_to_recordset(CAST(:held AS json)) AS v(run_id BIGINT, token BIGINT)
        ON x.run_id = v.run_id AND x.token = v.token
      ORDER BY x.run_id FOR UPDATE OF x) AS h
WHERE r.run_id = h.run_id AND r.token = h.token AND r.status = 'running' AND r.awaiting_targets = 0
RETURNING r.run_id;

-- reset_session --
-- Undo what a job's SQL may have changed in the session (settings, role, temporary tables, cursors, listeners, advisory locks) before the agent's own statements; the job's transaction is still open. (Not DISCARD PLANS: the agent's functions keep their plans.)
CLOSE ALL;
RESET SESSION AUTHORIZATION;
RESET ROLE;
RESET ALL;
UNLISTEN *;
SELECT pg_advisory_unlock_all() AS unlocked;
DISCARD SEQUENCES;
DISCARD TEMP;
SET lock_timeout = '30s';

-- finish_run --
-- Fenced completion in the job's transaction: the run and its open attempt succeed together, only for the current token; when the token moved on (the lease was taken over, or the run cancelled) it raises (SQLSTATE AG001), so that a batch ending with COMMIT stops before it. (agent.finish_run, a function of migration 0002, raising since 0013: planned once per session.)
SELECT run_id FROM agent.finish_run(CAST(:run_id AS BIGINT), CAST(:token AS BIGINT), CAST(:now AS TIMESTAMP));

-- fail_run --
-- Fenced failure (an error in the job's SQL, or its timeout): spends one of max_attempts; back to pending at :retry_at while attempts remain, else failed; the attempt closes with the error.
WITH f AS (
    UPDATE agent.runs SET
        failures = failures + 1,
        status = CASE WHEN failures + 1 < max_attempts THEN 'pending' ELSE 'failed' END,
        runnable_at = CAST(:retry_at AS timestamp),
        finished_at = CASE WHEN failures + 1 < max_attempts THEN NULL ELSE CAST(:now AS timestamp) END,
        lease_expires_at = NULL,
        last_error_number = :error_number,
        last_error = :error_message
    WHERE run_id = :run_id AND token = :token AND status = 'running'
    RETURNING run_id, token, status, attempt, failures, max_attempts),
closed AS (
    UPDATE agent.attempts AS a SET outcome = :outcome, finished_at = CAST(:now AS timestamp),
        error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
    FROM f WHERE a.run_id = f.run_id AND a.token = f.token AND a.outcome = 'running')
SELECT status, attempt, failures, max_attempts FROM f;

-- retry_transient --
-- Local runner, fenced: a transient error spends no attempt; the run goes back to pending at :retry_at and counts the transient error; the attempt closes with it.
WITH t AS (
    UPDATE agent.runs SET status = 'pending', transient_errors = transient_errors + 1,
        runnable_at = CAST(:retry_at AS timestamp), lease_expires_at = NULL,
        last_error_number = :error_number, last_error = :error_message
    WHERE run_id = :run_id AND token = :token AND status = 'running'
    RETURNING run_id, token, status, transient_errors),
closed AS (
    UPDATE agent.attempts AS a SET outcome = 'transient', finished_at = CAST(:now AS timestamp),
        error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
    FROM t WHERE a.run_id = t.run_id AND a.token = t.token AND a.outcome = 'running')
SELECT status, transient_errors FROM t;

-- requeue_transient --
-- Queue mode, fenced: a transient error spends no attempt; the run goes back to the queue's redelivery (same token) with a dispatch lease in case the message is lost; the attempt closes with the error.
WITH t AS (
    UPDATE agent.runs SET status = 'queued', lease_expires_at = CAST(:lease_until AS timestamp),
        last_error_number = :error_number, last_error = :error_message
    WHERE run_id = :run_id AND token = :token AND status = 'running'
    RETURNING run_id, token, status),
closed AS (
    UPDATE agent.attempts AS a SET outcome = 'transient', finished_at = CAST(:now AS timestamp),
        error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
    FROM t WHERE a.run_id = t.run_id AND a.token = t.token AND a.outcome = 'running')
SELECT status FROM t;

-- poison_run --
-- Fenced: the run's current message (or, in the local runner, the run) is poisoned; the run ends poisoned and its open attempt closes with the last error.
WITH p AS (
    UPDATE agent.runs SET status = 'poisoned', finished_at = CAST(:now AS timestamp),
        lease_expires_at = NULL, last_error = :reason
    WHERE run_id = :run_id AND token = :token AND status IN ('pending', 'queued', 'running')
    RETURNING run_id, token),
closed AS (
    UPDATE agent.attempts AS a SET outcome = 'poisoned', finished_at = CAST(:now AS timestamp),
        error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
    FROM p WHERE a.run_id = p.run_id AND a.token = p.token AND a.outcome = 'running')
SELECT run_id FROM p;

-- close_fenced_attempt --
-- Close the attempt of a worker whose lease was taken over (its run belongs to someone else now).
UPDATE agent.attempts SET outcome = 'lease_lost', finished_at = CAST(:now AS timestamp), error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running'
RETURNING run_id;

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
-- Give a poisoned or failed run one more attempt (and fresh lapse and transient budgets): back to pending, runnable now; the next start gives it a new token.
UPDATE agent.runs SET status = 'pending', runnable_at = CAST(:now AS timestamp), finished_at = NULL,
    lease_expires_at = NULL, max_attempts = failures + 1, lapses = 0, transient_errors = 0,
    note = 'requeued by operator'
WHERE run_id = :run_id AND status IN ('poisoned', 'failed')
RETURNING run_id;

-- mark_poison_requeued --
-- Remember when a poison message was requeued.
UPDATE agent.poison_messages SET requeued_at = CAST(:now AS timestamp) WHERE poison_id = :poison_id;

-- insert_manual_run --
-- run-now: a run of a job right away, keyed by the request time; the job's overlap policy applies, decided under the start lock (another run-now still waiting counts as in flight whatever its requester's clock said).
LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note, steps, params)
SELECT j.job_name, 'manual', CAST(:now AS timestamp), d.decision, j.command, j.target_database,
       j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, CAST(:now AS timestamp),
       CAST(:now AS timestamp), CASE WHEN d.decision = 'skipped' THEN CAST(:now AS timestamp) END,
       :operation_id,
       CASE WHEN d.decision = 'skipped'
            THEN 'overlap: the previous run of this job was still in flight; policy skip'
            ELSE 'run-now' END, j.steps, CAST(:params AS TEXT)
FROM agent.jobs j
CROSS JOIN LATERAL (
    SELECT CASE WHEN j.overlap = 'skip' AND EXISTS (
                SELECT 1 FROM agent.runs a
                WHERE a.job_name = j.job_name
                  AND (a.status = 'running'
                       OR (a.status IN ('pending', 'queued') AND (a.runnable_at <= CAST(:now AS timestamp) OR a.kind = 'manual'))))
           THEN 'skipped' ELSE 'pending' END AS decision) AS d
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
RETURNING run_id, job_name, status, note, operation_id;

-- backfill_runs --
-- sql-agent backfill JOB --from --to: each slot of the past window (a JSON array of {scheduled_for, runnable_at}, oldest first, computed as the planner computes them: calendars and jitter applied) becomes a recorded run of its slot, kind 'backfill', runnable at once in slot order: a slot without a run gets one (the unique (job, slot) key: two backfills at once insert it once); a slot recorded skipped that never started is run now (its row, with the job's definition of now); a slot that ran, runs or waits is left alone. Backfill runs are outside the misfire rules (kind is not 'scheduled') and wait for each other (overlap queue; allow when the job allows). Rows back: the runs made, with how (inserted or rerun).
WITH s AS (
    SELECT CAST(x.scheduled_for AS timestamp) AS scheduled_for, CAST(x.runnable_at AS timestamp) AS runnable_at
    FROM json_to_recordset(CAST(:slots AS json)) AS x(scheduled_for VARCHAR, runnable_at VARCHAR)),
j AS (SELECT * FROM agent.jobs WHERE job_name = :job_name AND valid = 1 AND configured = 1),
rerun AS (
    UPDATE agent.runs AS r SET status = 'pending', kind = 'backfill', runnable_at = s.runnable_at, finished_at = NULL,
        lease_expires_at = NULL, command = j.command, target_database = j.target_database,
        overlap = CASE WHEN j.overlap = 'allow' THEN 'allow' ELSE 'queue' END, max_attempts = j.max_attempts,
        timeout_seconds = j.timeout_seconds, lease_seconds = j.lease_seconds, steps = j.steps,
        operation_id = :operation_id,
        note = CAST(:note AS TEXT) || ' (the slot had been skipped: ' || COALESCE(r.note, '') || ')'
    FROM s, j
    WHERE r.job_name = j.job_name AND r.scheduled_for = s.scheduled_for AND r.status = 'skipped' AND r.attempt = 0
    RETURNING r.run_id, r.scheduled_for, 'rerun'::text AS action),
inserted AS (
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                            max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                            operation_id, note, steps)
    SELECT j.job_name, 'backfill', s.scheduled_for, 'pending', j.command, j.target_database,
           CASE WHEN j.overlap = 'allow' THEN 'allow' ELSE 'queue' END, j.max_attempts, j.timeout_seconds,
           j.lease_seconds, s.runnable_at, CAST(:now AS timestamp), :operation_id, CAST(:note AS TEXT), j.steps
    FROM s CROSS JOIN j
    ORDER BY s.scheduled_for
    ON CONFLICT (job_name, scheduled_for) DO NOTHING
    RETURNING run_id, scheduled_for, 'inserted'::text AS action)
SELECT run_id, scheduled_for, action FROM rerun
UNION ALL
SELECT run_id, scheduled_for, action FROM inserted;

-- list_slot_runs --
-- backfill: the scheduled and backfill runs of one job keyed from :since to before :horizon (the spans of the window's slots, each from its time to the schedule's next slot): a slot's run is found whatever jitter keyed it.
SELECT scheduled_for, status, attempt, kind FROM agent.runs
WHERE job_name = :job_name AND kind IN ('scheduled', 'backfill')
  AND scheduled_for >= CAST(:since AS timestamp) AND scheduled_for < CAST(:horizon AS timestamp)
ORDER BY scheduled_for;

-- insert_task --
-- submit: an ad-hoc task; it starts once every task of a lower order submitted before it has finished.
INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                        overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                        created_at, operation_id, note)
VALUES (NULL, 'task', CAST(:now AS timestamp), 'pending', :command, :target_database, :task_order,
        'allow', :max_attempts, :timeout_seconds, :lease_seconds, CAST(:now AS timestamp),
        CAST(:now AS timestamp), :operation_id, 'submitted')
RETURNING run_id, status, operation_id;

-- cancel_run --
-- Cancel a run not yet finished (a fleet's execution not yet let in too); the token bump fences a worker still running it (the lease renewal finds it gone and stops the work).
UPDATE agent.runs SET status = 'cancelled', token = token + 1, finished_at = CAST(:now AS timestamp),
    lease_expires_at = NULL, note = 'cancelled by operator'
WHERE run_id = :run_id AND status IN ('pending', 'queued', 'running', 'waiting')
RETURNING run_id;

-- list_jobs --
-- Every known job with its configuration state, the parameters it declares, next slot and latest run.
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at, j.after_job, j.after_outcome, j.calendars, j.jitter_seconds, j.params,
       j.max_duration_seconds, j.stop_after_seconds, j.slower_than, j.deadline_seconds, COALESCE(j.catchup_seconds, 0) AS catchup_seconds,
       CASE WHEN j.defined_in_database = 1 THEN 'database' ELSE 'settings' END AS source, j.needs_planning,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at, l.targets_total AS last_targets_total,
       l.targets_failed AS last_targets_failed
FROM agent.jobs j
LEFT JOIN agent.job_pauses p ON p.job_name = j.job_name
LEFT JOIN LATERAL (
    SELECT r.run_id, r.status, r.scheduled_for, r.finished_at, r.targets_total, r.targets_failed FROM agent.runs r
    WHERE r.job_name = j.job_name AND r.status NOT IN ('pending', 'queued')
    ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1) AS l ON TRUE
ORDER BY j.job_name;

-- list_history --
-- Runs, newest first, optionally of one job.
SELECT run_id, job_name, kind, scheduled_for, status, attempt, failures, lapses, max_attempts, token,
       created_at, started_at, finished_at, worker, last_error_number, last_error, note, operation_id,
       step, failed_step, parent_run_id, target_server, target_database, targets_total, targets_failed, followed_run_id,
       params
FROM agent.runs
WHERE (CAST(:job_name AS VARCHAR) IS NULL OR job_name = CAST(:job_name AS VARCHAR))
ORDER BY run_id DESC LIMIT :limit;

-- list_attempts --
-- Attempts of the runs in a JSON array of run ids.
SELECT a.run_id, a.attempt, a.token, a.worker, a.dequeue_count, a.started_at, a.finished_at,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.step, a.target_database
FROM agent.attempts a
WHERE a.run_id IN (SELECT CAST(x.value AS BIGINT) FROM json_array_elements_text(CAST(:run_ids AS json)) AS x(value))
ORDER BY a.run_id, a.attempt_id;

-- list_job_events --
-- Job events (invalid configuration, clock recovery, ...), newest first, optionally of one job.
SELECT event_id, job_name, event_at, kind, detail FROM agent.job_events
WHERE (CAST(:job_name AS VARCHAR) IS NULL OR job_name = CAST(:job_name AS VARCHAR))
ORDER BY event_id DESC LIMIT :limit;

-- insert_audit --
-- One row of the audit trail (shared/engine/audit.py), in the operator action's own transaction, or alone after it was refused: the principal is :principal when the front end signed its user in (the monitor), else the connection's login (session_user), else :fallback_principal; :client says from where. The time is the agent's clock (the database's).
INSERT INTO agent.audit (acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail)
VALUES (CAST(:now AS timestamp),
        left(COALESCE(CAST(:principal AS varchar), CAST(session_user AS varchar), CAST(:fallback_principal AS varchar)), 256),
        left(CAST(:client AS varchar), 400), CAST(:source AS varchar), CAST(:action AS varchar),
        left(CAST(:job_name AS varchar), 200), CAST(:run_id AS bigint), CAST(:arguments AS text),
        CAST(:audit_outcome AS varchar), left(CAST(:detail AS varchar), 2000))
RETURNING audit_id;

-- audit_row_committed --
-- An operator action whose connection was lost at its COMMIT (shared/engine/audit.py): whether its row 'done', written as the transaction's last statement, is there (the transaction committed) or not.
SELECT audit_id FROM agent.audit
WHERE audit_id = CAST(:audit_id AS bigint) AND action = CAST(:action AS varchar) AND outcome = 'done'
  AND acted_at = CAST(:now AS timestamp);

-- list_audit --
-- sql-agent audit and the monitor's audit page: the audit trail, newest first, optionally of one job and from a time on.
SELECT audit_id, acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail FROM agent.audit
WHERE (CAST(:job_name AS VARCHAR) IS NULL OR job_name = CAST(:job_name AS VARCHAR))
  AND (CAST(:since AS timestamp) IS NULL OR acted_at >= CAST(:since AS timestamp))
ORDER BY audit_id DESC LIMIT CAST(:limit AS INT);

-- count_runs_by_status --
-- Runs per status (the doctor and the tests' reconciliation).
SELECT status, COUNT(*) AS runs FROM agent.runs GROUP BY status;

-- delete_run --
-- Remove a run and its attempts (the doctor's scratch run only).
DELETE FROM agent.attempts WHERE run_id = :run_id;
DELETE FROM agent.runs WHERE run_id = :run_id;

-- purge_history --
-- Retention, a bounded batch per tick: finished runs (with their attempts) and job events older than AGENT_HISTORY_RETENTION_DAYS — the latest run of each job, and a run with a poison message not yet requeued, always stay — and poison messages older than AGENT_POISON_RETENTION_DAYS; the audit trail is kept as long as the history.
WITH old AS (
    SELECT r.run_id FROM agent.runs AS r
    WHERE r.finished_at < CAST(:history_before AS timestamp)
      AND r.status IN ('succeeded', 'failed', 'poisoned', 'skipped', 'cancelled')
      AND (r.job_name IS NULL OR EXISTS (
            SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.scheduled_for > r.scheduled_for))
  AND NOT EXISTS (SELECT 1 FROM agent.poison_messages AS p WHERE p.run_id = r.run_id AND p.requeued_at IS NULL)
    ORDER BY r.finished_at
    LIMIT CAST(:batch AS INT)
    FOR UPDATE OF r SKIP LOCKED),
gone_attempts AS (
    DELETE FROM agent.attempts AS a USING old WHERE a.run_id = old.run_id),
gone AS (
    DELETE FROM agent.runs AS r USING old WHERE r.run_id = old.run_id RETURNING r.run_id)
SELECT 'runs' AS purged, COUNT(*) AS rows_purged FROM gone;
WITH old AS (
    SELECT event_id FROM agent.job_events WHERE event_at < CAST(:history_before AS timestamp)
    ORDER BY event_id LIMIT CAST(:batch AS INT) FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM agent.job_events AS e USING old WHERE e.event_id = old.event_id RETURNING e.event_id)
SELECT 'job_events' AS purged, COUNT(*) AS rows_purged FROM gone;
WITH old AS (
    SELECT poison_id FROM agent.poison_messages WHERE poisoned_at < CAST(:poison_before AS timestamp)
    ORDER BY poison_id LIMIT CAST(:batch AS INT) FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM agent.poison_messages AS p USING old WHERE p.poison_id = old.poison_id RETURNING p.poison_id)
SELECT 'poison_messages' AS purged, COUNT(*) AS rows_purged FROM gone;
WITH old AS (
    SELECT audit_id FROM agent.audit WHERE acted_at < CAST(:history_before AS timestamp)
    ORDER BY audit_id LIMIT CAST(:batch AS INT) FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM agent.audit AS a USING old WHERE a.audit_id = old.audit_id RETURNING a.audit_id)
SELECT 'audit' AS purged, COUNT(*) AS rows_purged FROM gone;

-- identity_rights --
-- The doctor's view of what the agent's login reaches beyond the agent's rights (docs/deploying.md, "What the agent's identity can do"): the privileged roles it is or can SET ROLE to (a superuser, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS role, a predefined role, the database's owner through pg_database_owner), or NULL.
SELECT CAST(session_user AS text) AS login_name,
       (SELECT string_agg(r.rolname || CASE WHEN r.rolsuper THEN ' (superuser)' WHEN r.rolcreaterole THEN ' (CREATEROLE)'
                                            WHEN r.rolcreatedb THEN ' (CREATEDB)' WHEN r.rolreplication THEN ' (REPLICATION)'
                                            WHEN r.rolbypassrls THEN ' (BYPASSRLS)' ELSE '' END, ', ' ORDER BY r.rolname)
        FROM pg_catalog.pg_roles AS r
        WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
          AND (r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls
               OR r.rolname LIKE 'pg\_%')) AS reaches;

-- connection_limit --
-- The doctor's view of how many connections the server lets the agent's login hold (AGENT_MAX_CONNECTIONS x processes must fit): max_connections less the places reserved for superusers (superuser_reserved_connections, and reserved_connections from PostgreSQL 16) unless the login is a superuser, the role's CONNECTION LIMIT and the database's (-1: none), and the client connections open now.
SELECT CAST(current_setting('max_connections') AS INT) AS max_connections,
       CASE WHEN r.rolsuper THEN 0
            ELSE CAST(current_setting('superuser_reserved_connections') AS INT)
                 + COALESCE(CAST(NULLIF(current_setting('reserved_connections', true), '') AS INT), 0) END AS reserved_connections,
       r.rolconnlimit AS role_limit,
       (SELECT d.datconnlimit FROM pg_database AS d WHERE d.datname = current_database()) AS database_limit,
       (SELECT COUNT(*) FROM pg_stat_activity AS a WHERE a.backend_type = 'client backend') AS connections_now,
       CAST(current_user AS VARCHAR(128)) AS login_name,
       CAST(NULL AS VARCHAR(128)) AS service_objective,
       CAST(NULL AS VARCHAR(128)) AS edition
FROM pg_roles AS r WHERE r.rolname = current_user;

-- doctor_session --
-- The doctor's view of the agent's session (lock timeout, isolation, statement timeout) and of the triggers a DBA put on agent tables.
SELECT current_setting('lock_timeout') AS lock_timeout,
       current_setting('transaction_isolation') AS isolation,
       'statement_timeout ' || current_setting('statement_timeout') || ', search_path ' || current_setting('search_path') AS session_options,
       (SELECT string_agg(t.tgname || ' on ' || c.relname || ' ('
                          || CASE WHEN (t.tgtype & 64) <> 0 THEN 'instead of'
                                  WHEN (t.tgtype & 2) <> 0 THEN 'before' ELSE 'after' END || ')', ', '
                          ORDER BY c.relname, t.tgname)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'agent' AND NOT t.tgisinternal) AS triggers,
       (SELECT COUNT(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'agent' AND NOT t.tgisinternal AND (t.tgtype & 64) <> 0) AS instead_of_triggers;

-- list_job_activity --
-- The monitor's status now: each job's unfinished runs grouped by status and by whether they are retries (a few rows per job, never one per run), optionally of one job.
SELECT job_name, status, CASE WHEN attempt > 0 THEN 1 ELSE 0 END AS retry, COUNT(*) AS runs,
       MIN(scheduled_for) AS first_scheduled_for, MIN(started_at) AS first_started_at,
       MIN(runnable_at) AS first_runnable_at, MAX(runnable_at) AS last_runnable_at, MIN(worker) AS worker
FROM agent.runs
WHERE status IN ('pending', 'queued', 'running') AND job_name IS NOT NULL
  AND (CAST(:job_name AS VARCHAR) IS NULL OR job_name = CAST(:job_name AS VARCHAR))
GROUP BY job_name, status, CASE WHEN attempt > 0 THEN 1 ELSE 0 END
ORDER BY job_name, status;

-- list_job_timeline --
-- The monitor's timeline: a job's runs whose slot is at or after :since, newest first, at most :limit (the unique (job_name, scheduled_for) index serves it).
SELECT run_id, kind, scheduled_for, status, attempt, max_attempts, started_at, finished_at, last_error, note
FROM agent.runs
WHERE job_name = CAST(:job_name AS VARCHAR) AND scheduled_for >= CAST(:since AS timestamp)
ORDER BY scheduled_for DESC, run_id DESC LIMIT :limit;

-- list_run_poison --
-- The poison messages of one run, newest first.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent.poison_messages WHERE run_id = :run_id ORDER BY poison_id DESC LIMIT :limit;

-- list_stuck_runs_page --
-- Reconciliation (the stuck command and page): runs in flight past their lease, or runnable but not started for longer than the given age; at most :limit runs.
SELECT run_id, job_name, kind, status, scheduled_for, runnable_at, lease_expires_at, token, attempt
FROM agent.runs
WHERE (status IN ('queued', 'running') AND lease_expires_at < CAST(:now AS timestamp))
   OR (status = 'pending' AND runnable_at < CAST(:stale_before AS timestamp))
ORDER BY run_id LIMIT :limit;

-- get_job --
-- One job as list_jobs shows it (the monitor's job page: one index lookup, not every job).
SELECT j.job_name, j.schedule, j.timezone, j.enabled, j.valid, j.config_error, j.configured,
       j.misfire, j.overlap, j.max_attempts, j.next_due_at, j.after_job, j.after_outcome, j.calendars, j.jitter_seconds, j.params,
       j.max_duration_seconds, j.stop_after_seconds, j.slower_than, j.deadline_seconds, COALESCE(j.catchup_seconds, 0) AS catchup_seconds,
       CASE WHEN j.defined_in_database = 1 THEN 'database' ELSE 'settings' END AS source,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason,
       l.run_id AS last_run_id, l.status AS last_status, l.scheduled_for AS last_scheduled_for,
       l.finished_at AS last_finished_at, l.targets_total AS last_targets_total,
       l.targets_failed AS last_targets_failed
FROM agent.jobs j
LEFT JOIN agent.job_pauses p ON p.job_name = j.job_name
LEFT JOIN LATERAL (
    SELECT r.run_id, r.status, r.scheduled_for, r.finished_at, r.targets_total, r.targets_failed FROM agent.runs r
    WHERE r.job_name = j.job_name AND r.status NOT IN ('pending', 'queued')
    ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1) AS l ON TRUE
WHERE j.job_name = CAST(:job_name AS VARCHAR);

-- lock_job_definitions --
-- The job-definitions lock for the rest of the transaction: the settings sync and the T-SQL interface's functions (agent.add_scheduled_job, ...) decide job names one at a time.
SELECT pg_advisory_xact_lock(7428014) AS locked;

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
UPDATE agent.jobs AS j SET needs_planning = 0, replan_runs = 0, valid = p.valid, config_error = p.config_error,
    next_due_at = CAST(p.next_due_at AS timestamp), advanced_at = CAST(:now AS timestamp), steps = p.steps,
    calendars = p.calendars
FROM json_to_recordset(CAST(:plans AS json)) AS p(job_name VARCHAR, schedule VARCHAR, timezone VARCHAR, enabled INT,
                                                  updated_at VARCHAR, valid INT, config_error TEXT, next_due_at VARCHAR,
                                                  steps TEXT, calendars TEXT)
WHERE j.job_name = p.job_name AND j.needs_planning = 1 AND j.updated_at = CAST(p.updated_at AS timestamp)
  AND j.schedule = p.schedule AND j.timezone = p.timezone AND j.enabled = p.enabled
RETURNING j.job_name, j.valid, j.config_error, j.next_due_at;

-- skip_replanned_runs --
-- A database job planned again after its calendars or jitter changed (agent.set_job_calendars set replan_runs, or the calendars the planning resolved differ from those in force: a calendar redefined or removed): its never-started scheduled runs keyed from its new first slot on (:jobs, a JSON array of {job_name, since, open_only}), and the slots ahead a pause recorded skipped, are recorded skipped (open_only: a job with no next slot left, a one-time job or a schedule past its `until`, whose runs not yet due alone are decided again: a slot a pause holds stays held); the claim that follows plans them again under the new rules (a run keyed as before is taken back in place, claim_slots). A run keyed before that slot stands for an earlier slot and is left as it is.
UPDATE agent.runs AS r SET status = 'skipped', finished_at = CAST(:now AS timestamp), lease_expires_at = NULL,
    note = CASE WHEN r.note LIKE '%; moved from %' THEN 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here' ELSE 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after this slot was claimed' END
FROM json_to_recordset(CAST(:jobs AS json)) AS x(job_name VARCHAR, since VARCHAR, open_only INT)
WHERE r.job_name = x.job_name AND r.kind = 'scheduled' AND r.attempt = 0
  AND (r.status IN ('pending', 'queued') OR (r.status = 'skipped' AND r.note = 'paused' AND x.open_only IS NULL))
  AND (r.scheduled_for >= CAST(x.since AS timestamp)
       -- A run a calendar moved, not yet due, keyed before that slot: decided again from now.
       OR (r.status IN ('pending', 'queued') AND r.scheduled_for >= CAST(:now AS timestamp)
           AND r.note LIKE '%; moved from %'))
RETURNING r.run_id, r.job_name, r.scheduled_for;

-- settle_replanned_jobs --
-- The database jobs planned again after their calendars or jitter changed (:jobs, a JSON array of {job_name, open_only}; plan_jobs set next_due_at to the job's first slot, NULL when none), after skip_replanned_runs. open_only (a job with no next slot left: a one-time job, a schedule past its `until`): one whose run not yet due it just recorded skipped (one a calendar moved) is decided again from its slot, or from now when that has passed or there is none (the run was waiting for the time its calendars allowed, not missed); one whose slot has a run standing for it (ran, runs, waits, backfilled, held by a pause, skipped for good; not one a redefinition recorded skipped, nor the slot a calendar moved) keeps no slot (next_due_at NULL, as its claim left it): it never runs twice, and a slot skipped for good is not brought back; one never claimed keeps its slot. The others: one whose run a calendar moved, keyed before its first slot, was just recorded skipped is decided again from now (the earlier slot's moved run, under the new calendars).
UPDATE agent.jobs AS j SET next_due_at = CASE
        WHEN x.open_only = 1
         AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = j.job_name AND o.status = 'skipped'
                       AND o.finished_at = CAST(:now AS timestamp) AND o.note IN ('skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after this slot was claimed', 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here'))
        THEN GREATEST(COALESCE(j.next_due_at, CAST(:now AS timestamp)), CAST(:now AS timestamp))
        WHEN x.open_only = 1 AND j.next_due_at IS NOT NULL
         AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = j.job_name AND o.scheduled_for >= j.next_due_at
                       AND NOT (o.status = 'skipped' AND (o.note LIKE 'skipped: the job%' OR o.note LIKE 'calendar:%; moved to %')))
        THEN NULL
        WHEN x.open_only IS NULL AND j.next_due_at IS NOT NULL
         AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = j.job_name AND o.status = 'skipped'
                       AND o.finished_at = CAST(:now AS timestamp)
                       AND o.note = 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here')
        THEN LEAST(j.next_due_at, CAST(:now AS timestamp))
        ELSE j.next_due_at END
FROM json_to_recordset(CAST(:jobs AS json)) AS x(job_name VARCHAR, open_only INT)
WHERE j.job_name = x.job_name;

-- stop_job --
-- stop JOB (SQL Agent's sp_stop_job): cancel the job's runs in flight (running, due, queued due, or waiting for a retry), never its future slots; the token bump fences a worker still running one (its lease renewal finds it gone and stops the work).
UPDATE agent.runs SET status = 'cancelled', token = token + 1, finished_at = CAST(:now AS timestamp),
    lease_expires_at = NULL, note = 'stopped by operator (stop JOB)'
WHERE job_name = :job_name AND status IN ('pending', 'queued', 'running')
  AND (status = 'running' OR runnable_at <= CAST(:now AS timestamp) OR attempt > 0)
RETURNING run_id, status;

-- begin_step_attempt --
-- A run of a multi-step job started: its open attempt says which step it runs and where.
UPDATE agent.attempts SET step = :step, target_database = :target_database
WHERE run_id = :run_id AND token = :token AND attempt = :attempt AND outcome = 'running';

-- step_transition --
-- A step of a multi-step run ended (fenced by the token; in the step's own transaction when it works in the control database, so the step's work and its transition commit together): the attempt closes with its outcome and output, and the run follows the flow: on to :next_step at once (status running, same worker and token, a new attempt opened), the same step again at :runnable_at (pending: a retry), or the end (succeeded or failed, with the failing step). No row back: the lease was taken over; roll back.
WITH m AS (
    UPDATE agent.runs SET
        status = CAST(:run_status AS VARCHAR),
        step = CAST(:next_step AS INT),
        failures = CAST(:failures AS INT),
        attempt = CASE WHEN CAST(:run_status AS VARCHAR) = 'running' THEN attempt + 1 ELSE attempt END,
        runnable_at = CAST(:runnable_at AS timestamp),
        heartbeat_at = CASE WHEN CAST(:run_status AS VARCHAR) = 'running' THEN CAST(:now AS timestamp) ELSE heartbeat_at END,
        lease_expires_at = CASE WHEN CAST(:run_status AS VARCHAR) = 'running' THEN CAST(:lease_until AS timestamp) END,
        finished_at = CASE WHEN CAST(:run_status AS VARCHAR) IN ('succeeded', 'failed') THEN CAST(:now AS timestamp) END,
        failed_step = COALESCE(CAST(:failed_step AS INT), failed_step,
                               CASE WHEN CAST(:run_status AS VARCHAR) = 'failed' THEN CAST(:step AS INT) END),
        last_error_number = :error_number,
        last_error = :error_message
    WHERE run_id = :run_id AND token = :token AND status = 'running'
    RETURNING run_id, token, status, step, attempt, failures, dequeue_count),
closed AS (
    UPDATE agent.attempts AS a SET outcome = :outcome, finished_at = CAST(:now AS timestamp), step = CAST(:step AS INT),
        error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message,
        output = :step_output
    FROM m WHERE a.run_id = m.run_id AND a.token = m.token AND a.attempt = CAST(:attempt AS INT) AND a.outcome = 'running'),
opened AS (
    INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome, step, target_database)
    SELECT m.run_id, m.attempt, m.token, CAST(:worker AS VARCHAR), m.dequeue_count, CAST(:now AS timestamp), 'running',
           m.step, CAST(:next_database AS VARCHAR)
    FROM m WHERE m.status = 'running')
SELECT run_id, status, step, attempt, failures FROM m;

-- record_attempt_output --
-- Keep what the server said while an attempt ran (messages, rows affected), in the transaction that closes it.
UPDATE agent.attempts SET output = :step_output
WHERE run_id = :run_id AND token = :token AND attempt = :attempt;

-- list_attempt_output --
-- The output of the attempts of the runs in a JSON array of run ids (history --output, --json).
SELECT a.run_id, a.attempt, a.output
FROM agent.attempts a
WHERE a.run_id IN (SELECT CAST(x AS BIGINT) FROM json_array_elements_text(CAST(:run_ids AS json)) AS x)
  AND a.output IS NOT NULL
ORDER BY a.run_id, a.attempt_id;

-- enqueue_notifications --
-- The notification outbox, in the transaction that ends runs: one row for each run it ended (finished at :now) whose outcome its job's NOTIFY asks for and that has a webhook (the job's, else :default_url); a run already notified is left alone (kind 'outcome': the alerts of the same run are other rows, raise_alerts).
INSERT INTO agent.notifications (run_id, job_name, outcome, url, status, attempts, created_at, next_attempt_at)
SELECT r.run_id, r.job_name, r.status, COALESCE(j.notify_webhook_url, CAST(:default_url AS VARCHAR)), 'pending', 0,
       CAST(:now AS timestamp), CAST(:now AS timestamp)
FROM agent.runs AS r
JOIN agent.jobs AS j ON j.job_name = r.job_name
WHERE r.finished_at = CAST(:now AS timestamp) AND r.status IN ('succeeded', 'failed', 'poisoned')
  AND COALESCE(j.notify_webhook_url, CAST(:default_url AS VARCHAR)) IS NOT NULL
  AND (COALESCE(j.notify, 'on_failure') = 'on_completion'
       OR (COALESCE(j.notify, 'on_failure') = 'on_success' AND r.status = 'succeeded')
       OR (COALESCE(j.notify, 'on_failure') = 'on_failure' AND r.status IN ('failed', 'poisoned')))
ON CONFLICT (run_id, kind) DO NOTHING;

-- start_follow_up_runs --
-- In the transaction that ends runs (each finished at :now): a run of every job that follows the job of a run it ended, when the end is the follower's AFTER_OUTCOME (succeeded: succeeded; failed: failed or poisoned; completed: any of them; a skipped or cancelled run starts nothing), pending and runnable now, with the chain's operation id and the run it followed; a disabled, invalid, removed or paused follower starts nothing. A follow-up of a job already in the ended run's chain of jobs (runs.chain), or past :max_chain_jobs jobs, is recorded skipped with the reason (note 'chain: ...'), and a job event 'follow_up_refused' says so once per reason and definition. The unique (followed_run_id, job_name) makes a second ending of the same run start nothing more. Two runs of one job ended together start one follow-up each, a millisecond apart (the (job_name, scheduled_for) key). (agent.start_follow_up_runs, a function of migrations 0010 and 0012: planned once per session.)
SELECT run_id, job_name, followed_run_id, operation_id, status, note FROM agent.start_follow_up_runs(CAST(:now AS TIMESTAMP), CAST(:max_chain_jobs AS INT));

-- claim_notifications --
-- Take up to :batch notifications due for delivery (new, a retry whose time came, or one whose sender died mid-way) under a new claim token, so that two processes never send the same one.
UPDATE agent.notifications AS n SET status = 'sending', claim_token = :claim_token,
    claimed_until = CAST(:claimed_until AS timestamp), attempts = n.attempts + 1
FROM (SELECT notification_id FROM agent.notifications
      WHERE (status = 'pending' AND next_attempt_at <= CAST(:now AS timestamp))
         OR (status = 'sending' AND claimed_until < CAST(:now AS timestamp))
      ORDER BY notification_id LIMIT :batch
      FOR UPDATE SKIP LOCKED) AS d
WHERE n.notification_id = d.notification_id
RETURNING n.notification_id, n.run_id, n.job_name, n.kind, n.outcome, n.detail, n.url, n.attempts, n.claim_token;

-- notification_runs --
-- What a notification says about its run (a JSON array of run ids): slot, outcome, failing step, error, when it first started and ended, operation id; and the latest failed attempt's error and step (a run its flow failed, quit_failure after a step that failed, keeps no error of its own).
SELECT r.run_id, r.job_name, r.scheduled_for, r.status, r.failed_step, r.last_error_number, r.last_error,
       r.finished_at, r.operation_id, r.followed_run_id,
       (SELECT MIN(a.started_at) FROM agent.attempts AS a WHERE a.run_id = r.run_id) AS first_started_at,
       (SELECT a.error_message FROM agent.attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC LIMIT 1) AS attempt_error,
       (SELECT a.error_number FROM agent.attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC LIMIT 1) AS attempt_error_number,
       (SELECT a.step FROM agent.attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC LIMIT 1) AS attempt_step
FROM agent.runs AS r
WHERE r.run_id IN (SELECT CAST(x AS BIGINT) FROM json_array_elements_text(CAST(:run_ids AS json)) AS x);

-- finish_notification --
-- Record one delivery attempt of a claimed notification (sent, to be retried at :next_attempt_at, or failed for good), only while the claim is still this sender's.
UPDATE agent.notifications SET status = CAST(:status AS VARCHAR), next_attempt_at = CAST(:next_attempt_at AS timestamp),
    sent_at = CASE WHEN CAST(:status AS VARCHAR) = 'sent' THEN CAST(:now AS timestamp) END, last_error = :last_error,
    claim_token = NULL, claimed_until = NULL
WHERE notification_id = :notification_id AND claim_token = :claim_token
RETURNING notification_id;

-- check_work_transaction --
-- Before the success of a job or step that worked in the agent's own transaction is recorded there: the job's SQL was refused before it ran if it had a COMMIT, ROLLBACK or the like at its top level (shared/control/transaction_control.py); here, in the completion's batch, the transaction must still be the one the job ran in (:work_transaction, its id, taken in the job's own batch by Store.run_script; NULL: nothing to compare), else an error (SQLSTATE AG002). (agent.check_work_transaction, a function of migration 0013.)
SELECT active FROM agent.check_work_transaction(CAST(:work_transaction AS BIGINT));

-- purge_notifications --
-- Retention, a bounded batch per tick (with purge_history): notifications delivered or given up older than AGENT_HISTORY_RETENTION_DAYS; one row back with the count.
WITH old AS (
    SELECT notification_id FROM agent.notifications
    WHERE status IN ('sent', 'failed', 'unsent') AND next_attempt_at < CAST(:history_before AS timestamp)
    ORDER BY notification_id LIMIT CAST(:batch AS INT)),
gone AS (
    DELETE FROM agent.notifications AS n USING old WHERE n.notification_id = old.notification_id
    RETURNING n.notification_id)
SELECT 'notifications' AS purged, COUNT(*) AS rows_purged FROM gone;
WITH old AS (
    SELECT firing_id FROM agent.alert_firings WHERE raised_at < CAST(:history_before AS timestamp)
    ORDER BY firing_id LIMIT CAST(:batch AS INT)),
gone AS (
    DELETE FROM agent.alert_firings AS f USING old WHERE f.firing_id = old.firing_id RETURNING f.firing_id)
SELECT 'alert firings' AS purged, COUNT(*) AS rows_purged FROM gone;

-- list_server_databases --
-- Fleet targets: the databases of this server, for server: members and db: globs (templates excluded; resolved at every run).
SELECT datname AS name FROM pg_catalog.pg_database WHERE NOT datistemplate ORDER BY datname;

-- list_pool_databases --
-- Fleet targets: the members of an elastic pool. PostgreSQL has no elastic pools (a pool: member is refused at sync); no rows.
SELECT CAST(NULL AS VARCHAR) AS name WHERE CAST(:pool AS VARCHAR) IS NULL AND FALSE;

-- fan_out_targets --
-- A run reached a fleet step (fenced by its token): it waits for its targets (no lease, no worker slot) and one execution per target database is created in one statement (a JSON array of {n, target_server, target_database}, n from 1), the first :parallelism let in, the others waiting for the window; execution n runnable from :now + (n - 1) * :stagger_seconds (TARGET_STAGGER_SECONDS), which the window keeps when it lets a waiting one in. No row back: the lease was taken over; roll back.
WITH p AS (
    UPDATE agent.runs SET awaiting_targets = 1, lease_expires_at = NULL, heartbeat_at = CAST(:now AS timestamp),
        target_parallelism = CAST(:parallelism AS INT),
        next_step_on_success = CAST(:next_on_success AS INT), next_step_on_failure = CAST(:next_on_failure AS INT),
        targets_total = COALESCE(targets_total, 0) + CAST(:target_count AS INT), targets_failed = COALESCE(targets_failed, 0)
    WHERE run_id = :run_id AND token = :token AND status = 'running'
    RETURNING run_id, token, operation_id, lease_seconds),
created AS (
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, target_server, overlap,
                            max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at, operation_id, note,
                            parent_run_id, parent_token, retry_interval_seconds, step, params)
    SELECT NULL, 'target', CAST(:now AS timestamp),
           CASE WHEN t.n <= CAST(:parallelism AS INT) THEN 'pending' ELSE 'waiting' END,
           CAST(:command AS TEXT), t.target_database, t.target_server, 'allow', CAST(:max_attempts AS INT),
           CAST(:timeout_seconds AS INT), p.lease_seconds,
           CAST(:now AS timestamp) + (t.n - 1) * CAST(:stagger_seconds AS INT) * INTERVAL '1 second', CAST(:now AS timestamp),
           p.operation_id, 'target of run ' || p.run_id || ', step ' || CAST(:step AS INT), p.run_id, p.token,
           CAST(:retry_interval_seconds AS INT), CAST(:step AS INT), CAST(:params AS TEXT)
    FROM p CROSS JOIN json_to_recordset(CAST(:targets AS json)) AS t(n INT, target_server VARCHAR, target_database VARCHAR)
    RETURNING run_id)
SELECT p.run_id, (SELECT COUNT(*) FROM created) AS created FROM p;

-- progress_fleets --
-- After an execution ended (:parent_run_id its run, :run_id at :token the execution, in the transaction that ends it) or at every tick (all NULL: every run waiting for its targets): the next waiting execution takes the ended one's place (no lock on the run); when none waits, and at ticks: cancel the executions of runs that no longer wait for them, let waiting executions in up to TARGET_PARALLELISM, and move on each run whose executions all ended (its next step runnable now, or its end). (agent.progress_fleets, a function of migration 0006, replaced in 0016 so that an execution let in keeps its staggered start: its statements run one after the other, the tail's under the runs' row locks.)
SELECT run_id, job_name, status, step, targets_total, targets_failed, last_error, operation_id
FROM agent.progress_fleets(CAST(:parent_run_id AS BIGINT), CAST(:run_id AS BIGINT), CAST(:token AS BIGINT), CAST(:now AS TIMESTAMP));

-- list_run_targets --
-- Fleet runs: the executions (one per target database and visit of a fleet step) of the runs in a JSON array of run ids, in one query whatever the number of runs and targets (history, the job and run pages; the runs_parent index serves it).
SELECT e.parent_run_id, e.parent_token, e.run_id, e.step, e.target_server, e.target_database, e.status, e.attempt,
       e.max_attempts, e.started_at, e.finished_at, e.last_error_number, e.last_error
FROM agent.runs e
WHERE e.parent_run_id IN (SELECT CAST(x.value AS BIGINT) FROM json_array_elements_text(CAST(:run_ids AS json)) AS x(value))
ORDER BY e.parent_run_id, e.run_id;

-- lock_starts --
-- Queue mode, first in a chain that ends with the hand-on dispatch: the start lock before any row (a completion that locked its rows, then waited for the start lock, deadlocked with a start holding the start lock and waiting for one of those rows: a run's last executions lock the run itself).
LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;

-- run_owner --
-- Whom a run's SQL runs as (migration 0007): a task's own owner (agent.exec_async), else its job's when a procedure defined the job (agent.add_scheduled_job; also its agent.start_job runs and fleet executions). No row: the agent's user, or AGENT_JOB_PRINCIPAL.
SELECT COALESCE(r.owner, j.owner) AS owner
FROM agent.runs r
LEFT JOIN agent.runs p ON p.run_id = r.parent_run_id
LEFT JOIN agent.jobs j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
WHERE r.run_id = :run_id;

-- session_identity --
-- The connection's backend process id (the SQL Server dialect asks for its session before a job; PostgreSQL cancels a statement itself).
SELECT pg_backend_pid() AS spid, CAST(NULL AS VARCHAR(10)) AS babelfish, CAST(session_user AS VARCHAR(128)) AS user_name;

-- lock_job_pauses --
-- The pauses lock for the rest of the transaction (exclusive): `pause` and `resume`, as agent.pause_job and agent.resume_job do; a tick's claim holds it shared (select_due_jobs).
SELECT pg_advisory_xact_lock(7428015) AS locked;

-- pause_job --
-- Pause a job the agent knows (no row: there is none): a pause in force keeps its start and takes the new end, paused_by and reason; one that ended is replaced. Under lock_job_pauses.
INSERT INTO agent.job_pauses AS x (job_name, paused_at, paused_until, paused_by, reason)
SELECT j.job_name, CAST(:now AS timestamp), CAST(:paused_until AS timestamp), CAST(:paused_by AS VARCHAR),
       CAST(:reason AS VARCHAR)
FROM agent.jobs AS j WHERE j.job_name = CAST(:job_name AS VARCHAR) AND j.configured = 1
ON CONFLICT (job_name) DO UPDATE SET
    paused_at = CASE WHEN x.paused_until IS NULL OR x.paused_until > EXCLUDED.paused_at THEN x.paused_at
                     ELSE EXCLUDED.paused_at END,
    paused_until = EXCLUDED.paused_until, paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason
RETURNING x.job_name, x.paused_at, x.paused_until, x.paused_by, x.reason;

-- settle_paused_runs --
-- After a pause changed (pause, a new --until, resume): decide again the job's scheduled slots that never started and that a pause decided or may decide, against the pause as it now stands, [:pause_start, :pause_end) (:pause_end NULL: until resumed; resume passes :now): held slots are recorded skipped 'paused', slots at or after its end run at their time (brought back if a pause had skipped them), and under run-once the last slot before a known end is the catch-up, runnable at the end. One row: how many runs it skipped, brought back, and made the catch-up. (agent.settle_paused_runs, a function of migration 0012, which agent.pause_job and agent.resume_job call too.) Under lock_job_pauses.
SELECT runs_skipped, runs_resumed, runs_caught_up
FROM agent.settle_paused_runs(CAST(:job_name AS VARCHAR), CAST(:now AS timestamp), CAST(:pause_start AS timestamp), CAST(:pause_end AS timestamp));

-- resume_job --
-- End a job's pause in force (no row: it is not paused); a pause that already ended is removed too. Under lock_job_pauses.
DELETE FROM agent.job_pauses AS x
WHERE x.job_name = CAST(:job_name AS VARCHAR)
RETURNING x.job_name, x.paused_at, x.paused_until,
          CASE WHEN x.paused_until IS NULL OR x.paused_until > CAST(:now AS timestamp) THEN 1 ELSE 0 END AS in_force;

-- stop_overdue_runs --
-- STOP_AFTER_SECONDS (issue 32 item 1), in the tick: every run of a job with the limit still running that long after its attempt started is stopped as `stop JOB` stops a run (stop_job: cancelled, the token bump fences the worker, whose lease renewal finds it gone and stops the work), with a note naming the limit. One statement whatever the number of jobs; a second tick racing finds the run no longer running.
UPDATE agent.runs AS r SET status = 'cancelled', token = r.token + 1, finished_at = CAST(:now AS timestamp),
    lease_expires_at = NULL,
    note = 'stopped: running longer than STOP_AFTER_SECONDS=' || j.stop_after_seconds || ' (since ' || to_char(r.started_at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')'
FROM agent.jobs AS j
WHERE j.job_name = r.job_name AND j.stop_after_seconds IS NOT NULL AND r.status = 'running'
  AND r.started_at <= CAST(:now AS timestamp) - j.stop_after_seconds * INTERVAL '1 second'
RETURNING r.run_id, r.job_name, r.scheduled_for, r.status, r.note, r.operation_id;

-- raise_alerts --
-- The alerts of issue 32 items 1-2, in one statement whatever the number of jobs, each written to the outbox at most once per (run, kind) by the unique index (a slot is one run: the unique (job, slot)), so ticks racing write it once: 'duration' (a run still running past MAX_DURATION_SECONDS since its attempt started), 'stopped' (a run STOP_AFTER_SECONDS stopped, ended since :since), 'slower' (a run running, or ended since :since, that took more than SLOWER_THAN times its job's p95: nearest rank over its last :history successful runs that ended before :since and were not told slower themselves, once it has :min_history), 'deadline' (a scheduled slot with no success within DEADLINE_SECONDS of it: failed, poisoned, stopped, still running, never started or skipped — not a slot its pause or calendar held, nor one a change of the job's definition skipped — whose deadline passed since :since). The runs that ended are looked up by their slot too, from :oldest_slot (the (job, slot) index: a run whose slot is older than that when it ends is not judged), never by a scan of all history. To the job's webhook, else :default_url; with neither, recorded 'unsent' (raised once, for telemetry; never claimed). Rows back: the alerts written now.
WITH recent AS (
    SELECT j.job_name, h.duration
    FROM agent.jobs AS j
    CROSS JOIN LATERAL (
        SELECT EXTRACT(EPOCH FROM (r.finished_at - r.started_at)) AS duration
        FROM agent.runs AS r
        WHERE r.job_name = j.job_name AND r.status = 'succeeded' AND r.started_at IS NOT NULL
          AND r.finished_at < CAST(:since AS timestamp)
          AND NOT EXISTS (SELECT 1 FROM agent.notifications AS n WHERE n.run_id = r.run_id AND n.kind = 'slower')
        ORDER BY r.scheduled_for DESC LIMIT CAST(:history AS INT)) AS h
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
    SELECT r.run_id, r.job_name, 'duration' AS kind, r.status AS outcome,
           'running for more than MAX_DURATION_SECONDS=' || j.max_duration_seconds || ' s (started '
               || to_char(r.started_at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')' AS detail
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.max_duration_seconds IS NOT NULL AND r.status = 'running'
      AND r.started_at <= CAST(:now AS timestamp) - j.max_duration_seconds * INTERVAL '1 second'
    UNION ALL
    SELECT r.run_id, r.job_name, 'stopped', r.status, r.note
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.stop_after_seconds IS NOT NULL AND r.status = 'cancelled' AND r.finished_at >= CAST(:since AS timestamp)
      AND r.scheduled_for >= CAST(:oldest_slot AS timestamp)
      AND r.note LIKE 'stopped: running longer than STOP_AFTER_SECONDS=%'
    UNION ALL
    SELECT r.run_id, r.job_name, 'slower', r.status,
           'took ' || ROUND(CAST(EXTRACT(EPOCH FROM (COALESCE(r.finished_at, CAST(:now AS timestamp)) - r.started_at)) AS NUMERIC), 1)
               || ' s, more than SLOWER_THAN=' || j.slower_than || ' x the p95 of its recent successful runs ('
               || ROUND(CAST(p.p95_seconds AS NUMERIC), 1) || ' s)'
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name JOIN p95 AS p ON p.job_name = r.job_name
    WHERE r.started_at IS NOT NULL AND p.p95_seconds > 0
      AND (r.status = 'running' OR (r.status IN ('succeeded', 'failed') AND r.finished_at >= CAST(:since AS timestamp)
                                     AND r.scheduled_for >= CAST(:oldest_slot AS timestamp)))
      AND EXTRACT(EPOCH FROM (COALESCE(r.finished_at, CAST(:now AS timestamp)) - r.started_at)) > j.slower_than * p.p95_seconds
    UNION ALL
    SELECT r.run_id, r.job_name, 'deadline', r.status,
           'no success within DEADLINE_SECONDS=' || j.deadline_seconds || ' s of the slot '
               || to_char(r.scheduled_for, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ': the run is ' || r.status
               || COALESCE(' (' || r.note || ')', '')
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.deadline_seconds IS NOT NULL AND r.kind = 'scheduled'
      AND r.scheduled_for <= CAST(:now AS timestamp) - j.deadline_seconds * INTERVAL '1 second'
      AND r.scheduled_for > CAST(:since AS timestamp) - j.deadline_seconds * INTERVAL '1 second'
      AND NOT (r.status = 'succeeded' AND r.finished_at <= r.scheduled_for + j.deadline_seconds * INTERVAL '1 second')
      AND NOT (r.status = 'skipped' AND (r.note LIKE 'paused%' OR r.note LIKE 'calendar:%' OR r.note LIKE 'skipped: the job%')))
INSERT INTO agent.notifications (run_id, job_name, kind, outcome, detail, url, status, attempts, created_at, next_attempt_at)
SELECT a.run_id, a.job_name, a.kind, a.outcome, a.detail,
       COALESCE(j.notify_webhook_url, CAST(:default_url AS VARCHAR), ''),
       CASE WHEN COALESCE(j.notify_webhook_url, CAST(:default_url AS VARCHAR)) IS NULL THEN 'unsent' ELSE 'pending' END,
       0, CAST(:now AS timestamp), CAST(:now AS timestamp)
FROM alerts AS a JOIN agent.jobs AS j ON j.job_name = a.job_name
ORDER BY a.run_id, a.kind
ON CONFLICT (run_id, kind) DO NOTHING
RETURNING notification_id, run_id, job_name, kind, outcome, detail, status;

-- next_alert_moment --
-- The earliest moment after :now at which raise_alerts (or stop_overdue_runs) may have something new to say, for a tick that sleeps until something is due: a running run reaching its MAX_DURATION_SECONDS or STOP_AFTER_SECONDS, a slot of a job with DEADLINE_SECONDS reaching its deadline (a slot claimed; one not yet claimed is at least the job's next slot plus its deadline). NULL: nothing pending. SLOWER_THAN is left out (its moment moves with the p95): while a run of a job with SLOWER_THAN is running, a tick that sleeps must still come each tick period (shared/engine/alerts.py, next_alert_moment).
SELECT MIN(moment) AS next_alert_at FROM (
    SELECT r.started_at + j.max_duration_seconds * INTERVAL '1 second' AS moment
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.max_duration_seconds IS NOT NULL AND r.status = 'running'
      AND r.started_at + j.max_duration_seconds * INTERVAL '1 second' > CAST(:now AS timestamp)
    UNION ALL
    SELECT r.started_at + j.stop_after_seconds * INTERVAL '1 second'
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.stop_after_seconds IS NOT NULL AND r.status = 'running'
      AND r.started_at + j.stop_after_seconds * INTERVAL '1 second' > CAST(:now AS timestamp)
    UNION ALL
    SELECT r.scheduled_for + j.deadline_seconds * INTERVAL '1 second'
    FROM agent.runs AS r JOIN agent.jobs AS j ON j.job_name = r.job_name
    WHERE j.deadline_seconds IS NOT NULL AND r.kind = 'scheduled' AND r.status <> 'succeeded'
      AND r.scheduled_for + j.deadline_seconds * INTERVAL '1 second' > CAST(:now AS timestamp)
    UNION ALL
    SELECT j.next_due_at + j.deadline_seconds * INTERVAL '1 second'
    FROM agent.jobs AS j
    WHERE j.deadline_seconds IS NOT NULL AND j.next_due_at IS NOT NULL AND j.enabled = 1 AND j.valid = 1) AS m;

-- quiet_horizon --
-- What a quiet tick needs to know (shared/engine/quiet.py): the earliest time anything in the control database can come due: a job's next slot, a pending run (a retry, a delayed or held run), a lease in flight (its expiry), a pause's end, a notification's next delivery; and whether anything is due now or a fleet run waits (then every tick connects). One statement, whatever the job count.
SELECT (SELECT MIN(next_due_at) FROM agent.jobs WHERE next_due_at IS NOT NULL) AS next_slot_at,
       (SELECT MIN(runnable_at) FROM agent.runs WHERE status = 'pending') AS next_runnable_at,
       (SELECT MIN(lease_expires_at) FROM agent.runs WHERE status IN ('queued', 'running')) AS next_lease_at,
       (SELECT COUNT(*) FROM agent.runs WHERE status IN ('queued', 'running') AND lease_expires_at IS NULL) AS unleased,
       (SELECT COUNT(*) FROM agent.runs WHERE status = 'waiting') AS waiting,
       (SELECT MIN(paused_until) FROM agent.job_pauses WHERE paused_until > CAST(:now AS timestamp)) AS next_pause_end_at,
       (SELECT MIN(CASE WHEN status = 'sending' THEN claimed_until ELSE next_attempt_at END) FROM agent.notifications
        WHERE status IN ('pending', 'sending')) AS next_notification_at,
       (SELECT MIN(CASE WHEN a.valid IS NULL THEN CAST(:now AS timestamp)
                        WHEN a.probe_query IS NOT NULL THEN COALESCE(a.next_check_at, CAST(:now AS timestamp))
                        WHEN EXISTS (SELECT 1 FROM agent.attempts AS t WHERE t.finished_at > a.checked_until
                                     AND t.outcome NOT IN ('running', 'succeeded')) THEN CAST(:now AS timestamp) END)
        FROM agent.alerts AS a WHERE a.enabled = 1 AND (a.valid IS NULL OR a.valid = 1)) AS next_condition_alert_at;

-- token_context --
-- What a run's SQL Agent tokens need besides the run (shared/jobs/tokens.py): its job's name (a fleet execution's through its run) and time zone. Read only for a command that has a token.
SELECT COALESCE(r.job_name, p.job_name) AS job_name, j.timezone
FROM agent.runs AS r
LEFT JOIN agent.runs AS p ON p.run_id = r.parent_run_id
LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name)
WHERE r.run_id = CAST(:run_id AS BIGINT);

-- sync_settings_alerts --
-- Condition alerts from the settings (a JSON array of {alert_name, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify, notify_webhook_url, response_job, enabled, valid, config_error}): each written as source 'settings', checked again by the next tick when its definition changed (valid NULL), its counters and times kept; a name an alert defined with agent.add_alert holds is left to that alert; settings alerts no longer in the settings are removed. Returns the names a database alert holds.
INSERT INTO agent.alerts (alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds,
                          notify, notify_webhook_url, response_job, enabled, valid, config_error, created_at, updated_at)
SELECT x.alert_name, 'settings', NULL, x.probe_query, x.schedule, x.timezone, x.errors, x.timeout_seconds, x.delay_seconds,
       x.notify, x.notify_webhook_url, x.response_job, x.enabled, CASE WHEN x.valid = 0 THEN 0 END, x.config_error,
       CAST(:now AS timestamp), CAST(:now AS timestamp)
FROM json_to_recordset(CAST(:alerts AS json)) AS x(alert_name VARCHAR, probe_query TEXT, schedule VARCHAR, timezone VARCHAR,
                                                   errors VARCHAR, timeout_seconds INT, delay_seconds INT, notify INT,
                                                   notify_webhook_url VARCHAR, response_job VARCHAR, enabled INT, valid INT,
                                                   config_error TEXT)
ORDER BY x.alert_name
ON CONFLICT (alert_name) DO UPDATE SET
    probe_query = excluded.probe_query, schedule = excluded.schedule, timezone = excluded.timezone, errors = excluded.errors,
    timeout_seconds = excluded.timeout_seconds, delay_seconds = excluded.delay_seconds, notify = excluded.notify,
    notify_webhook_url = excluded.notify_webhook_url, response_job = excluded.response_job, enabled = excluded.enabled,
    valid = excluded.valid, config_error = excluded.config_error, next_check_at = NULL, updated_at = CAST(:now AS timestamp)
WHERE agent.alerts.source = 'settings'
  AND (agent.alerts.probe_query IS DISTINCT FROM excluded.probe_query OR agent.alerts.schedule IS DISTINCT FROM excluded.schedule
       OR agent.alerts.timezone IS DISTINCT FROM excluded.timezone OR agent.alerts.errors IS DISTINCT FROM excluded.errors
       OR agent.alerts.timeout_seconds IS DISTINCT FROM excluded.timeout_seconds
       OR agent.alerts.delay_seconds IS DISTINCT FROM excluded.delay_seconds
       OR agent.alerts.notify IS DISTINCT FROM excluded.notify
       OR agent.alerts.notify_webhook_url IS DISTINCT FROM excluded.notify_webhook_url
       OR agent.alerts.response_job IS DISTINCT FROM excluded.response_job OR agent.alerts.enabled IS DISTINCT FROM excluded.enabled
       OR agent.alerts.config_error IS DISTINCT FROM excluded.config_error OR agent.alerts.valid = 0);
DELETE FROM agent.alerts WHERE source = 'settings'
  AND alert_name NOT IN (SELECT x.alert_name FROM json_to_recordset(CAST(:alerts AS json)) AS x(alert_name VARCHAR));
SELECT a.alert_name FROM agent.alerts AS a
WHERE a.source = 'database' AND lower(a.alert_name) IN (SELECT lower(x.alert_name) FROM json_to_recordset(CAST(:alerts AS json)) AS x(alert_name VARCHAR));

-- select_alert_work --
-- The condition alerts a tick looks at (shared/engine/condition_alerts.py): every enabled alert not yet checked (valid NULL), every valid probe due at :now, and every valid ERRORS alert (each tick reads the failures since its last check). One statement, whatever the number of alerts.
SELECT alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify,
       notify_webhook_url, response_job, valid, next_check_at, checked_until, updated_at
FROM agent.alerts
WHERE enabled = 1 AND (valid IS NULL OR (valid = 1 AND (errors IS NOT NULL OR next_check_at IS NULL
                                                       OR next_check_at <= CAST(:now AS timestamp))))
ORDER BY alert_name;

-- claim_alert_checks --
-- Claim this tick's checks (a JSON array of {alert_name, seen_check_at, updated_at, next_check_at, valid, config_error}): each alert's next check moves on (and a definition checked records valid and why not), only where no other tick moved it since it was read and the definition is the one read; the alerts returned are this tick's to check. An ERRORS alert starts watching the failures from its first check. Locked in name order (racing ticks never deadlock).
UPDATE agent.alerts AS a SET next_check_at = CAST(c.next_check_at AS timestamp), valid = c.valid, config_error = c.config_error,
    checked_until = CASE WHEN c.valid = 1 THEN COALESCE(a.checked_until, CAST(:now AS timestamp)) END
FROM (SELECT x.alert_name, v.seen_check_at, v.updated_at, v.next_check_at, v.valid, v.config_error
      FROM agent.alerts AS x
      JOIN json_to_recordset(CAST(:checks AS json)) AS v(alert_name VARCHAR, seen_check_at VARCHAR, updated_at VARCHAR,
                                                         next_check_at VARCHAR, valid INT, config_error TEXT)
        ON x.alert_name = v.alert_name
      ORDER BY x.alert_name FOR UPDATE OF x) AS c
WHERE a.alert_name = c.alert_name AND a.updated_at = CAST(c.updated_at AS timestamp)
  AND a.next_check_at IS NOT DISTINCT FROM CAST(c.seen_check_at AS timestamp)
RETURNING a.alert_name, a.valid, a.checked_until;

-- alert_failures --
-- The attempts that failed with an error after :since and up to :now, oldest first, at most :limit (ERRORS alerts: shared/engine/condition_alerts.py matches each against each alert's list). One indexed range read; started_by_alert: the alert whose response started the run (its own response's failure does not trigger that alert again).
SELECT a.attempt_id, a.run_id, r.job_name, a.finished_at, a.outcome, a.error_number, a.error_sqlstate,
       left(a.error_message, 400) AS error_message,
       (SELECT MIN(f.alert_name) FROM agent.alert_firings AS f WHERE f.response_run_id = a.run_id) AS started_by_alert
FROM agent.attempts AS a JOIN agent.runs AS r ON r.run_id = a.run_id
WHERE a.finished_at > CAST(:since AS timestamp) AND a.finished_at <= CAST(:now AS timestamp)
  AND a.outcome NOT IN ('running', 'succeeded') AND a.error_message IS NOT NULL
ORDER BY a.finished_at, a.attempt_id LIMIT CAST(:limit AS INT);

-- record_alert_results --
-- What this tick's checks found (a JSON array of {alert_name, triggered, error, checked_until, next_response_at}), in one statement: counts and times of occurrences; the probe's error (error_since: when it started failing); the failures looked at; and a response where one occurred and the delay since the last response has passed (next_response_at <= :now). Returns each alert with fired 1 when this check responds, and failing 1 when its probe has just started failing.
UPDATE agent.alerts AS a SET
    last_checked_at = CAST(:now AS timestamp),
    last_error = r.error,
    error_since = CASE WHEN r.error IS NULL THEN NULL ELSE COALESCE(a.error_since, CAST(:now AS timestamp)) END,
    occurrences = a.occurrences + r.triggered,
    last_occurred_at = CASE WHEN r.triggered = 1 THEN CAST(:now AS timestamp) ELSE a.last_occurred_at END,
    checked_until = COALESCE(CAST(r.checked_until AS timestamp), a.checked_until),
    last_response_at = CASE WHEN r.triggered = 1 AND (a.next_response_at IS NULL OR a.next_response_at <= CAST(:now AS timestamp))
                            THEN CAST(:now AS timestamp) ELSE a.last_response_at END,
    responses = a.responses + CASE WHEN r.triggered = 1 AND (a.next_response_at IS NULL OR a.next_response_at <= CAST(:now AS timestamp))
                                   THEN 1 ELSE 0 END,
    next_response_at = CASE WHEN r.triggered = 1 AND (a.next_response_at IS NULL OR a.next_response_at <= CAST(:now AS timestamp))
                            THEN CAST(r.next_response_at AS timestamp) ELSE a.next_response_at END
FROM json_to_recordset(CAST(:results AS json)) AS r(alert_name VARCHAR, triggered INT, error TEXT, checked_until VARCHAR,
                                                    next_response_at VARCHAR)
WHERE a.alert_name = r.alert_name
RETURNING a.alert_name, CASE WHEN a.last_response_at = CAST(:now AS timestamp) THEN 1 ELSE 0 END AS fired,
          CASE WHEN a.last_error IS NOT NULL AND a.error_since = CAST(:now AS timestamp) THEN 1 ELSE 0 END AS failing;

-- insert_alert_firings --
-- The responses of this tick (a JSON array of {alert_name, kind, detail, url, notify}): one row of agent.alert_firings each and, when it notifies, its notification in the outbox (run_id: the firing's id, kind 'condition', 'errors' or 'alert_error'; with no webhook, recorded 'unsent'). Returns each firing.
WITH x AS (SELECT * FROM json_to_recordset(CAST(:firings AS json)) AS v(alert_name VARCHAR, kind VARCHAR, detail TEXT,
                                                                       url VARCHAR, notify INT)),
f AS (INSERT INTO agent.alert_firings (alert_name, kind, raised_at, detail)
      SELECT x.alert_name, x.kind, CAST(:now AS timestamp), x.detail FROM x
      RETURNING firing_id, alert_name, kind, detail),
n AS (INSERT INTO agent.notifications (run_id, job_name, outcome, url, status, attempts, created_at, next_attempt_at, kind, detail)
      SELECT f.firing_id, f.alert_name, 'alert', COALESCE(x.url, ''), CASE WHEN x.url IS NULL THEN 'unsent' ELSE 'pending' END,
             0, CAST(:now AS timestamp), CAST(:now AS timestamp), f.kind, f.detail
      FROM f JOIN x ON x.alert_name = f.alert_name AND x.kind = f.kind
      WHERE x.notify = 1
      ON CONFLICT (run_id, kind) DO NOTHING)
SELECT firing_id, alert_name, kind FROM f ORDER BY firing_id;

-- set_alert_response --
-- The run a firing started (RESPONSE_JOB), or why none was started.
UPDATE agent.alert_firings SET response_run_id = CAST(:run_id AS BIGINT), response_error = CAST(:response_error AS TEXT)
WHERE firing_id = CAST(:firing_id AS BIGINT);

-- list_alerts --
-- sql-agent alerts and the monitor: every condition alert with its state, by name.
SELECT alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify,
       notify_webhook_url, response_job, enabled, valid, config_error, next_check_at, last_checked_at, last_occurred_at,
       last_response_at, next_response_at, occurrences, responses, last_error, error_since, updated_at
FROM agent.alerts ORDER BY alert_name;

-- list_alert_firings --
-- The latest responses of condition alerts (optionally of one alert), newest first.
SELECT firing_id, alert_name, kind, raised_at, detail, response_run_id, response_error
FROM agent.alert_firings WHERE (CAST(:alert_name AS VARCHAR) IS NULL OR alert_name = CAST(:alert_name AS VARCHAR))
ORDER BY firing_id DESC LIMIT CAST(:limit AS INT);

-- set_probe_timeout --
-- A condition alert's probe stops after its TIMEOUT_SECONDS (statement_timeout, this transaction only: the probe's transaction is always rolled back).
SELECT pg_catalog.set_config('statement_timeout', CAST(:timeout_ms AS text), true) AS timeout_ms;

-- prepare_probe --
-- Where a probe's rows are put (SQL Server: a temporary table). PostgreSQL's probe writes them to a setting of its transaction: nothing to do here.
SELECT 1 AS prepared WHERE 1 = 0;

-- probe_rows --
-- A probe's rows: the JSON array the probe's SELECT wrote to the setting agent.probe_rows of its transaction (shared/engine/condition_alerts.py).
SELECT pg_catalog.current_setting('agent.probe_rows', true) AS rows_json;

-- probe_read_only --
-- A condition alert's probe run as the agent itself: its transaction is read-only from the first statement (PostgreSQL); SQLite sets query_only on the probe's connection instead, SQL Server relies on the rollback.
SET TRANSACTION READ ONLY;

-- get_job_definition --
-- One job as agent.add_scheduled_job's arguments hold it (the monitor's job form, issue 32 item 6: an edit starts from what is defined), with where it is defined and its owner.
SELECT j.job_name, j.schedule, j.timezone, j.command, j.target_database, j.enabled, j.max_attempts, j.timeout_seconds,
       j.lease_seconds, j.misfire, j.grace_seconds, j.overlap, j.requested_targets, j.requested_target_parallelism,
       COALESCE(j.requested_target_stagger_seconds, 0) AS requested_target_stagger_seconds, j.after_job, j.after_outcome,
       COALESCE(j.catchup_seconds, 0) AS catchup_seconds, j.owner, j.defined_in_database, j.configured, j.valid,
       j.config_error, j.calendars, j.jitter_seconds,
       j.requested_steps
FROM agent.jobs j
WHERE j.job_name = CAST(:job_name AS VARCHAR);

-- define_job --
-- The monitor's job form (issue 32 item 6): agent.add_scheduled_job's body (agent.add_scheduled_job_unaudited, migration 0024: its checks, its refusals, its redefinition of a job of the same name) with every argument, in the caller's transaction. The monitor writes the audit row itself (source monitor, the signed-in principal) and the owner (set_job_owner) in the same transaction; the audited function would record the agent's own login for both.
SELECT d.job_name, d.action
FROM agent.add_scheduled_job_unaudited(CAST(:job_name AS varchar), CAST(:sql AS text), CAST(:schedule AS varchar),
    CAST(:run_at AS timestamptz), CAST(:timezone AS varchar), CAST(:enabled AS int), CAST(:max_attempts AS int),
    CAST(:timeout_seconds AS int), CAST(:overlap AS varchar), CAST(:database AS varchar), CAST(:misfire AS varchar),
    CAST(:grace_seconds AS int), CAST(:lease_seconds AS int), CAST(:targets AS varchar), CAST(:target_parallelism AS int),
    CAST(:after AS varchar), CAST(:after_outcome AS varchar), CAST(:target_stagger_seconds AS int),
    CAST(:catchup_seconds AS int)) AS d;

-- remove_job --
-- The monitor's job form: agent.remove_scheduled_job's body (agent.remove_scheduled_job_unaudited: a job defined in the database only; its claimed slots skipped) in the caller's transaction, audited by the monitor.
SELECT d.job_name, d.skipped_runs FROM agent.remove_scheduled_job_unaudited(CAST(:job_name AS varchar)) AS d;

-- set_job_owner --
-- Whom a job defined from the monitor runs as: the signed-in principal, as the monitor names it (the procedure recorded the agent's own login, the caller of its connection), in the transaction that defined it.
UPDATE agent.jobs SET owner = CAST(:owner AS VARCHAR) WHERE job_name = CAST(:job_name AS VARCHAR) AND defined_in_database = 1;

-- set_job_steps --
-- The monitor's job form: agent.set_job_steps's body (agent.set_job_steps_unaudited, migration 0028: a database job's steps as requested, NULL or '[]' clears them; the engine's planning checks them) in the transaction that defined the job and made the signed-in principal its owner, audited by the monitor as part of that 'define'.
SELECT s.job, s.requested_steps FROM agent.set_job_steps_unaudited(CAST(:job_name AS varchar), CAST(:steps AS text)) AS s;
