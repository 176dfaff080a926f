-- Named queries for SQLite (the embedded default, standard library sqlite3).
-- Format: "-- name --", a one-line description, then the query. Parameters are :name.
-- Timestamps are UTC text 'YYYY-MM-DD HH:MM:SS.SSS', always passed in; interval
-- arithmetic goes through julianday() and back with strftime('%Y-%m-%d %H:%M:%f').
-- Writers are serialised by SQLite itself (transactions start with BEGIN IMMEDIATE),
-- which is why there is no FOR UPDATE SKIP LOCKED here.

-- bootstrap_schema --
-- Create the schema version table if missing (SQLite's write lock serialises concurrent init-db runs).
CREATE TABLE IF NOT EXISTS agent_schema_version (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  TEXT NOT NULL
);
SELECT 1 AS locked;

-- release_migration_lock --
-- SQLite serialises writers already (BEGIN IMMEDIATE); no lock to release.
SELECT 1 AS released;

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

-- claim_state --
-- Set one engine state value only if it is new or larger than the stored one (text order); a row back means this caller won (e.g. the one doorbell chain of a tick period).
INSERT INTO agent_state (state_key, state_value, updated_at)
VALUES (:state_key, :state_value, :now)
ON CONFLICT (state_key) DO UPDATE SET state_value = excluded.state_value, updated_at = excluded.updated_at
WHERE agent_state.state_value < excluded.state_value
RETURNING state_key;

-- server_version --
-- The embedded engine's version (doctor).
SELECT 'SQLite ' || sqlite_version() AS server_version;

-- database_time --
-- The database's clock (UTC): the agent's one clock; for the embedded SQLite file, the clock of the machine that owns the file.
SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS server_now;

-- record_config_events --
-- Record each job whose configuration became invalid (or changed its error) since the last sync.
INSERT INTO agent_job_events (job_name, event_at, kind, detail)
SELECT json_extract(j.value, '$.job_name'), :now, 'config_invalid', json_extract(j.value, '$.config_error')
FROM json_each(:jobs) AS j
WHERE json_extract(j.value, '$.valid') = 0
  AND NOT EXISTS (SELECT 1 FROM agent_jobs c
                  WHERE c.job_name = json_extract(j.value, '$.job_name') AND c.valid = 0
                    AND c.configured = 1 AND c.config_error = json_extract(j.value, '$.config_error'));

-- skip_runs_of_changed_jobs --
-- Slots claimed ahead for a job whose schedule or time zone changed, or that was disabled, became invalid or was removed, are recorded skipped instead of run (and so are the slots ahead a pause had recorded skipped: a resume must not bring back a slot of the old settings). A job whose calendars (EXCLUDE, ONLY, ON_EXCLUDED: the calendars JSON) or JITTER_SECONDS changed has its never-started scheduled runs keyed from its new next slot on (next_due_at, which upsert_jobs moves back to it) recorded skipped the same way: the claim plans them again under the new rules (a run keyed as before is taken back in place), so a run is neither duplicated under a new jitter nor left at a time a new calendar excludes. A run keyed before that slot stands for an earlier slot (a jittered run stays before the schedule's next slot) and is left as it is. A job with no next slot left (a one-time job once claimed, a schedule past its `until`) has its run not yet due and not held by a pause recorded skipped; upsert_jobs then has it decided again from its slot, or from now when that has passed; a run that came, ran or was skipped for good stands. A run a calendar moved (note '...; moved from ...'), not yet due, is recorded skipped whatever its key, with a note of its own ('... after a calendar moved this run here'), by which upsert_jobs has the job decided again from now: the slot it stood for is decided under the new calendars.
-- The changed jobs first (MATERIALIZED: the settings read once, not once per run), then their runs by the (job_name, scheduled_for) index.
WITH given AS MATERIALIZED (
    SELECT json_extract(j.value, '$.job_name') AS job_name, json_extract(j.value, '$.valid') AS valid,
           json_extract(j.value, '$.enabled') AS enabled, json_extract(j.value, '$.schedule') AS schedule,
           json_extract(j.value, '$.timezone') AS timezone, json_extract(j.value, '$.calendars') AS calendars,
           COALESCE(json_extract(j.value, '$.jitter_seconds'), 0) AS jitter_seconds,
           json_extract(j.value, '$.next_due_at') AS next_due_at
    FROM json_each(:jobs) AS j),
x AS MATERIALIZED (
    SELECT c.job_name,
           CASE WHEN n.valid = 0 THEN 'skipped: the job''s settings became invalid after this slot was claimed'
                WHEN n.enabled = 0 THEN 'skipped: the job was disabled after this slot was claimed'
                ELSE 'skipped: the job''s schedule or time zone changed after this slot was claimed' END AS note,
           NULL AS since, 0 AS open_only
    FROM given AS n
    CROSS JOIN agent_jobs AS c
    WHERE c.job_name = n.job_name AND c.configured = 1 AND c.defined_in_database = 0
      AND (n.valid = 0 OR n.enabled = 0 OR n.schedule <> c.schedule OR n.timezone <> c.timezone)
    UNION ALL
    SELECT c.job_name, 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed',
           -- A job with no next slot left (a one-time job once claimed, a schedule past its
           -- `until`): its run not yet due and not held by a pause (one a calendar moved); one that
           -- came, ran, or was skipped or paused stands.
           CASE WHEN c.next_due_at IS NULL THEN :now ELSE n.next_due_at END,
           CASE WHEN c.next_due_at IS NULL THEN 1 ELSE 0 END
    FROM given AS n
    CROSS JOIN agent_jobs AS c
    WHERE c.job_name = n.job_name AND c.configured = 1 AND c.defined_in_database = 0
      AND n.valid = 1 AND n.enabled = 1 AND n.schedule = c.schedule AND n.timezone = c.timezone
      AND (n.next_due_at IS NOT NULL OR c.next_due_at IS NULL)
      AND (n.calendars IS NOT c.calendars OR n.jitter_seconds <> c.jitter_seconds)
    UNION ALL
    SELECT c.job_name, 'skipped: the job was removed from the settings after this slot was claimed', NULL, 0
    FROM agent_jobs AS c
    WHERE c.configured = 1 AND c.defined_in_database = 0 AND c.job_name NOT IN (SELECT g.job_name FROM given AS g))
UPDATE agent_runs SET status = 'skipped', finished_at = :now, lease_expires_at = NULL,
    note = CASE WHEN x.since IS NOT NULL AND agent_runs.note LIKE '%; moved from %' THEN 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here' ELSE x.note END
FROM x
WHERE agent_runs.job_name = x.job_name AND agent_runs.kind IN ('scheduled', 'backfill')
  AND (agent_runs.status IN ('pending', 'queued')
       OR (agent_runs.status = 'skipped' AND agent_runs.note = 'paused' AND agent_runs.attempt = 0
           AND agent_runs.scheduled_for >= :now))
  AND (x.since IS NULL
       OR (agent_runs.kind = 'scheduled' AND agent_runs.attempt = 0
           AND ((agent_runs.scheduled_for >= x.since AND (x.open_only = 0 OR agent_runs.status IN ('pending', 'queued')))
                -- A run a calendar moved, not yet due, keyed before that slot (a freeze extended
                -- over the time an earlier slot moved to): decided again from now.
                OR (x.open_only = 0 AND agent_runs.status IN ('pending', 'queued') AND agent_runs.scheduled_for >= :now
                    AND agent_runs.note LIKE '%; moved from %'))))
RETURNING run_id, job_name, scheduled_for, status, note, operation_id;

-- upsert_jobs --
-- Write every configured job in one statement; a new job, a changed schedule or time zone, or a job re-enabled starts from its new next_due_at. A job whose definition (definition_hash: every setting the sync writes, from shared/engine/scheduler.py) is what the last sync wrote is left as it is: its updated_at stays the time its definition last changed (the follow-up refusals are told once per definition from it).
INSERT INTO agent_jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                        config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                        grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                        steps, notify, notify_webhook_url, after_job, after_outcome, calendars, jitter_seconds,
                        max_duration_seconds, stop_after_seconds, slower_than, deadline_seconds, catchup_seconds, definition_hash, params)
SELECT json_extract(j.value, '$.job_name'), json_extract(j.value, '$.schedule'),
       json_extract(j.value, '$.timezone'), json_extract(j.value, '$.command'),
       json_extract(j.value, '$.target_database'), json_extract(j.value, '$.enabled'),
       json_extract(j.value, '$.valid'), json_extract(j.value, '$.config_error'),
       json_extract(j.value, '$.max_attempts'), json_extract(j.value, '$.timeout_seconds'),
       json_extract(j.value, '$.lease_seconds'), json_extract(j.value, '$.misfire'),
       json_extract(j.value, '$.grace_seconds'), json_extract(j.value, '$.overlap'),
       json_extract(j.value, '$.next_due_at'), :now, 1, :now,
       json_extract(j.value, '$.steps'), json_extract(j.value, '$.notify'),
       json_extract(j.value, '$.notify_webhook_url'), json_extract(j.value, '$.after_job'),
       json_extract(j.value, '$.after_outcome'), json_extract(j.value, '$.calendars'),
       COALESCE(json_extract(j.value, '$.jitter_seconds'), 0),
       json_extract(j.value, '$.max_duration_seconds'), json_extract(j.value, '$.stop_after_seconds'),
       json_extract(j.value, '$.slower_than'), json_extract(j.value, '$.deadline_seconds'),
       COALESCE(json_extract(j.value, '$.catchup_seconds'), 0),
       json_extract(j.value, '$.definition_hash'),
       json_extract(j.value, '$.params')
FROM json_each(:jobs) AS j
WHERE TRUE
ON CONFLICT (job_name) DO UPDATE SET
    next_due_at = CASE
        WHEN agent_jobs.schedule <> excluded.schedule
          OR agent_jobs.timezone <> excluded.timezone
          OR agent_jobs.enabled <> excluded.enabled
          OR agent_jobs.valid <> excluded.valid
          OR agent_jobs.configured = 0
        THEN excluded.next_due_at
        -- Calendars or jitter changed: back to the new next slot (the runs claimed ahead from it
        -- on were recorded skipped by skip_runs_of_changed_jobs), never past a slot not yet claimed;
        -- a job with no next slot left (a one-time job once claimed) whose run not yet due (one a
        -- calendar moved) skip_runs_of_changed_jobs just recorded skipped is decided again. Never
        -- before now: a one-time job's slot that has passed is not a missed slot then.
        WHEN (agent_jobs.calendars IS NOT excluded.calendars OR agent_jobs.jitter_seconds <> excluded.jitter_seconds)
          AND excluded.next_due_at IS NOT NULL AND agent_jobs.next_due_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = :now
                        AND o.note = 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here')
        THEN :now
        WHEN (agent_jobs.calendars IS NOT excluded.calendars OR agent_jobs.jitter_seconds <> excluded.jitter_seconds)
          AND excluded.next_due_at IS NOT NULL AND agent_jobs.next_due_at IS NOT NULL AND excluded.next_due_at < agent_jobs.next_due_at
        THEN MAX(excluded.next_due_at, :now)
        WHEN (agent_jobs.calendars IS NOT excluded.calendars OR agent_jobs.jitter_seconds <> excluded.jitter_seconds)
          AND agent_jobs.next_due_at IS NULL
          AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = :now
                        AND o.note IN ('skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed', 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'))
        THEN MAX(COALESCE(excluded.next_due_at, :now), :now) ELSE agent_jobs.next_due_at END,
    advanced_at = CASE
        WHEN agent_jobs.schedule <> excluded.schedule
          OR agent_jobs.timezone <> excluded.timezone
          OR agent_jobs.enabled <> excluded.enabled
          OR agent_jobs.valid <> excluded.valid
          OR agent_jobs.configured = 0
        THEN excluded.advanced_at
        WHEN (agent_jobs.calendars IS NOT excluded.calendars OR agent_jobs.jitter_seconds <> excluded.jitter_seconds)
          AND excluded.next_due_at IS NOT NULL AND agent_jobs.next_due_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = :now
                        AND o.note = 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here')
        THEN excluded.advanced_at
        WHEN (agent_jobs.calendars IS NOT excluded.calendars OR agent_jobs.jitter_seconds <> excluded.jitter_seconds)
          AND excluded.next_due_at IS NOT NULL AND agent_jobs.next_due_at IS NOT NULL AND excluded.next_due_at < agent_jobs.next_due_at
        THEN excluded.advanced_at
        WHEN (agent_jobs.calendars IS NOT excluded.calendars OR agent_jobs.jitter_seconds <> excluded.jitter_seconds)
          AND agent_jobs.next_due_at IS NULL
          AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name AND o.status = 'skipped'
                        AND o.finished_at = :now
                        AND o.note IN ('skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after this slot was claimed', 'skipped: the job''s calendars, ON_EXCLUDED or JITTER_SECONDS changed after a calendar moved this run here'))
        THEN excluded.advanced_at ELSE agent_jobs.advanced_at END,
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
    defined_in_database = 0,
    needs_planning = 0,
    updated_at = excluded.updated_at,
    steps = excluded.steps,
    notify = excluded.notify,
    notify_webhook_url = excluded.notify_webhook_url,
    after_job = excluded.after_job,
    after_outcome = excluded.after_outcome,
    calendars = excluded.calendars,
    jitter_seconds = excluded.jitter_seconds,
    max_duration_seconds = excluded.max_duration_seconds,
    stop_after_seconds = excluded.stop_after_seconds,
    slower_than = excluded.slower_than,
    deadline_seconds = excluded.deadline_seconds,
    catchup_seconds = excluded.catchup_seconds,
    definition_hash = excluded.definition_hash,
    params = excluded.params
-- Never over a job defined in the database (the sync renamed such rows; this guards the rule).
WHERE agent_jobs.configured = 0
   OR (agent_jobs.defined_in_database = 0 AND agent_jobs.definition_hash IS NOT excluded.definition_hash);

-- refresh_runs_of_changed_jobs --
-- Runs claimed ahead that never started (pending or queued, attempt 0) of a settings job whose schedule, time zone and enabled state stand but whose other settings changed take the new ones (command, database, overlap, attempts, timeout, lease, steps): a slot after the change runs what the settings say now, not what they said when it was claimed. Before upsert_jobs (it compares with the job as stored).
-- The changed jobs first (MATERIALIZED: the settings read once, not once per run), then their runs by the (job_name, scheduled_for) index.
WITH x AS MATERIALIZED (
    SELECT c.job_name, json_extract(j.value, '$.command') AS command,
           json_extract(j.value, '$.target_database') AS target_database, json_extract(j.value, '$.overlap') AS overlap,
           json_extract(j.value, '$.max_attempts') AS max_attempts,
           json_extract(j.value, '$.timeout_seconds') AS timeout_seconds,
           json_extract(j.value, '$.lease_seconds') AS lease_seconds, json_extract(j.value, '$.steps') AS steps
    FROM json_each(:jobs) AS j
    CROSS JOIN agent_jobs AS c
    WHERE c.job_name = json_extract(j.value, '$.job_name')
      AND c.configured = 1 AND c.defined_in_database = 0 AND c.valid = 1 AND c.enabled = 1
      AND json_extract(j.value, '$.valid') = 1 AND json_extract(j.value, '$.enabled') = 1
      AND json_extract(j.value, '$.schedule') = c.schedule AND json_extract(j.value, '$.timezone') = c.timezone
      AND c.definition_hash IS NOT json_extract(j.value, '$.definition_hash'))
UPDATE agent_runs SET command = x.command, target_database = x.target_database, overlap = x.overlap,
    max_attempts = x.max_attempts, timeout_seconds = x.timeout_seconds, lease_seconds = x.lease_seconds,
    steps = x.steps
FROM x
WHERE agent_runs.job_name = x.job_name AND agent_runs.kind = 'scheduled'
  AND agent_runs.status IN ('pending', 'queued') AND agent_runs.attempt = 0;

-- unconfigure_missing_jobs --
-- Jobs no longer in the settings stop being scheduled; their history stays.
UPDATE agent_jobs SET configured = 0, next_due_at = NULL, updated_at = :now
WHERE configured = 1 AND defined_in_database = 0
  AND job_name NOT IN (SELECT json_extract(j.value, '$.job_name') FROM json_each(:jobs) AS j);

-- insert_job_events --
-- Record things that happened to jobs outside any run (a JSON array of {job_name, kind, detail}).
INSERT INTO agent_job_events (job_name, event_at, kind, detail)
SELECT json_extract(e.value, '$.job_name'), :now, json_extract(e.value, '$.kind'), json_extract(e.value, '$.detail')
FROM json_each(:events) AS e;

-- expire_leases --
-- Take back every run whose holder stopped renewing its lease (a lapse: the worker died or lost the database; counted apart from attempts, failed after AGENT_MAX_LAPSES) or whose message was lost, fencing it with a new token.
UPDATE agent_runs SET
    status = CASE WHEN status = 'running' AND lapses + 1 > :max_lapses THEN 'failed' ELSE 'pending' END,
    lapses = CASE WHEN status = 'running' THEN lapses + 1 ELSE lapses END,
    token = token + 1,
    lease_expires_at = NULL,
    runnable_at = CASE WHEN status = 'running' THEN :now ELSE runnable_at END,
    finished_at = CASE WHEN status = 'running' AND lapses + 1 > :max_lapses THEN :now ELSE NULL END,
    last_error = CASE WHEN status = 'running'
                      THEN 'lease lapsed: worker ' || COALESCE(worker, '?') || ' stopped renewing its lease (lapse '
                           || CAST(lapses + 1 AS TEXT) || ' of AGENT_MAX_LAPSES=' || CAST(:max_lapses AS TEXT) || ')'
                      ELSE 'dispatch lease expired: the message was not picked up in time; dispatching again' END
WHERE status IN ('queued', 'running') AND lease_expires_at < :now AND awaiting_targets = 0
RETURNING run_id, job_name, kind, status, attempt, lapses, token, operation_id, scheduled_for,
          CASE WHEN last_error LIKE 'lease lapsed:%' THEN 1 ELSE 0 END AS was_running;

-- close_dead_attempts --
-- Mark attempts still 'running' whose run has moved on to a newer token: their worker died or was fenced.
UPDATE agent_attempts SET outcome = 'lease_expired', finished_at = :now,
    error_message = 'lease lapsed: the worker stopped renewing its lease (killed, hung or cut off from the database)'
WHERE outcome = 'running'
  AND token < (SELECT r.token FROM agent_runs r WHERE r.run_id = agent_attempts.run_id);

-- select_runaway_jobs --
-- Jobs whose next slot was moved by a tick whose clock ran ahead of this one by more than AGENT_MAX_CLOCK_SKEW_SECONDS.
SELECT job_name, schedule, timezone, next_due_at, advanced_at
FROM agent_jobs
WHERE advanced_at > :far AND configured = 1
ORDER BY job_name;

-- recover_runaway_runs --
-- Undo what a clock far ahead created: its never-started slots go, and the misfires it recorded (false: the slots had not come; they are claimed again when their time comes), other never-started runs become runnable now, and leases set far ahead come back within reach.
DELETE FROM agent_runs
WHERE kind = 'scheduled' AND status IN ('pending', 'queued', 'skipped') AND attempt = 0 AND created_at > :far
RETURNING 'removed' AS action, run_id, job_name, scheduled_for;
UPDATE agent_runs SET runnable_at = :now, created_at = :now, status = 'pending', lease_expires_at = NULL
WHERE kind <> 'scheduled' AND status IN ('pending', 'queued') AND created_at > :far
RETURNING 'made runnable' AS action, run_id, job_name, scheduled_for;
UPDATE agent_runs SET lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', julianday(:now) + lease_seconds / 86400.0)
WHERE status IN ('queued', 'running') AND lease_expires_at > :far_lease
RETURNING 'lease shortened' AS action, run_id, job_name, scheduled_for;

-- select_due_jobs --
-- Jobs with a slot at or before the claim horizon (the next tick plus a margin), each with whether a pause is in force at :now and its window (one that ended names the slots missed inside it); their slots are computed in Python, for these jobs only. (SQLite's write lock, BEGIN IMMEDIATE, already keeps `pause` out of a claim.)
SELECT j.job_name, j.schedule, j.timezone, j.next_due_at, j.misfire, j.grace_seconds, j.calendars, j.jitter_seconds, j.catchup_seconds,
       CASE WHEN p.job_name IS NULL THEN 0
            WHEN p.paused_until IS NULL OR p.paused_until > :now THEN 1 ELSE 0 END AS paused,
       p.paused_at, p.paused_until
FROM agent_jobs AS j
LEFT JOIN agent_job_pauses AS p ON p.job_name = j.job_name
WHERE j.next_due_at <= :horizon AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1
ORDER BY j.job_name;

-- claim_slots --
-- Claim the given slots (a JSON array of {job_name, scheduled_for, status, note, runnable_at}); the unique (job_name, scheduled_for) key arbitrates between concurrent ticks. A run becomes runnable at its slot (runnable_at, when given: later, the end of the pause that held it), never before. A slot whose run a change of the job's definition recorded skipped (note 'skipped: the job ...': disabled, removed, redefined, schedule changed) and that never started is the job's again when a claim under the definition now in force plans it (enabled again, added back, a new schedule with a slot at the same instant); so is a slot a calendar recorded skipped (note 'calendar: ...') that the calendars now in force decide otherwise (allowed, or moved elsewhere): its run takes the planned decision and the definition's values in place (the same run id; a new token fences a message sent before, a new operation id), and is returned with the runs inserted.
-- The runs to take back, first (MATERIALIZED: the slots drive, each run found by the unique (job_name, scheduled_for) index through the CROSS JOIN, never a scan of the skipped runs); then each by its key.
WITH x AS MATERIALIZED (
    SELECT o.run_id, y.status, y.note, y.runnable_at, y.command, y.target_database, y.overlap, y.max_attempts,
           y.timeout_seconds, y.lease_seconds, y.steps
    FROM (SELECT j.job_name, json_extract(s.value, '$.scheduled_for') AS scheduled_for,
                 CASE WHEN p.job_name IS NULL THEN json_extract(s.value, '$.status') ELSE 'skipped' END AS status,
                 CASE WHEN p.job_name IS NULL THEN json_extract(s.value, '$.note') ELSE 'paused' END AS note,
                 COALESCE(json_extract(s.value, '$.runnable_at'), json_extract(s.value, '$.scheduled_for')) AS runnable_at,
                 j.command, j.target_database, j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, j.steps
          FROM json_each(:slots) AS s
          JOIN agent_jobs AS j ON j.job_name = json_extract(s.value, '$.job_name')
          LEFT JOIN agent_job_pauses AS p
                 ON p.job_name = j.job_name AND p.paused_at <= :now AND (p.paused_until IS NULL OR p.paused_until > :now)
                AND (p.paused_until IS NULL
                     OR COALESCE(json_extract(s.value, '$.runnable_at'), json_extract(s.value, '$.scheduled_for')) < p.paused_until)
          WHERE j.enabled = 1 AND j.valid = 1 AND j.configured = 1) AS y
    CROSS JOIN agent_runs AS o
    WHERE o.job_name = y.job_name AND o.scheduled_for = y.scheduled_for AND o.kind = 'scheduled'
      AND o.status = 'skipped' AND o.attempt = 0
      AND (o.note LIKE 'skipped: the job%'
           -- A slot a calendar excluded that the calendars now in force decide otherwise.
           OR (o.note LIKE 'calendar:%' AND (y.status <> 'skipped' OR (y.note LIKE 'calendar:%' AND y.note <> o.note)))))
UPDATE agent_runs SET status = x.status, note = x.note, runnable_at = x.runnable_at,
    finished_at = CASE WHEN x.status = 'skipped' THEN :now END, lease_expires_at = NULL, dispatched_at = NULL,
    last_error = NULL, last_error_number = NULL, token = agent_runs.token + 1, created_at = :now,
    operation_id = lower(hex(randomblob(16))), command = x.command, target_database = x.target_database,
    overlap = x.overlap, max_attempts = x.max_attempts, timeout_seconds = x.timeout_seconds,
    lease_seconds = x.lease_seconds, steps = x.steps
FROM x
WHERE agent_runs.run_id = x.run_id
RETURNING run_id, job_name, scheduled_for, status, note, operation_id, token;
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note, steps)
SELECT j.job_name, 'scheduled', json_extract(s.value, '$.scheduled_for'),
       CASE WHEN p.job_name IS NULL THEN json_extract(s.value, '$.status') ELSE 'skipped' END,
       j.command, j.target_database, j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds,
       COALESCE(json_extract(s.value, '$.runnable_at'), json_extract(s.value, '$.scheduled_for')), :now,
       CASE WHEN json_extract(s.value, '$.status') = 'skipped' OR p.job_name IS NOT NULL THEN :now END,
       lower(hex(randomblob(16))), CASE WHEN p.job_name IS NULL THEN json_extract(s.value, '$.note') ELSE 'paused' END,
       j.steps
FROM json_each(:slots) AS s
JOIN agent_jobs AS j ON j.job_name = json_extract(s.value, '$.job_name')
-- A pause in force: a slot that would run before its end is recorded skipped 'paused', never claimed (as on the servers).
LEFT JOIN agent_job_pauses AS p
       ON p.job_name = j.job_name AND p.paused_at <= :now AND (p.paused_until IS NULL OR p.paused_until > :now)
      AND (p.paused_until IS NULL
           OR COALESCE(json_extract(s.value, '$.runnable_at'), json_extract(s.value, '$.scheduled_for')) < p.paused_until)
WHERE j.enabled = 1 AND j.valid = 1 AND j.configured = 1
ORDER BY j.job_name, json_extract(s.value, '$.scheduled_for')
ON CONFLICT (job_name, scheduled_for) DO NOTHING
RETURNING run_id, job_name, scheduled_for, status, note, operation_id, token;

-- advance_jobs --
-- Move jobs to their next slot, per schedule (a JSON array of {schedule, timezone, from_due, next_due_at, paused, misfire, job_name}; paused 1: only the jobs with a pause in force at :now, 0: only the others, absent: both; misfire, when given: only the jobs of that policy; job_name, when given: that job only, as for a paused job, whose next slot depends on its own pause); a job another tick already moved is left as it is.
UPDATE agent_jobs SET next_due_at = a.next_due_at, advanced_at = :now
FROM (SELECT json_extract(x.value, '$.schedule') AS schedule, json_extract(x.value, '$.timezone') AS timezone,
             json_extract(x.value, '$.from_due') AS from_due, json_extract(x.value, '$.next_due_at') AS next_due_at,
             json_extract(x.value, '$.paused') AS paused, json_extract(x.value, '$.misfire') AS misfire,
             json_extract(x.value, '$.job_name') AS job_name
      FROM json_each(:advances) AS x) AS a
WHERE agent_jobs.next_due_at = a.from_due AND agent_jobs.schedule = a.schedule AND agent_jobs.timezone = a.timezone
  AND (a.misfire IS NULL OR agent_jobs.misfire = a.misfire) AND (a.job_name IS NULL OR agent_jobs.job_name = a.job_name)
  AND (a.paused IS NULL OR a.paused = CASE WHEN EXISTS (
           SELECT 1 FROM agent_job_pauses AS p
           WHERE p.job_name = agent_jobs.job_name AND (p.paused_until IS NULL OR p.paused_until > :now))
       THEN 1 ELSE 0 END)
RETURNING agent_jobs.job_name;

-- dispatch_runs --
-- Queue mode: under SQLite's write lock, skip the slots that may not run, then hand the queue every due run that may start (task order, overlap 'queue', the cap counting runs executing or due on the queue) and every run due within the lookahead (a delayed message; it holds no place). Each gets a new token and a dispatch lease.
UPDATE agent_runs SET status = 'skipped', finished_at = :now, lease_expires_at = NULL,
    note = CASE
        WHEN agent_runs.job_name IS NOT NULL AND agent_runs.overlap = 'skip' AND EXISTS (
             SELECT 1 FROM agent_runs o WHERE o.job_name = agent_runs.job_name AND o.run_id <> agent_runs.run_id
               AND o.status = 'running')
        THEN 'overlap: the previous run of this job was still running; policy skip'
        WHEN agent_runs.overlap = 'buffer-one' AND NOT (agent_runs.kind = 'scheduled' AND agent_runs.scheduled_for < :late_cutoff
                                                AND COALESCE(agent_runs.note, '') NOT LIKE 'catch-up:%')
        THEN 'overlap: a run of this job was running and another was already waiting; policy buffer-one'
        WHEN EXISTS (
             SELECT 1 FROM agent_runs n WHERE n.job_name = agent_runs.job_name AND n.kind = 'scheduled'
               AND n.scheduled_for > agent_runs.scheduled_for AND n.scheduled_for <= :now
               AND n.status NOT IN ('skipped', 'cancelled'))
        THEN 'misfire: a later slot of this job is due too; caught up once, with the latest'
        WHEN EXISTS (SELECT 1 FROM agent_jobs j WHERE j.job_name = agent_runs.job_name AND j.misfire = 'skip')
        THEN 'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
        ELSE 'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped' END
WHERE status = 'pending' AND runnable_at <= :now AND job_name IS NOT NULL
  AND ((agent_runs.overlap = 'buffer-one' AND EXISTS (SELECT 1 FROM agent_runs o WHERE o.job_name = agent_runs.job_name
                AND o.run_id <> agent_runs.run_id AND o.status = 'running')
             AND EXISTS (SELECT 1 FROM agent_runs w WHERE w.job_name = agent_runs.job_name AND w.run_id <> agent_runs.run_id
                AND w.status IN ('pending', 'queued') AND w.runnable_at <= :now
                AND NOT (w.kind = 'scheduled' AND w.scheduled_for < :late_cutoff AND COALESCE(w.note, '') NOT LIKE 'catch-up:%')
                AND (w.scheduled_for < agent_runs.scheduled_for OR (w.scheduled_for = agent_runs.scheduled_for AND w.run_id < agent_runs.run_id))))
       OR (job_name IS NOT NULL AND overlap = 'skip' AND EXISTS (
            SELECT 1 FROM agent_runs o WHERE o.job_name = agent_runs.job_name AND o.run_id <> agent_runs.run_id
              AND o.status = 'running'))
       OR (kind = 'scheduled' AND scheduled_for < :late_cutoff AND COALESCE(note, '') NOT LIKE 'catch-up:%' AND (
            EXISTS (SELECT 1 FROM agent_runs n WHERE n.job_name = agent_runs.job_name AND n.kind = 'scheduled'
                      AND n.scheduled_for > agent_runs.scheduled_for AND n.scheduled_for <= :now
                      AND n.status NOT IN ('skipped', 'cancelled'))
            OR EXISTS (SELECT 1 FROM agent_jobs j WHERE j.job_name = agent_runs.job_name
                         AND (j.misfire = 'skip'
                              OR julianday(agent_runs.scheduled_for) + j.grace_seconds / 86400.0 < julianday(:now))))))
RETURNING 'skipped' AS decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note;
UPDATE agent_runs SET
    status = 'queued',
    token = token + 1,
    lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', julianday(max(runnable_at, :now)) + :dispatch_lease_seconds / 86400.0),
    dispatched_at = :now
WHERE run_id IN (
    SELECT run_id FROM (
        SELECT c.run_id FROM agent_runs c
        WHERE c.status = 'pending' AND c.runnable_at <= :now
          AND NOT (c.task_order IS NOT NULL AND EXISTS (
                SELECT 1 FROM agent_runs t
                WHERE t.kind = 'task' AND t.task_order < c.task_order AND t.status IN ('pending', 'queued', 'running')))
          AND NOT (c.job_name IS NOT NULL AND c.overlap <> 'allow' AND EXISTS (
                SELECT 1 FROM agent_runs o
                WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
                  AND ((c.overlap IN ('queue', 'buffer-one') AND o.status = 'running')
                       OR (o.status IN ('pending', 'queued')
                           AND (c.overlap IN ('queue', 'buffer-one') OR o.runnable_at <= :now)
                           AND (o.scheduled_for < c.scheduled_for
                                OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
        ORDER BY c.runnable_at, c.run_id
        LIMIT max(0, :max_concurrency - (
            (SELECT COUNT(*) FROM agent_runs f WHERE f.status = 'running' AND f.awaiting_targets = 0)
            + (SELECT COUNT(*) FROM agent_runs f WHERE f.status = 'queued' AND f.runnable_at <= :now))))
    UNION ALL
    SELECT run_id FROM (
        SELECT c.run_id FROM agent_runs c
        WHERE c.status = 'pending' AND c.runnable_at > :now AND c.runnable_at <= :lookahead_until
        ORDER BY c.runnable_at, c.run_id
        LIMIT :ahead_limit))
RETURNING 'queued' AS decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note;

-- release_dispatch --
-- Put back runs whose queue message could not be sent (a JSON array of {run_id, token}); a later dispatch sends them again.
UPDATE agent_runs SET status = 'pending', lease_expires_at = NULL
FROM (SELECT json_extract(x.value, '$.run_id') AS run_id, json_extract(x.value, '$.token') AS token
      FROM json_each(:runs) AS x) AS r
WHERE agent_runs.run_id = r.run_id AND agent_runs.token = r.token AND agent_runs.status = 'queued'
RETURNING agent_runs.run_id;

-- start_run --
-- Queue mode, fenced start of the run a message names: only for the current token of a queued run, decided under SQLite's write lock: early (the slot has not come), skipped (overlap skip, misfire), held back to pending (task order, overlap queue, the cap) or started with its attempt opened.
CREATE TEMP TABLE IF NOT EXISTS agent_decisions (run_id INTEGER PRIMARY KEY, decision TEXT NOT NULL);
DELETE FROM temp.agent_decisions;
INSERT INTO temp.agent_decisions (run_id, decision)
SELECT r.run_id,
       CASE WHEN r.runnable_at > :now THEN 'early'
            WHEN r.job_name IS NOT NULL AND r.overlap = 'skip' AND EXISTS (
                 SELECT 1 FROM agent_runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                   AND o.status = 'running') THEN 'skip-overlap'
            WHEN r.kind = 'scheduled' AND r.scheduled_for < :late_cutoff AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND EXISTS (
                 SELECT 1 FROM agent_runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                   AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= :now
                   AND n.status NOT IN ('skipped', 'cancelled')) THEN 'skip-superseded'
            WHEN r.kind = 'scheduled' AND r.scheduled_for < :late_cutoff AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND EXISTS (
                 SELECT 1 FROM agent_jobs j WHERE j.job_name = r.job_name AND j.misfire = 'skip') THEN 'skip-misfire'
            WHEN r.kind = 'scheduled' AND r.scheduled_for < :late_cutoff AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND EXISTS (
                 SELECT 1 FROM agent_jobs j WHERE j.job_name = r.job_name
                   AND julianday(r.scheduled_for) + j.grace_seconds / 86400.0 < julianday(:now)) THEN 'skip-grace'
            WHEN r.task_order IS NOT NULL AND EXISTS (
                 SELECT 1 FROM agent_runs t WHERE t.kind = 'task' AND t.task_order < r.task_order
                   AND t.status IN ('pending', 'queued', 'running')) THEN 'held-order'
            WHEN r.job_name IS NOT NULL AND r.overlap = 'buffer-one' AND EXISTS (
                 SELECT 1 FROM agent_runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                   AND o.status = 'running') AND EXISTS (
                 SELECT 1 FROM agent_runs w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                   AND w.status IN ('pending', 'queued') AND w.runnable_at <= :now
                   AND (w.scheduled_for < r.scheduled_for
                        OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id))) THEN 'skip-buffer'
            WHEN r.job_name IS NOT NULL AND r.overlap IN ('queue', 'buffer-one') AND EXISTS (
                 SELECT 1 FROM agent_runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                   AND (o.status = 'running'
                        OR (o.status IN ('pending', 'queued')
                            AND (o.scheduled_for < r.scheduled_for
                                 OR (o.scheduled_for = r.scheduled_for AND o.run_id < r.run_id))))) THEN 'held-overlap'
            WHEN (SELECT COUNT(*) FROM agent_runs f WHERE f.status = 'running' AND f.awaiting_targets = 0) >= :max_concurrency THEN 'held-cap'
            ELSE 'start' END
FROM agent_runs AS r
WHERE r.run_id = :run_id AND r.token = :token AND r.status = 'queued';
-- Overlap cancel-previous: the runs of its job in flight before it are stopped, as `stop` stops them.
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = :now, lease_expires_at = NULL, awaiting_targets = 0,
    note = CASE WHEN agent_runs.job_name IS NULL THEN 'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
                ELSE 'stopped: a newer run of this job is due; policy cancel-previous' END
WHERE agent_runs.status IN ('waiting', 'pending', 'queued', 'running') AND EXISTS (
    SELECT 1 FROM agent_runs p, agent_runs c WHERE p.run_id IN (agent_runs.run_id, agent_runs.parent_run_id) AND p.job_name IS NOT NULL
      AND p.kind <> 'backfill' AND p.status IN ('pending', 'queued', 'running')
      AND (p.status = 'running' OR p.runnable_at <= :now OR p.attempt > 0)
      AND c.job_name = p.job_name AND c.run_id <> p.run_id AND c.overlap = 'cancel-previous' AND c.run_id IN (SELECT d.run_id FROM temp.agent_decisions d WHERE d.decision IN ('start', 'held-cap'))
      AND (p.scheduled_for < c.scheduled_for OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id)));
UPDATE agent_runs SET
    status = CASE WHEN d.decision = 'start' THEN 'running' WHEN d.decision LIKE 'skip-%' THEN 'skipped'
                  WHEN d.decision LIKE 'held-%' THEN 'pending' ELSE agent_runs.status END,
    attempt = CASE WHEN d.decision = 'start' THEN agent_runs.attempt + 1 ELSE agent_runs.attempt END,
    started_at = CASE WHEN d.decision = 'start' THEN :now ELSE agent_runs.started_at END,
    heartbeat_at = CASE WHEN d.decision = 'start' THEN :now ELSE agent_runs.heartbeat_at END,
    lease_expires_at = CASE WHEN d.decision = 'start'
                            THEN strftime('%Y-%m-%d %H:%M:%f', julianday(:now) + agent_runs.lease_seconds / 86400.0)
                            WHEN d.decision = 'early' THEN agent_runs.lease_expires_at END,
    worker = CASE WHEN d.decision = 'start' THEN :worker ELSE agent_runs.worker END,
    dequeue_count = CASE WHEN d.decision = 'start' THEN :dequeue_count ELSE agent_runs.dequeue_count END,
    finished_at = CASE WHEN d.decision LIKE 'skip-%' THEN :now ELSE agent_runs.finished_at END,
    note = CASE d.decision
        WHEN 'skip-overlap' THEN 'overlap: the previous run of this job was still running; policy skip'
        WHEN 'skip-buffer' THEN 'overlap: a run of this job was running and another was already waiting; policy buffer-one'
        WHEN 'skip-superseded' THEN 'misfire: a later slot of this job is due too; caught up once, with the latest'
        WHEN 'skip-misfire' THEN 'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
        WHEN 'skip-grace' THEN 'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped'
        WHEN 'held-order' THEN 'held: waits for the tasks of a lower order to finish'
        WHEN 'held-overlap' THEN CASE WHEN agent_runs.overlap = 'buffer-one'
                                      THEN 'held: waits for the previous run of this job (overlap buffer-one)'
                                      ELSE 'held: waits for the previous run of this job (overlap queue)' END
        WHEN 'held-cap' THEN 'held: AGENT_MAX_CONCURRENCY runs are executing'
        ELSE agent_runs.note END
FROM temp.agent_decisions AS d
WHERE agent_runs.run_id = d.run_id;
INSERT INTO agent_attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
SELECT r.run_id, r.attempt, r.token, :worker, :dequeue_count, :now, 'running'
FROM agent_runs AS r JOIN temp.agent_decisions AS d ON d.run_id = r.run_id
WHERE d.decision = 'start';
SELECT d.decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
       r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds,
       r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note, r.step, r.steps, r.parent_run_id,
       r.parent_token, r.target_server, r.retry_interval_seconds, r.owner,
       r.params, jd.params AS job_params
FROM agent_runs AS r JOIN temp.agent_decisions AS d ON d.run_id = r.run_id
LEFT JOIN agent_jobs AS jd ON jd.job_name = r.job_name;

-- claim_runs --
-- Local runner: under SQLite's write lock, skip the slots that may not run, then start up to :batch runnable runs straight from agent_runs (task order, overlap, the cap), each with a new token and its attempt opened. :now NULL: decided on the database's own clock (the agent's one clock; an explicit :now is a test's clock), read once for the whole claim (temp.agent_claim_time).
CREATE TEMP TABLE IF NOT EXISTS agent_decisions (run_id INTEGER PRIMARY KEY, decision TEXT NOT NULL);
DELETE FROM temp.agent_decisions;
CREATE TEMP TABLE IF NOT EXISTS agent_claim_time (id INTEGER PRIMARY KEY CHECK (id = 1), now TEXT NOT NULL);
INSERT OR REPLACE INTO temp.agent_claim_time (id, now) VALUES (1, COALESCE(:now, strftime('%Y-%m-%d %H:%M:%f', 'now')));
UPDATE agent_runs SET status = 'skipped', finished_at = (SELECT now FROM temp.agent_claim_time), lease_expires_at = NULL,
    note = CASE
        WHEN agent_runs.job_name IS NOT NULL AND agent_runs.overlap = 'skip' AND EXISTS (
             SELECT 1 FROM agent_runs o WHERE o.job_name = agent_runs.job_name AND o.run_id <> agent_runs.run_id
               AND o.status = 'running')
        THEN 'overlap: the previous run of this job was still running; policy skip'
        WHEN agent_runs.overlap = 'buffer-one' AND NOT (agent_runs.kind = 'scheduled' AND agent_runs.scheduled_for < :late_cutoff
                                                AND COALESCE(agent_runs.note, '') NOT LIKE 'catch-up:%')
        THEN 'overlap: a run of this job was running and another was already waiting; policy buffer-one'
        WHEN EXISTS (
             SELECT 1 FROM agent_runs n WHERE n.job_name = agent_runs.job_name AND n.kind = 'scheduled'
               AND n.scheduled_for > agent_runs.scheduled_for AND n.scheduled_for <= (SELECT now FROM temp.agent_claim_time)
               AND n.status NOT IN ('skipped', 'cancelled'))
        THEN 'misfire: a later slot of this job is due too; caught up once, with the latest'
        WHEN EXISTS (SELECT 1 FROM agent_jobs j WHERE j.job_name = agent_runs.job_name AND j.misfire = 'skip')
        THEN 'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
        ELSE 'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped' END
WHERE status = 'pending' AND runnable_at <= (SELECT now FROM temp.agent_claim_time) AND job_name IS NOT NULL
  AND ((agent_runs.overlap = 'buffer-one' AND EXISTS (SELECT 1 FROM agent_runs o WHERE o.job_name = agent_runs.job_name
                AND o.run_id <> agent_runs.run_id AND o.status = 'running')
             AND EXISTS (SELECT 1 FROM agent_runs w WHERE w.job_name = agent_runs.job_name AND w.run_id <> agent_runs.run_id
                AND w.status IN ('pending', 'queued') AND w.runnable_at <= (SELECT now FROM temp.agent_claim_time)
                AND NOT (w.kind = 'scheduled' AND w.scheduled_for < :late_cutoff AND COALESCE(w.note, '') NOT LIKE 'catch-up:%')
                AND (w.scheduled_for < agent_runs.scheduled_for OR (w.scheduled_for = agent_runs.scheduled_for AND w.run_id < agent_runs.run_id))))
       OR (job_name IS NOT NULL AND overlap = 'skip' AND EXISTS (
            SELECT 1 FROM agent_runs o WHERE o.job_name = agent_runs.job_name AND o.run_id <> agent_runs.run_id
              AND o.status = 'running'))
       OR (kind = 'scheduled' AND scheduled_for < :late_cutoff AND COALESCE(note, '') NOT LIKE 'catch-up:%' AND (
            EXISTS (SELECT 1 FROM agent_runs n WHERE n.job_name = agent_runs.job_name AND n.kind = 'scheduled'
                      AND n.scheduled_for > agent_runs.scheduled_for AND n.scheduled_for <= (SELECT now FROM temp.agent_claim_time)
                      AND n.status NOT IN ('skipped', 'cancelled'))
            OR EXISTS (SELECT 1 FROM agent_jobs j WHERE j.job_name = agent_runs.job_name
                         AND (j.misfire = 'skip'
                              OR julianday(agent_runs.scheduled_for) + j.grace_seconds / 86400.0 < julianday((SELECT now FROM temp.agent_claim_time)))))))
RETURNING 'skipped' AS decision, run_id, job_name, kind, command, target_database, attempt, failures,
          max_attempts, lapses, transient_errors, token, timeout_seconds, lease_seconds,
          operation_id, scheduled_for, runnable_at, started_at, note, step, steps, parent_run_id, parent_token,
          target_server, retry_interval_seconds, owner, params, NULL AS job_params;
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = (SELECT now FROM temp.agent_claim_time), lease_expires_at = NULL, awaiting_targets = 0,
    note = CASE WHEN agent_runs.job_name IS NULL THEN 'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
                ELSE 'stopped: a newer run of this job is due; policy cancel-previous' END
WHERE agent_runs.status IN ('waiting', 'pending', 'queued', 'running') AND EXISTS (
    SELECT 1 FROM agent_runs p, agent_runs c WHERE p.run_id IN (agent_runs.run_id, agent_runs.parent_run_id) AND p.job_name IS NOT NULL
      AND p.kind <> 'backfill' AND p.status IN ('pending', 'queued', 'running')
      AND (p.status = 'running' OR p.runnable_at <= (SELECT now FROM temp.agent_claim_time) OR p.attempt > 0)
      AND c.job_name = p.job_name AND c.run_id <> p.run_id AND c.overlap = 'cancel-previous' AND c.status = 'pending' AND c.runnable_at <= (SELECT now FROM temp.agent_claim_time)
      AND (p.scheduled_for < c.scheduled_for OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id)))
RETURNING 'cancelled' AS decision, run_id, job_name, kind, command, target_database, attempt, failures,
          max_attempts, lapses, transient_errors, token, timeout_seconds, lease_seconds,
          operation_id, scheduled_for, runnable_at, started_at, note, step, steps, parent_run_id, parent_token,
          target_server, retry_interval_seconds, owner, params, NULL AS job_params;
INSERT INTO temp.agent_decisions (run_id, decision)
SELECT run_id, 'start' FROM (
    SELECT c.run_id FROM agent_runs c
    WHERE c.status = 'pending' AND c.runnable_at <= (SELECT now FROM temp.agent_claim_time)
      AND NOT (c.task_order IS NOT NULL AND EXISTS (
            SELECT 1 FROM agent_runs t
            WHERE t.kind = 'task' AND t.task_order < c.task_order AND t.status IN ('pending', 'queued', 'running')))
      AND NOT (c.job_name IS NOT NULL AND c.overlap <> 'allow' AND EXISTS (
            SELECT 1 FROM agent_runs o
            WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
              AND ((c.overlap IN ('queue', 'buffer-one') AND o.status = 'running')
                   OR (o.status IN ('pending', 'queued')
                       AND (c.overlap IN ('queue', 'buffer-one') OR o.runnable_at <= (SELECT now FROM temp.agent_claim_time))
                       AND (o.scheduled_for < c.scheduled_for
                            OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
    ORDER BY c.runnable_at, c.run_id
    LIMIT min(:batch, max(0, :max_concurrency - (
        (SELECT COUNT(*) FROM agent_runs f WHERE f.status = 'running' AND f.awaiting_targets = 0)
        + (SELECT COUNT(*) FROM agent_runs f WHERE f.status = 'queued' AND f.runnable_at <= (SELECT now FROM temp.agent_claim_time))))));
UPDATE agent_runs SET
    status = 'running',
    token = token + 1,
    attempt = attempt + 1,
    dispatched_at = (SELECT now FROM temp.agent_claim_time),
    started_at = (SELECT now FROM temp.agent_claim_time),
    heartbeat_at = (SELECT now FROM temp.agent_claim_time),
    lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', julianday((SELECT now FROM temp.agent_claim_time)) + lease_seconds / 86400.0),
    worker = :worker,
    dequeue_count = NULL
WHERE run_id IN (SELECT run_id FROM temp.agent_decisions WHERE decision = 'start');
INSERT INTO agent_attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
SELECT r.run_id, r.attempt, r.token, :worker, NULL, (SELECT now FROM temp.agent_claim_time), 'running'
FROM agent_runs AS r JOIN temp.agent_decisions AS d ON d.run_id = r.run_id;
SELECT d.decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
       r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds,
       r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note, r.step, r.steps, r.parent_run_id,
       r.parent_token, r.target_server, r.retry_interval_seconds, r.owner,
       r.params, jd.params AS job_params
FROM agent_runs AS r JOIN temp.agent_decisions AS d ON d.run_id = r.run_id
LEFT JOIN agent_jobs AS jd ON jd.job_name = r.job_name
ORDER BY r.runnable_at, r.run_id;

-- next_runnable_at --
-- When the next pending run becomes runnable (the local runner's idle workers sleep until then, or the poll interval).
SELECT MIN(runnable_at) AS next_at FROM agent_runs WHERE status = 'pending' AND runnable_at > :now;

-- renew_leases --
-- One statement renews the lease of every run a process holds (a JSON array of {run_id, token}); a run missing from the result was taken over or cancelled.
UPDATE agent_runs SET heartbeat_at = :now,
    lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', julianday(:now) + lease_seconds / 86400.0)
FROM (SELECT json_extract(x.value, '$.run_id') AS run_id, json_extract(x.value, '$.token') AS token
      FROM json_each(:held) AS x) AS h
WHERE agent_runs.run_id = h.run_id AND agent_runs.token = h.token AND agent_runs.status = 'running'
  AND agent_runs.awaiting_targets = 0
RETURNING agent_runs.run_id;

-- reset_session --
-- SQLite: a job's connection state (PRAGMAs, temporary tables) is the embedded default's own; nothing to undo for the agent's statements.
SELECT 1 AS unlocked WHERE 0;

-- finish_run --
-- Fenced completion in the job's transaction: the run and its open attempt succeed together, only for the current token (no row back: the lease was taken over; roll back).
UPDATE agent_runs SET status = 'succeeded', finished_at = :now, lease_expires_at = NULL,
    last_error = NULL, last_error_number = NULL
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING run_id;
UPDATE agent_attempts SET outcome = 'succeeded', finished_at = :now
WHERE run_id = :run_id AND token = :token AND outcome = 'running'
  AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = :run_id AND r.token = :token AND r.status = 'succeeded');

-- fail_run --
-- Fenced failure (an error in the job's SQL, or its timeout): spends one of max_attempts; back to pending at :retry_at while attempts remain, else failed; the attempt closes with the error.
UPDATE agent_runs SET
    failures = failures + 1,
    status = CASE WHEN failures + 1 < max_attempts THEN 'pending' ELSE 'failed' END,
    runnable_at = :retry_at,
    finished_at = CASE WHEN failures + 1 < max_attempts THEN NULL ELSE :now END,
    lease_expires_at = NULL,
    last_error_number = :error_number,
    last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING status, attempt, failures, max_attempts;
UPDATE agent_attempts SET outcome = :outcome, finished_at = :now,
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running'
  AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = :run_id AND r.token = :token AND r.status IN ('pending', 'failed'));

-- retry_transient --
-- Local runner, fenced: a transient error spends no attempt; the run goes back to pending at :retry_at and counts the transient error; the attempt closes with it.
UPDATE agent_runs SET status = 'pending', transient_errors = transient_errors + 1, runnable_at = :retry_at,
    lease_expires_at = NULL, last_error_number = :error_number, last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING status, transient_errors;
UPDATE agent_attempts SET outcome = 'transient', finished_at = :now,
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running'
  AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = :run_id AND r.token = :token AND r.status = 'pending');

-- requeue_transient --
-- Queue mode, fenced: a transient error spends no attempt; the run goes back to the queue's redelivery (same token) with a dispatch lease in case the message is lost; the attempt closes with the error.
UPDATE agent_runs SET status = 'queued', lease_expires_at = :lease_until,
    last_error_number = :error_number, last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING status;
UPDATE agent_attempts SET outcome = 'transient', finished_at = :now,
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running'
  AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = :run_id AND r.token = :token AND r.status = 'queued');

-- poison_run --
-- Fenced: the run's current message (or, in the local runner, the run) is poisoned; the run ends poisoned and its open attempt closes with the last error.
UPDATE agent_runs SET status = 'poisoned', finished_at = :now, lease_expires_at = NULL, last_error = :reason
WHERE run_id = :run_id AND token = :token AND status IN ('pending', 'queued', 'running')
RETURNING run_id;
UPDATE agent_attempts SET outcome = 'poisoned', finished_at = :now,
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message
WHERE run_id = :run_id AND token = :token AND outcome = 'running'
  AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = :run_id AND r.token = :token AND r.status = 'poisoned');

-- close_fenced_attempt --
-- Close the attempt of a worker whose lease was taken over (its run belongs to someone else now).
UPDATE agent_attempts SET outcome = 'lease_lost', finished_at = :now, error_message = :error_message
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
FROM agent_runs WHERE run_id = :run_id;

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
-- Give a poisoned or failed run one more attempt (and fresh lapse and transient budgets): back to pending, runnable now; the next start gives it a new token.
UPDATE agent_runs SET status = 'pending', runnable_at = :now, finished_at = NULL,
    lease_expires_at = NULL, max_attempts = failures + 1, lapses = 0, transient_errors = 0,
    note = 'requeued by operator'
WHERE run_id = :run_id AND status IN ('poisoned', 'failed')
RETURNING run_id;

-- mark_poison_requeued --
-- Remember when a poison message was requeued.
UPDATE agent_poison_messages SET requeued_at = :now WHERE poison_id = :poison_id;

-- insert_manual_run --
-- run-now: a run of a job right away, keyed by the request time; the job's overlap policy applies (SQLite's single writer decides it).
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note, steps, params)
SELECT d.job_name, 'manual', :now, d.decision, d.command, d.target_database, d.overlap,
       d.max_attempts, d.timeout_seconds, d.lease_seconds, :now, :now,
       CASE WHEN d.decision = 'skipped' THEN :now END,
       :operation_id,
       CASE WHEN d.decision = 'skipped'
            THEN 'overlap: the previous run of this job was still in flight; policy skip'
            ELSE 'run-now' END, d.steps, :params
FROM (
    SELECT j.*, CASE WHEN j.overlap = 'skip' AND EXISTS (
                    SELECT 1 FROM agent_runs a
                    WHERE a.job_name = j.job_name
                      AND (a.status = 'running' OR (a.status IN ('pending', 'queued') AND (a.runnable_at <= :now OR a.kind = 'manual'))))
               THEN 'skipped' ELSE 'pending' END AS decision
    FROM agent_jobs j
    WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
) AS d
RETURNING run_id, job_name, status, note, operation_id;

-- backfill_runs --
-- sql-agent backfill JOB --from --to: each slot of the past window (a JSON array of {scheduled_for, runnable_at}, oldest first, computed as the planner computes them: calendars and jitter applied) becomes a recorded run of its slot, kind 'backfill', runnable at once in slot order: a slot without a run gets one (the unique (job, slot) key: two backfills at once insert it once); a slot recorded skipped that never started is run now (its row, with the job's definition of now); a slot that ran, runs or waits is left alone. Backfill runs are outside the misfire rules (kind is not 'scheduled') and wait for each other (overlap queue; allow when the job allows). Rows back: the runs made, with how (inserted or rerun).
UPDATE agent_runs SET status = 'pending', kind = 'backfill', runnable_at = s.runnable_at, finished_at = NULL,
    lease_expires_at = NULL, command = j.command, target_database = j.target_database,
    overlap = CASE WHEN j.overlap = 'allow' THEN 'allow' ELSE 'queue' END, max_attempts = j.max_attempts,
    timeout_seconds = j.timeout_seconds, lease_seconds = j.lease_seconds, steps = j.steps, operation_id = :operation_id,
    note = :note || ' (the slot had been skipped: ' || COALESCE(agent_runs.note, '') || ')'
FROM (SELECT json_extract(x.value, '$.scheduled_for') AS scheduled_for, json_extract(x.value, '$.runnable_at') AS runnable_at
      FROM json_each(:slots) AS x) AS s,
     agent_jobs AS j
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
  AND agent_runs.job_name = j.job_name AND agent_runs.scheduled_for = s.scheduled_for
  AND agent_runs.status = 'skipped' AND agent_runs.attempt = 0
RETURNING agent_runs.run_id, agent_runs.scheduled_for, 'rerun' AS action;
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        operation_id, note, steps)
SELECT j.job_name, 'backfill', s.scheduled_for, 'pending', j.command, j.target_database,
       CASE WHEN j.overlap = 'allow' THEN 'allow' ELSE 'queue' END, j.max_attempts, j.timeout_seconds,
       j.lease_seconds, s.runnable_at, :now, :operation_id, :note, j.steps
FROM (SELECT json_extract(x.value, '$.scheduled_for') AS scheduled_for, json_extract(x.value, '$.runnable_at') AS runnable_at
      FROM json_each(:slots) AS x) AS s
CROSS JOIN agent_jobs AS j
WHERE j.job_name = :job_name AND j.valid = 1 AND j.configured = 1
ON CONFLICT (job_name, scheduled_for) DO NOTHING
RETURNING run_id, scheduled_for, 'inserted' AS action;

-- list_slot_runs --
-- backfill: the scheduled and backfill runs of one job keyed from :since to before :horizon (the spans of the window's slots, each from its time to the schedule's next slot): a slot's run is found whatever jitter keyed it.
SELECT scheduled_for, status, attempt, kind FROM agent_runs
WHERE job_name = :job_name AND kind IN ('scheduled', 'backfill')
  AND scheduled_for >= :since AND scheduled_for < :horizon
ORDER BY scheduled_for;

-- insert_task --
-- submit: an ad-hoc task; it starts once every task of a lower order submitted before it has finished.
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                        overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                        created_at, operation_id, note)
VALUES (NULL, 'task', :now, 'pending', :command, :target_database, :task_order,
        'allow', :max_attempts, :timeout_seconds, :lease_seconds, :now,
        :now, :operation_id, 'submitted')
RETURNING run_id, status, operation_id;

-- cancel_run --
-- Cancel a run not yet finished (a fleet's execution not yet let in too); the token bump fences a worker still running it (the lease renewal finds it gone and stops the work).
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = :now,
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
FROM agent_jobs j
LEFT JOIN agent_job_pauses p ON p.job_name = j.job_name
LEFT JOIN agent_runs l ON l.run_id = (
    SELECT r.run_id FROM agent_runs r
    WHERE r.job_name = j.job_name AND r.status NOT IN ('pending', 'queued')
    ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1)
ORDER BY j.job_name;

-- list_history --
-- Runs, newest first, optionally of one job.
SELECT run_id, job_name, kind, scheduled_for, status, attempt, failures, lapses, max_attempts, token,
       created_at, started_at, finished_at, worker, last_error_number, last_error, note, operation_id,
       step, failed_step, parent_run_id, target_server, target_database, targets_total, targets_failed, followed_run_id,
       params
FROM agent_runs
WHERE (:job_name IS NULL OR job_name = :job_name)
ORDER BY run_id DESC LIMIT :limit;

-- list_attempts --
-- Attempts of the runs in a JSON array of run ids.
SELECT a.run_id, a.attempt, a.token, a.worker, a.dequeue_count, a.started_at, a.finished_at,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.step, a.target_database
FROM agent_attempts a
WHERE a.run_id IN (SELECT CAST(x.value AS INTEGER) FROM json_each(:run_ids) AS x)
ORDER BY a.run_id, a.attempt_id;

-- list_job_events --
-- Job events (invalid configuration, clock recovery, ...), newest first, optionally of one job.
SELECT event_id, job_name, event_at, kind, detail FROM agent_job_events
WHERE (:job_name IS NULL OR job_name = :job_name)
ORDER BY event_id DESC LIMIT :limit;

-- insert_audit --
-- One row of the audit trail (shared/engine/audit.py), in the operator action's own transaction, or alone after it was refused: the principal is :principal when the front end signed its user in (the monitor), else :fallback_principal (the embedded database has no logins: the operating system's user); :client says from where.
INSERT INTO agent_audit (acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail)
VALUES (:now, substr(COALESCE(:principal, :fallback_principal), 1, 256), substr(:client, 1, 400), :source, :action,
        substr(:job_name, 1, 200), :run_id, :arguments, :audit_outcome, substr(:detail, 1, 2000))
RETURNING audit_id;

-- audit_row_committed --
-- An operator action whose connection was lost at its COMMIT (shared/engine/audit.py): whether its row 'done', written as the transaction's last statement, is there (the transaction committed) or not.
SELECT audit_id FROM agent_audit WHERE audit_id = :audit_id AND action = :action AND outcome = 'done' AND acted_at = :now;

-- list_audit --
-- sql-agent audit and the monitor's audit page: the audit trail, newest first, optionally of one job and from a time on.
SELECT audit_id, acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail FROM agent_audit
WHERE (:job_name IS NULL OR job_name = :job_name) AND (:since IS NULL OR acted_at >= :since)
ORDER BY audit_id DESC LIMIT :limit;

-- count_runs_by_status --
-- Runs per status (the doctor and the tests' reconciliation).
SELECT status, COUNT(*) AS runs FROM agent_runs GROUP BY status;

-- delete_run --
-- Remove a run and its attempts (the doctor's scratch run only).
DELETE FROM agent_attempts WHERE run_id = :run_id;
DELETE FROM agent_runs WHERE run_id = :run_id;

-- purge_history --
-- Retention, a bounded batch per tick: finished runs (with their attempts) and job events older than AGENT_HISTORY_RETENTION_DAYS — the latest run of each job, and a run with a poison message not yet requeued, always stay — and poison messages older than AGENT_POISON_RETENTION_DAYS; the audit trail is kept as long as the history.
CREATE TEMP TABLE IF NOT EXISTS agent_purge (run_id INTEGER PRIMARY KEY);
DELETE FROM temp.agent_purge;
INSERT INTO temp.agent_purge (run_id)
SELECT r.run_id FROM agent_runs AS r
WHERE r.finished_at < :history_before
  AND r.status IN ('succeeded', 'failed', 'poisoned', 'skipped', 'cancelled')
  AND (r.job_name IS NULL OR EXISTS (
        SELECT 1 FROM agent_runs AS n WHERE n.job_name = r.job_name AND n.scheduled_for > r.scheduled_for))
  AND NOT EXISTS (SELECT 1 FROM agent_poison_messages AS p WHERE p.run_id = r.run_id AND p.requeued_at IS NULL)
ORDER BY r.finished_at
LIMIT :batch;
DELETE FROM agent_attempts WHERE run_id IN (SELECT run_id FROM temp.agent_purge);
DELETE FROM agent_runs WHERE run_id IN (SELECT run_id FROM temp.agent_purge);
SELECT 'runs' AS purged, COUNT(*) AS rows_purged FROM temp.agent_purge;
DELETE FROM agent_job_events WHERE event_id IN (
    SELECT event_id FROM agent_job_events WHERE event_at < :history_before ORDER BY event_id LIMIT :batch)
RETURNING 'job_events' AS purged, 1 AS rows_purged;
DELETE FROM agent_poison_messages WHERE poison_id IN (
    SELECT poison_id FROM agent_poison_messages WHERE poisoned_at < :poison_before ORDER BY poison_id LIMIT :batch)
RETURNING 'poison_messages' AS purged, 1 AS rows_purged;
DELETE FROM agent_audit WHERE audit_id IN (
    SELECT audit_id FROM agent_audit WHERE acted_at < :history_before ORDER BY audit_id LIMIT :batch)
RETURNING 'audit' AS purged, 1 AS rows_purged;

-- identity_rights --
-- The doctor's view of what the agent's login reaches beyond the agent's rights: an embedded SQLite file has no logins (whoever can open it can do everything).
SELECT NULL AS login_name, NULL AS reaches;

-- connection_limit --
-- The doctor's view of the server's connection limit: an embedded SQLite file has none (one process owns it).
SELECT NULL AS max_connections, 0 AS reserved_connections, -1 AS role_limit, -1 AS database_limit,
       NULL AS connections_now, NULL AS login_name, NULL AS service_objective, NULL AS edition;

-- doctor_session --
-- The doctor's view of the agent's connection (busy timeout, journal mode) and of the triggers a DBA put on agent tables.
SELECT (SELECT timeout FROM pragma_busy_timeout) || ' ms' AS lock_timeout,
       'serializable' AS isolation,
       'journal_mode ' || (SELECT journal_mode FROM pragma_journal_mode) AS session_options,
       (SELECT group_concat(name || ' on ' || tbl_name, ', ') FROM sqlite_master
        WHERE type = 'trigger' AND tbl_name LIKE 'agent\_%' ESCAPE '\') AS triggers,
       (SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name LIKE 'agent\_%' ESCAPE '\' AND sql LIKE '%INSTEAD OF%') AS instead_of_triggers;

-- list_job_activity --
-- The monitor's status now: each job's unfinished runs grouped by status and by whether they are retries (a few rows per job, never one per run), optionally of one job.
SELECT job_name, status, CASE WHEN attempt > 0 THEN 1 ELSE 0 END AS retry, COUNT(*) AS runs,
       MIN(scheduled_for) AS first_scheduled_for, MIN(started_at) AS first_started_at,
       MIN(runnable_at) AS first_runnable_at, MAX(runnable_at) AS last_runnable_at, MIN(worker) AS worker
FROM agent_runs
WHERE status IN ('pending', 'queued', 'running') AND job_name IS NOT NULL
  AND (:job_name IS NULL OR job_name = :job_name)
GROUP BY job_name, status, CASE WHEN attempt > 0 THEN 1 ELSE 0 END
ORDER BY job_name, status;

-- list_job_timeline --
-- The monitor's timeline: a job's runs whose slot is at or after :since, newest first, at most :limit (the unique (job_name, scheduled_for) index serves it).
SELECT run_id, kind, scheduled_for, status, attempt, max_attempts, started_at, finished_at, last_error, note
FROM agent_runs
WHERE job_name = :job_name AND scheduled_for >= :since
ORDER BY scheduled_for DESC, run_id DESC LIMIT :limit;

-- list_run_poison --
-- The poison messages of one run, newest first.
SELECT poison_id, run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at
FROM agent_poison_messages WHERE run_id = :run_id ORDER BY poison_id DESC LIMIT :limit;

-- list_stuck_runs_page --
-- Reconciliation (the stuck command and page): runs in flight past their lease, or runnable but not started for longer than the given age; at most :limit runs.
SELECT run_id, job_name, kind, status, scheduled_for, runnable_at, lease_expires_at, token, attempt
FROM agent_runs
WHERE (status IN ('queued', 'running') AND lease_expires_at < :now)
   OR (status = 'pending' AND runnable_at < :stale_before)
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
FROM agent_jobs j
LEFT JOIN agent_job_pauses p ON p.job_name = j.job_name
LEFT JOIN agent_runs l ON l.run_id = (
    SELECT r.run_id FROM agent_runs r
    WHERE r.job_name = j.job_name AND r.status NOT IN ('pending', 'queued')
    ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1)
WHERE j.job_name = :job_name;

-- lock_job_definitions --
-- The job-definitions lock: SQLite's write lock (BEGIN IMMEDIATE) already serialises the settings sync; SQLite has no procedures defining jobs.
SELECT 1 AS locked;

-- list_database_job_names --
-- Jobs defined in the database (agent.add_scheduled_job) and not removed, with the job each follows (@after): a settings job of the same name is refused, and one whose AFTER would close a cycle through them.
SELECT job_name, after_job FROM agent_jobs WHERE defined_in_database = 1 AND configured = 1 ORDER BY job_name;

-- list_database_fleet_jobs --
-- The valid jobs defined from T-SQL with fleet targets (agent.add_scheduled_job @targets), their one fleet step as planned: for doctor and grant-sql --targets.
SELECT job_name, steps FROM agent_jobs
WHERE defined_in_database = 1 AND configured = 1 AND valid = 1 AND needs_planning = 0 AND steps IS NOT NULL
ORDER BY job_name;

-- select_unplanned_jobs --
-- Jobs defined or changed in the database that wait for the engine to check their schedule (and fleet targets) and plan their first slot (the jobs_needs_planning index).
SELECT job_name, schedule, timezone, enabled, updated_at, command, max_attempts, timeout_seconds,
       requested_targets, requested_target_parallelism, requested_target_stagger_seconds, requested_exclude, requested_only, requested_on_excluded,
       replan_runs, calendars,
       target_database, requested_steps
FROM agent_jobs WHERE needs_planning = 1 ORDER BY job_name;

-- list_calendars --
-- The calendars defined from T-SQL (agent.add_calendar): read when a planned database job names one.
SELECT name, dates, weekly FROM agent_calendars ORDER BY name;

-- plan_jobs --
-- Record every verdict and first slot of the planned jobs (a JSON array of {job_name, schedule, timezone, enabled, updated_at, valid, config_error, next_due_at, steps}; steps: a fleet job's one step, as the settings sync writes it) in one statement, fenced on the definition that was planned: a job redefined meanwhile waits for the next planning.
UPDATE agent_jobs SET needs_planning = 0, replan_runs = 0, valid = json_extract(p.value, '$.valid'),
    config_error = json_extract(p.value, '$.config_error'),
    next_due_at = json_extract(p.value, '$.next_due_at'), advanced_at = :now,
    steps = json_extract(p.value, '$.steps'), calendars = json_extract(p.value, '$.calendars')
FROM json_each(:plans) AS p
WHERE agent_jobs.job_name = json_extract(p.value, '$.job_name') AND agent_jobs.needs_planning = 1
  AND agent_jobs.updated_at = json_extract(p.value, '$.updated_at')
  AND agent_jobs.schedule = json_extract(p.value, '$.schedule')
  AND agent_jobs.timezone = json_extract(p.value, '$.timezone')
  AND agent_jobs.enabled = json_extract(p.value, '$.enabled')
RETURNING job_name, valid, config_error, next_due_at;

-- skip_replanned_runs --
-- A database job planned again after its calendars or jitter changed (agent.set_job_calendars set replan_runs, or the calendars the planning resolved differ from those in force: a calendar redefined or removed): its never-started scheduled runs keyed from its new first slot on (:jobs, a JSON array of {job_name, since, open_only}), and the slots ahead a pause recorded skipped, are recorded skipped (open_only: a job with no next slot left, a one-time job or a schedule past its `until`, whose runs not yet due alone are decided again: a slot a pause holds stays held); the claim that follows plans them again under the new rules (a run keyed as before is taken back in place, claim_slots). A run keyed before that slot stands for an earlier slot and is left as it is.
UPDATE agent_runs SET status = 'skipped', finished_at = :now, lease_expires_at = NULL,
    note = CASE WHEN agent_runs.note LIKE '%; moved from %' THEN 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here' ELSE 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after this slot was claimed' END
FROM (SELECT json_extract(j.value, '$.job_name') AS job_name, json_extract(j.value, '$.since') AS since,
             json_extract(j.value, '$.open_only') AS open_only
      FROM json_each(:jobs) AS j) AS x
WHERE agent_runs.job_name = x.job_name AND agent_runs.kind = 'scheduled' AND agent_runs.attempt = 0
  AND (agent_runs.status IN ('pending', 'queued')
       OR (agent_runs.status = 'skipped' AND agent_runs.note = 'paused' AND x.open_only IS NULL))
  AND (agent_runs.scheduled_for >= x.since
       -- A run a calendar moved, not yet due, keyed before that slot: decided again from now.
       OR (agent_runs.status IN ('pending', 'queued') AND agent_runs.scheduled_for >= :now
           AND agent_runs.note LIKE '%; moved from %'))
RETURNING run_id, job_name, scheduled_for;

-- settle_replanned_jobs --
-- The database jobs planned again after their calendars or jitter changed (:jobs, a JSON array of {job_name, open_only}; plan_jobs set next_due_at to the job's first slot, NULL when none), after skip_replanned_runs. open_only (a job with no next slot left: a one-time job, a schedule past its `until`): one whose run not yet due it just recorded skipped (one a calendar moved) is decided again from its slot, or from now when that has passed or there is none (the run was waiting for the time its calendars allowed, not missed); one whose slot has a run standing for it (ran, runs, waits, backfilled, held by a pause, skipped for good; not one a redefinition recorded skipped, nor the slot a calendar moved) keeps no slot (next_due_at NULL, as its claim left it): it never runs twice, and a slot skipped for good is not brought back; one never claimed keeps its slot. The others: one whose run a calendar moved, keyed before its first slot, was just recorded skipped is decided again from now (the earlier slot's moved run, under the new calendars).
UPDATE agent_jobs SET next_due_at = CASE
        WHEN x.open_only = 1
         AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name AND o.status = 'skipped'
                       AND o.finished_at = :now AND o.note IN ('skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after this slot was claimed', 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here'))
        THEN MAX(COALESCE(agent_jobs.next_due_at, :now), :now)
        WHEN x.open_only = 1 AND agent_jobs.next_due_at IS NOT NULL
         AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name
                       AND o.scheduled_for >= agent_jobs.next_due_at
                       AND NOT (o.status = 'skipped' AND (o.note LIKE 'skipped: the job%' OR o.note LIKE 'calendar:%; moved to %')))
        THEN NULL
        WHEN x.open_only IS NULL AND agent_jobs.next_due_at IS NOT NULL
         AND EXISTS (SELECT 1 FROM agent_runs AS o WHERE o.job_name = agent_jobs.job_name AND o.status = 'skipped'
                       AND o.finished_at = :now
                       AND o.note = 'skipped: the job''s calendars or jitter changed (agent.set_job_calendars, add_calendar or remove_calendar) after a calendar moved this run here')
        THEN MIN(agent_jobs.next_due_at, :now)
        ELSE agent_jobs.next_due_at END
FROM (SELECT json_extract(j.value, '$.job_name') AS job_name, json_extract(j.value, '$.open_only') AS open_only
      FROM json_each(:jobs) AS j) AS x
WHERE agent_jobs.job_name = x.job_name;

-- stop_job --
-- stop JOB (SQL Agent's sp_stop_job): cancel the job's runs in flight (running, due, queued due, or waiting for a retry), never its future slots; the token bump fences a worker still running one (its lease renewal finds it gone and stops the work).
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = :now,
    lease_expires_at = NULL, note = 'stopped by operator (stop JOB)'
WHERE job_name = :job_name AND status IN ('pending', 'queued', 'running')
  AND (status = 'running' OR runnable_at <= :now OR attempt > 0)
RETURNING run_id, status;

-- begin_step_attempt --
-- A run of a multi-step job started: its open attempt says which step it runs and where.
UPDATE agent_attempts SET step = :step, target_database = :target_database
WHERE run_id = :run_id AND token = :token AND attempt = :attempt AND outcome = 'running';

-- step_transition --
-- A step of a multi-step run ended (fenced by the token; in the step's own transaction when it works in the control database, so the step's work and its transition commit together): the attempt closes with its outcome and output, and the run follows the flow: on to :next_step at once (status running, same worker and token, a new attempt opened), the same step again at :runnable_at (pending: a retry), or the end (succeeded or failed, with the failing step). No row back: the lease was taken over; roll back.
UPDATE agent_runs SET
    status = :run_status,
    step = :next_step,
    failures = :failures,
    attempt = CASE WHEN :run_status = 'running' THEN attempt + 1 ELSE attempt END,
    runnable_at = :runnable_at,
    heartbeat_at = CASE WHEN :run_status = 'running' THEN :now ELSE heartbeat_at END,
    lease_expires_at = CASE WHEN :run_status = 'running' THEN :lease_until END,
    finished_at = CASE WHEN :run_status IN ('succeeded', 'failed') THEN :now END,
    failed_step = COALESCE(:failed_step, failed_step, CASE WHEN :run_status = 'failed' THEN :step END),
    last_error_number = :error_number,
    last_error = :error_message
WHERE run_id = :run_id AND token = :token AND status = 'running'
RETURNING run_id, status, step, attempt, failures;
UPDATE agent_attempts SET outcome = :outcome, finished_at = :now, step = :step,
    error_number = :error_number, error_sqlstate = :error_sqlstate, error_message = :error_message, output = :step_output
WHERE run_id = :run_id AND token = :token AND attempt = :attempt AND outcome = 'running'
  AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = :run_id AND r.token = :token AND r.status = :run_status);
INSERT INTO agent_attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome, step, target_database)
SELECT r.run_id, r.attempt, r.token, :worker, r.dequeue_count, :now, 'running', r.step, :next_database
FROM agent_runs AS r
WHERE r.run_id = :run_id AND r.token = :token AND r.status = 'running' AND r.attempt = :attempt + 1;

-- record_attempt_output --
-- Keep what the server said while an attempt ran (messages, rows affected), in the transaction that closes it.
UPDATE agent_attempts SET output = :step_output
WHERE run_id = :run_id AND token = :token AND attempt = :attempt;

-- list_attempt_output --
-- The output of the attempts of the runs in a JSON array of run ids (history --output, --json).
SELECT a.run_id, a.attempt, a.output
FROM agent_attempts a
WHERE a.run_id IN (SELECT CAST(x.value AS INTEGER) FROM json_each(:run_ids) AS x) AND a.output IS NOT NULL
ORDER BY a.run_id, a.attempt_id;

-- enqueue_notifications --
-- The notification outbox, in the transaction that ends runs: one row for each run it ended (finished at :now) whose outcome its job's NOTIFY asks for and that has a webhook (the job's, else :default_url); a run already notified is left alone.
INSERT INTO agent_notifications (run_id, job_name, outcome, url, status, attempts, created_at, next_attempt_at)
SELECT r.run_id, r.job_name, r.status, COALESCE(j.notify_webhook_url, :default_url), 'pending', 0, :now, :now
FROM agent_runs AS r
JOIN agent_jobs AS j ON j.job_name = r.job_name
WHERE r.finished_at = :now AND r.status IN ('succeeded', 'failed', 'poisoned')
  AND COALESCE(j.notify_webhook_url, :default_url) IS NOT NULL
  AND (COALESCE(j.notify, 'on_failure') = 'on_completion'
       OR (COALESCE(j.notify, 'on_failure') = 'on_success' AND r.status = 'succeeded')
       OR (COALESCE(j.notify, 'on_failure') = 'on_failure' AND r.status IN ('failed', 'poisoned')))
ON CONFLICT (run_id, kind) DO NOTHING;

-- start_follow_up_runs --
-- In the transaction that ends runs (each finished at :now): a run of every job that follows the job of a run it ended, when the end is the follower's AFTER_OUTCOME (succeeded: succeeded; failed: failed or poisoned; completed: any of them; a skipped or cancelled run starts nothing), pending and runnable now, with the chain's operation id and the run it followed; a disabled, invalid, removed or paused follower starts nothing. A follow-up of a job already in the ended run's chain of jobs (runs.chain), or past :max_chain_jobs jobs, is recorded skipped with the reason (note 'chain: ...'), and a job event 'follow_up_refused' says so once per reason and definition. The unique (followed_run_id, job_name) makes a second ending of the same run start nothing more. Two runs of one job ended together start one follow-up each, a millisecond apart (the (job_name, scheduled_for) key).
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                        finished_at, operation_id, note, steps, followed_run_id, chain)
SELECT d.job_name, 'manual',
       strftime('%Y-%m-%d %H:%M:%f', :now, '+' || ((d.nth - 1) / 1000.0) || ' seconds'),
       CASE WHEN d.refusal IS NULL THEN 'pending' ELSE 'skipped' END,
       d.command, d.target_database, d.overlap, d.max_attempts, d.timeout_seconds, d.lease_seconds,
       :now, :now, CASE WHEN d.refusal IS NOT NULL THEN :now END, d.operation_id,
       CASE WHEN d.refusal IS NULL
            THEN 'after run ' || d.followed_run_id || ' of ' || d.followed_job || ' (' || d.followed_status || ')'
            ELSE 'chain: not started after run ' || d.followed_run_id || ' of ' || d.followed_job || ': ' || d.refusal END,
       d.steps, d.followed_run_id, d.chain
FROM (SELECT w.*,
             CASE WHEN instr(lower(w.chain), '/' || lower(w.job_name) || '/') > 0
                  THEN 'job ' || w.job_name || ' is already in this chain of runs ('
                       || replace(substr(w.chain, instr(lower(w.chain), '/' || lower(w.job_name) || '/') + 1), '/', ' -> ')
                       || w.job_name || '); a chain of jobs that follow each other must end: check their AFTER'
                  WHEN length(w.chain) - length(replace(w.chain, '/', '')) - 1 >= :max_chain_jobs
                  THEN 'the chain of runs already holds ' || :max_chain_jobs || ' jobs, the most one chain may hold' END AS refusal
      FROM (SELECT f.job_name, f.command, f.target_database, f.overlap, f.max_attempts, f.timeout_seconds,
                   f.lease_seconds, f.steps, r.run_id AS followed_run_id, r.job_name AS followed_job,
                   r.status AS followed_status, r.operation_id,
                   COALESCE(r.chain, '/') || r.job_name || '/' AS chain,
                   ROW_NUMBER() OVER (PARTITION BY f.job_name ORDER BY r.run_id) AS nth
            FROM agent_runs AS r
            JOIN agent_jobs AS f ON f.after_job = r.job_name AND f.enabled = 1 AND f.valid = 1 AND f.configured = 1
            WHERE r.finished_at = :now AND r.kind <> 'target'
              AND NOT EXISTS (SELECT 1 FROM agent_job_pauses AS p
                              WHERE p.job_name = f.job_name AND (p.paused_until IS NULL OR p.paused_until > :now))
              AND ((f.after_outcome = 'succeeded' AND r.status = 'succeeded')
                   OR (f.after_outcome = 'failed' AND r.status IN ('failed', 'poisoned'))
                   OR (f.after_outcome = 'completed' AND r.status IN ('succeeded', 'failed', 'poisoned')))) AS w) AS d
ORDER BY d.job_name, d.followed_run_id
ON CONFLICT DO NOTHING
RETURNING run_id, job_name, followed_run_id, operation_id, status, note;
INSERT INTO agent_job_events (job_name, event_at, kind, detail)
SELECT DISTINCT s.job_name, :now, 'follow_up_refused',
       'not started after job ' || r.job_name || ': ' || substr(s.note, length('chain: not started after run ' || r.run_id || ' of ' || r.job_name || ': ') + 1)
FROM agent_jobs AS j
-- From the jobs that follow one (the jobs_after_job index) to their runs of this instant (the
-- (job_name, scheduled_for) index): nothing to read where no job follows another.
JOIN agent_runs AS s ON s.job_name = j.job_name AND s.scheduled_for >= :now AND s.finished_at = :now
                    AND s.status = 'skipped' AND s.followed_run_id IS NOT NULL AND s.note LIKE 'chain: %'
JOIN agent_runs AS r ON r.run_id = s.followed_run_id
WHERE j.after_job IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM agent_job_events AS e
                  WHERE e.job_name = s.job_name AND e.kind = 'follow_up_refused' AND e.event_at >= j.updated_at
                    AND e.detail = 'not started after job ' || r.job_name || ': '
                                   || substr(s.note, length('chain: not started after run ' || r.run_id || ' of ' || r.job_name || ': ') + 1));

-- claim_notifications --
-- Take up to :batch notifications due for delivery (new, a retry whose time came, or one whose sender died mid-way) under a new claim token, so that two processes never send the same one.
UPDATE agent_notifications SET status = 'sending', claim_token = :claim_token, claimed_until = :claimed_until,
    attempts = attempts + 1
WHERE notification_id IN (
    SELECT notification_id FROM agent_notifications
    WHERE (status = 'pending' AND next_attempt_at <= :now) OR (status = 'sending' AND claimed_until < :now)
    ORDER BY notification_id LIMIT :batch)
RETURNING notification_id, run_id, job_name, kind, outcome, detail, url, attempts, claim_token;

-- notification_runs --
-- What a notification says about its run (a JSON array of run ids): slot, outcome, failing step, error, when it first started and ended, operation id; and the latest failed attempt's error and step (a run its flow failed, quit_failure after a step that failed, keeps no error of its own).
SELECT r.run_id, r.job_name, r.scheduled_for, r.status, r.failed_step, r.last_error_number, r.last_error,
       r.finished_at, r.operation_id, r.followed_run_id,
       (SELECT MIN(a.started_at) FROM agent_attempts AS a WHERE a.run_id = r.run_id) AS first_started_at,
       (SELECT a.error_message FROM agent_attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC LIMIT 1) AS attempt_error,
       (SELECT a.error_number FROM agent_attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC LIMIT 1) AS attempt_error_number,
       (SELECT a.step FROM agent_attempts AS a WHERE a.run_id = r.run_id AND a.error_message IS NOT NULL AND a.outcome <> 'succeeded' ORDER BY a.attempt_id DESC LIMIT 1) AS attempt_step
FROM agent_runs AS r
WHERE r.run_id IN (SELECT CAST(x.value AS INTEGER) FROM json_each(:run_ids) AS x);

-- finish_notification --
-- Record one delivery attempt of a claimed notification (sent, to be retried at :next_attempt_at, or failed for good), only while the claim is still this sender's.
UPDATE agent_notifications SET status = :status, next_attempt_at = :next_attempt_at,
    sent_at = CASE WHEN :status = 'sent' THEN :now END, last_error = :last_error,
    claim_token = NULL, claimed_until = NULL
WHERE notification_id = :notification_id AND claim_token = :claim_token
RETURNING notification_id;

-- check_work_transaction --
-- Before the success of a job or step that worked in the agent's own transaction is recorded there: on SQLite every transaction statement of the job's SQL (BEGIN, COMMIT, END, ROLLBACK) is denied by an authorizer before it runs, failing the attempt (Store.run_script); nothing to check (:work_transaction is PostgreSQL's).
SELECT 1 AS active WHERE 0 AND :work_transaction IS NULL;

-- purge_notifications --
-- Retention, a bounded batch per tick (with purge_history): notifications delivered or given up older than AGENT_HISTORY_RETENTION_DAYS; one row back per notification purged.
DELETE FROM agent_notifications WHERE notification_id IN (
    SELECT notification_id FROM agent_notifications
    WHERE status IN ('sent', 'failed', 'unsent') AND next_attempt_at < :history_before
    ORDER BY notification_id LIMIT :batch)
RETURNING 'notifications' AS purged, 1 AS rows_purged;
DELETE FROM agent_alert_firings WHERE firing_id IN (
    SELECT firing_id FROM agent_alert_firings WHERE raised_at < :history_before ORDER BY firing_id LIMIT :batch)
RETURNING 'alert firings' AS purged, 1 AS rows_purged;

-- list_server_databases --
-- Fleet targets are refused on the embedded database (no server to list); no rows.
SELECT name FROM pragma_database_list WHERE 1 = 0;

-- list_pool_databases --
-- Fleet targets are refused on the embedded database; no rows.
SELECT name FROM pragma_database_list WHERE 1 = 0 AND :pool IS NULL;

-- fan_out_targets --
-- Fleet targets are refused on the embedded database at sync; kept for parity with the servers: the run waits for its targets and one execution per target database is created (a JSON array of {n, target_server, target_database}), the first :parallelism let in, execution n runnable from :now + (n - 1) * :stagger_seconds. No row back: the lease was taken over.
UPDATE agent_runs SET awaiting_targets = 1, lease_expires_at = NULL, heartbeat_at = :now,
    target_parallelism = :parallelism, next_step_on_success = :next_on_success,
    next_step_on_failure = :next_on_failure, targets_total = COALESCE(targets_total, 0) + :target_count,
    targets_failed = COALESCE(targets_failed, 0)
WHERE run_id = :run_id AND token = :token AND status = 'running';
INSERT INTO agent_runs (job_name, kind, scheduled_for, status, command, target_database, target_server, overlap,
                        max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at, operation_id, note,
                        parent_run_id, parent_token, retry_interval_seconds, step, params)
SELECT NULL, 'target', :now,
       CASE WHEN json_extract(t.value, '$.n') <= :parallelism THEN 'pending' ELSE 'waiting' END,
       :command, json_extract(t.value, '$.target_database'), json_extract(t.value, '$.target_server'), 'allow',
       :max_attempts, :timeout_seconds, p.lease_seconds,
       strftime('%Y-%m-%d %H:%M:%f', julianday(:now) + (json_extract(t.value, '$.n') - 1) * :stagger_seconds / 86400.0),
       :now, p.operation_id,
       'target of run ' || p.run_id || ', step ' || :step, p.run_id, p.token, :retry_interval_seconds, :step, :params
FROM agent_runs AS p, json_each(:targets) AS t
WHERE p.run_id = :run_id AND p.token = :token AND p.status = 'running' AND p.awaiting_targets = 1
  AND NOT EXISTS (SELECT 1 FROM agent_runs AS x WHERE x.parent_run_id = p.run_id AND x.parent_token = p.token);
SELECT p.run_id, (SELECT COUNT(*) FROM agent_runs AS c WHERE c.parent_run_id = p.run_id AND c.parent_token = p.token) AS created
FROM agent_runs AS p
WHERE p.run_id = :run_id AND p.token = :token AND p.status = 'running' AND p.awaiting_targets = 1;

-- progress_fleets --
-- Fleet targets are refused on the embedded database at sync; kept for parity with the servers (SQLite's single writer serialises it): the next waiting execution takes the place of the one that ended (:run_id at :token), then cancel the executions of runs that no longer wait for them, let waiting executions in up to TARGET_PARALLELISM (each keeping its staggered start), and move on each run whose executions all ended.
UPDATE agent_runs SET status = 'pending', runnable_at = max(runnable_at, :now)
WHERE run_id = (
    SELECT x.run_id
    FROM agent_runs AS e
    JOIN agent_runs AS p ON p.run_id = e.parent_run_id AND p.token = e.parent_token
                        AND p.awaiting_targets = 1 AND p.status = 'running'
    JOIN agent_runs AS x ON x.parent_run_id = e.parent_run_id AND x.parent_token = e.parent_token
                        AND x.status = 'waiting'
    WHERE e.run_id = :run_id AND e.token = :token AND e.status IN ('succeeded', 'failed', 'poisoned')
    ORDER BY x.run_id LIMIT 1)
  AND status = 'waiting';
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = :now, lease_expires_at = NULL,
    note = 'cancelled: its run no longer waits for its targets'
WHERE parent_run_id IS NOT NULL AND (:parent_run_id IS NULL OR parent_run_id = :parent_run_id)
  AND status IN ('waiting', 'pending', 'queued', 'running')
  AND EXISTS (SELECT 1 FROM agent_runs AS p WHERE p.run_id = agent_runs.parent_run_id
                AND (p.awaiting_targets = 0 OR p.status <> 'running' OR p.token <> agent_runs.parent_token));
UPDATE agent_runs SET awaiting_targets = 0
WHERE awaiting_targets = 1 AND status <> 'running' AND (:parent_run_id IS NULL OR run_id = :parent_run_id);
UPDATE agent_runs SET status = 'pending', runnable_at = max(runnable_at, :now)
WHERE status = 'waiting' AND run_id IN (
    SELECT w.run_id FROM agent_runs AS w JOIN agent_runs AS p ON p.run_id = w.parent_run_id AND p.token = w.parent_token
    WHERE w.status = 'waiting' AND p.awaiting_targets = 1 AND p.status = 'running'
      AND (:parent_run_id IS NULL OR p.run_id = :parent_run_id)
      AND (SELECT COUNT(*) FROM agent_runs AS e WHERE e.parent_run_id = p.run_id AND e.parent_token = p.token
             AND e.status = 'waiting' AND e.run_id < w.run_id)
          < p.target_parallelism - (SELECT COUNT(*) FROM agent_runs AS f WHERE f.parent_run_id = p.run_id
                                      AND f.parent_token = p.token AND f.status IN ('pending', 'queued', 'running')));
CREATE TEMP TABLE IF NOT EXISTS agent_fleet_verdicts (run_id INTEGER PRIMARY KEY, token INTEGER, at_step INTEGER,
    total INTEGER, failed INTEGER, next_step INTEGER, summary TEXT);
DELETE FROM temp.agent_fleet_verdicts;
INSERT INTO temp.agent_fleet_verdicts (run_id, token, at_step, total, failed, next_step, summary)
SELECT v.run_id, v.token, v.at_step, v.total, v.failed,
       CASE WHEN v.failed = 0 THEN v.on_success ELSE v.on_failure END,
       CASE WHEN v.failed = 0 THEN NULL ELSE
            'step ' || v.at_step || ': ' || v.failed || ' of ' || v.total || ' target(s) failed: '
            || (SELECT group_concat(name, ', ') FROM (
                    SELECT COALESCE(f.target_server || '/', '') || f.target_database || ' (' || f.status || ')' AS name
                    FROM agent_runs AS f
                    WHERE f.parent_run_id = v.run_id AND f.parent_token = v.token AND f.status <> 'succeeded'
                    ORDER BY f.target_server, f.target_database LIMIT 20))
            || CASE WHEN v.failed > 20 THEN ', ...' ELSE '' END END
FROM (SELECT p.run_id, p.token, p.step AS at_step, p.next_step_on_success AS on_success,
             p.next_step_on_failure AS on_failure, COUNT(c.run_id) AS total,
             COALESCE(SUM(CASE WHEN c.status <> 'succeeded' THEN 1 ELSE 0 END), 0) AS failed,
             SUM(CASE WHEN c.status IN ('waiting', 'pending', 'queued', 'running') THEN 1 ELSE 0 END) AS still_open
      FROM agent_runs AS p
      LEFT JOIN agent_runs AS c ON c.parent_run_id = p.run_id AND c.parent_token = p.token
      WHERE p.awaiting_targets = 1 AND p.status = 'running' AND (:parent_run_id IS NULL OR p.run_id = :parent_run_id)
      GROUP BY p.run_id, p.token, p.step, p.next_step_on_success, p.next_step_on_failure) AS v
WHERE COALESCE(v.still_open, 0) = 0;
UPDATE agent_attempts SET outcome = CASE WHEN v.failed = 0 THEN 'succeeded' ELSE 'failed' END,
    finished_at = :now, error_message = v.summary,
    output = v.total || ' target(s): ' || (v.total - v.failed) || ' succeeded, ' || v.failed || ' failed'
FROM temp.agent_fleet_verdicts AS v
WHERE agent_attempts.run_id = v.run_id AND agent_attempts.token = v.token AND agent_attempts.outcome = 'running';
UPDATE agent_runs SET
    awaiting_targets = 0,
    status = CASE WHEN v.next_step > 0 THEN 'pending' WHEN v.next_step = 0 THEN 'succeeded' ELSE 'failed' END,
    step = CASE WHEN v.next_step > 0 THEN v.next_step ELSE agent_runs.step END,
    failures = 0,
    runnable_at = :now,
    lease_expires_at = NULL,
    finished_at = CASE WHEN v.next_step > 0 THEN NULL ELSE :now END,
    failed_step = CASE WHEN v.failed > 0 THEN v.at_step ELSE agent_runs.failed_step END,
    targets_failed = COALESCE(agent_runs.targets_failed, 0) + v.failed,
    last_error = v.summary,
    last_error_number = NULL
FROM temp.agent_fleet_verdicts AS v
WHERE agent_runs.run_id = v.run_id AND agent_runs.token = v.token
RETURNING agent_runs.run_id, agent_runs.job_name, agent_runs.status, agent_runs.step, agent_runs.targets_total,
          agent_runs.targets_failed, agent_runs.last_error, agent_runs.operation_id;

-- list_run_targets --
-- Fleet runs: the executions (one per target database and visit of a fleet step) of the runs in a JSON array of run ids, in one query whatever the number of runs and targets (history, the job and run pages; the runs_parent index serves it).
SELECT e.parent_run_id, e.parent_token, e.run_id, e.step, e.target_server, e.target_database, e.status, e.attempt,
       e.max_attempts, e.started_at, e.finished_at, e.last_error_number, e.last_error
FROM agent_runs e
WHERE e.parent_run_id IN (SELECT CAST(x.value AS INTEGER) FROM json_each(:run_ids) AS x)
ORDER BY e.parent_run_id, e.run_id;

-- lock_starts --
-- The start lock: SQLite's write lock (BEGIN IMMEDIATE) already serialises every writer; nothing to take.
UPDATE agent_start_lock SET lock_id = lock_id WHERE 1 = 0;

-- run_owner --
-- Whom a run's SQL runs as (migration 0007). The embedded database has no procedures: never an owner (the executor does not ask).
SELECT COALESCE(r.owner, j.owner) AS owner
FROM agent_runs r
LEFT JOIN agent_runs p ON p.run_id = r.parent_run_id
LEFT JOIN agent_jobs j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
WHERE r.run_id = :run_id;

-- session_identity --
-- No server session (the SQL Server dialect asks for its session before a job).
SELECT 0 AS spid, NULL AS babelfish, NULL AS user_name;

-- lock_job_pauses --
-- The pauses lock: SQLite's write lock (BEGIN IMMEDIATE) already serialises `pause`, `resume` and the tick's claims.
SELECT 1 AS locked;

-- pause_job --
-- Pause a job the agent knows (no row: there is none): a pause in force keeps its start and takes the new end, paused_by and reason; one that ended is replaced. Under lock_job_pauses.
INSERT INTO agent_job_pauses AS x (job_name, paused_at, paused_until, paused_by, reason)
SELECT j.job_name, :now, :paused_until, :paused_by, :reason
FROM agent_jobs AS j WHERE j.job_name = :job_name AND j.configured = 1
ON CONFLICT (job_name) DO UPDATE SET
    paused_at = CASE WHEN x.paused_until IS NULL OR x.paused_until > excluded.paused_at THEN x.paused_at
                     ELSE excluded.paused_at END,
    paused_until = excluded.paused_until, paused_by = excluded.paused_by, reason = excluded.reason
RETURNING job_name, paused_at, paused_until, paused_by, reason;

-- settle_paused_runs --
-- After a pause changed (pause, a new --until, resume): decide again the job's scheduled slots that never started and that a pause decided or may decide, against the pause as it now stands, [:pause_start, :pause_end) (:pause_end NULL: until resumed; resume passes :now): held slots are recorded skipped 'paused', slots at or after its end run at their time (brought back if a pause had skipped them), and under run-once the last slot before a known end is the catch-up, runnable at the end (as agent.settle_paused_runs does on the servers: see migration 0012). One row: how many runs it skipped, brought back, and made the catch-up, counted first (the same decisions the UPDATE then writes, in the same transaction). Under lock_job_pauses.
WITH job AS (
    SELECT j.misfire, j.grace_seconds, j.next_due_at,
           CASE WHEN :pause_end IS NULL THEN NULL WHEN :pause_end > :now THEN :pause_end ELSE :now END AS resume_at
    FROM agent_jobs AS j
    WHERE j.job_name = :job_name AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1),
candidate AS (
    SELECT r.run_id, r.scheduled_for, r.status, r.note, r.runnable_at, r.finished_at
    FROM agent_runs AS r
    WHERE r.job_name = :job_name AND r.kind = 'scheduled' AND r.attempt = 0 AND EXISTS (SELECT 1 FROM job)
      AND ((r.status = 'skipped' AND r.note = 'paused' AND r.scheduled_for >= :pause_start)
           OR (r.status IN ('pending', 'queued') AND r.runnable_at >= :now))),
latest AS (
    SELECT MAX(c.scheduled_for) AS slot FROM candidate AS c WHERE :pause_end IS NOT NULL AND c.scheduled_for < :pause_end),
judged AS (
    SELECT c.*, j.resume_at,
           CASE WHEN :pause_end IS NOT NULL AND c.scheduled_for >= :pause_end THEN 'slot'
                WHEN c.scheduled_for = l.slot AND j.misfire = 'run-once'
                     AND (j.next_due_at IS NULL OR j.next_due_at > :pause_end)
                     AND NOT EXISTS (SELECT 1 FROM agent_runs AS e
                                     WHERE e.job_name = :job_name AND e.kind = 'scheduled' AND e.scheduled_for = :pause_end)
                THEN CASE WHEN strftime('%Y-%m-%d %H:%M:%f', c.scheduled_for, '+' || j.grace_seconds || ' seconds') >= j.resume_at
                          THEN 'catch_up' WHEN :pause_end <= :now THEN 'too_late' ELSE 'held' END
                ELSE 'held' END AS decision
    FROM candidate AS c CROSS JOIN job AS j CROSS JOIN latest AS l),
target AS (
    SELECT d.run_id, d.status, d.note, d.runnable_at, d.finished_at,
           CASE WHEN d.decision = 'slot' THEN
                     CASE WHEN d.status = 'queued' AND d.runnable_at = d.scheduled_for THEN 'queued' ELSE 'pending' END
                WHEN d.decision = 'catch_up' THEN
                     CASE WHEN d.status = 'queued' AND d.runnable_at = d.resume_at THEN 'queued' ELSE 'pending' END
                ELSE 'skipped' END AS to_status,
           CASE d.decision WHEN 'slot' THEN NULL WHEN 'catch_up' THEN 'misfire: caught up late, once'
                WHEN 'too_late' THEN 'misfire: slot older than the job''s GRACE_SECONDS; skipped'
                ELSE 'paused' END AS to_note,
           CASE d.decision WHEN 'slot' THEN d.scheduled_for WHEN 'catch_up' THEN d.resume_at
                ELSE d.runnable_at END AS to_runnable
    FROM judged AS d),
changed AS (
    SELECT t.* FROM target AS t
    WHERE t.to_status <> t.status OR t.to_note IS NOT t.note OR t.to_runnable <> t.runnable_at)
SELECT COALESCE(SUM(CASE WHEN c.to_status = 'skipped' AND c.status <> 'skipped' THEN 1 ELSE 0 END), 0) AS runs_skipped,
       COALESCE(SUM(CASE WHEN c.to_status <> 'skipped' AND c.to_note IS NULL THEN 1 ELSE 0 END), 0) AS runs_resumed,
       COALESCE(SUM(CASE WHEN c.to_status <> 'skipped' AND c.to_note IS NOT NULL THEN 1 ELSE 0 END), 0) AS runs_caught_up
FROM changed AS c;
WITH job AS (
    SELECT j.misfire, j.grace_seconds, j.next_due_at,
           CASE WHEN :pause_end IS NULL THEN NULL WHEN :pause_end > :now THEN :pause_end ELSE :now END AS resume_at
    FROM agent_jobs AS j
    WHERE j.job_name = :job_name AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1),
candidate AS (
    SELECT r.run_id, r.scheduled_for, r.status, r.note, r.runnable_at, r.finished_at
    FROM agent_runs AS r
    WHERE r.job_name = :job_name AND r.kind = 'scheduled' AND r.attempt = 0 AND EXISTS (SELECT 1 FROM job)
      AND ((r.status = 'skipped' AND r.note = 'paused' AND r.scheduled_for >= :pause_start)
           OR (r.status IN ('pending', 'queued') AND r.runnable_at >= :now))),
latest AS (
    SELECT MAX(c.scheduled_for) AS slot FROM candidate AS c WHERE :pause_end IS NOT NULL AND c.scheduled_for < :pause_end),
judged AS (
    SELECT c.*, j.resume_at,
           CASE WHEN :pause_end IS NOT NULL AND c.scheduled_for >= :pause_end THEN 'slot'
                WHEN c.scheduled_for = l.slot AND j.misfire = 'run-once'
                     AND (j.next_due_at IS NULL OR j.next_due_at > :pause_end)
                     AND NOT EXISTS (SELECT 1 FROM agent_runs AS e
                                     WHERE e.job_name = :job_name AND e.kind = 'scheduled' AND e.scheduled_for = :pause_end)
                THEN CASE WHEN strftime('%Y-%m-%d %H:%M:%f', c.scheduled_for, '+' || j.grace_seconds || ' seconds') >= j.resume_at
                          THEN 'catch_up' WHEN :pause_end <= :now THEN 'too_late' ELSE 'held' END
                ELSE 'held' END AS decision
    FROM candidate AS c CROSS JOIN job AS j CROSS JOIN latest AS l),
target AS (
    SELECT d.run_id, d.status, d.note, d.runnable_at, d.finished_at,
           CASE WHEN d.decision = 'slot' THEN
                     CASE WHEN d.status = 'queued' AND d.runnable_at = d.scheduled_for THEN 'queued' ELSE 'pending' END
                WHEN d.decision = 'catch_up' THEN
                     CASE WHEN d.status = 'queued' AND d.runnable_at = d.resume_at THEN 'queued' ELSE 'pending' END
                ELSE 'skipped' END AS to_status,
           CASE d.decision WHEN 'slot' THEN NULL WHEN 'catch_up' THEN 'misfire: caught up late, once'
                WHEN 'too_late' THEN 'misfire: slot older than the job''s GRACE_SECONDS; skipped'
                ELSE 'paused' END AS to_note,
           CASE d.decision WHEN 'slot' THEN d.scheduled_for WHEN 'catch_up' THEN d.resume_at
                ELSE d.runnable_at END AS to_runnable
    FROM judged AS d),
changed AS (
    SELECT t.* FROM target AS t
    WHERE t.to_status <> t.status OR t.to_note IS NOT t.note OR t.to_runnable <> t.runnable_at)
UPDATE agent_runs SET status = c.to_status, note = c.to_note, runnable_at = c.to_runnable,
    finished_at = CASE WHEN c.to_status <> 'skipped' THEN NULL WHEN c.status = 'skipped' THEN c.finished_at ELSE :now END,
    lease_expires_at = NULL, token = agent_runs.token + 1
FROM changed AS c
WHERE agent_runs.run_id = c.run_id;

-- resume_job --
-- End a job's pause in force (no row: it is not paused); a pause that already ended is removed too. Under lock_job_pauses.
DELETE FROM agent_job_pauses WHERE job_name = :job_name
RETURNING job_name, paused_at, paused_until,
          CASE WHEN paused_until IS NULL OR paused_until > :now THEN 1 ELSE 0 END AS in_force;

-- stop_overdue_runs --
-- STOP_AFTER_SECONDS (issue 32 item 1), in the tick: every run of a job with the limit still running that long after its attempt started is stopped as `stop JOB` stops a run (stop_job: cancelled, the token bump fences the worker, whose lease renewal finds it gone and stops the work), with a note naming the limit. One statement whatever the number of jobs.
UPDATE agent_runs SET status = 'cancelled', token = token + 1, finished_at = :now, lease_expires_at = NULL,
    note = 'stopped: running longer than STOP_AFTER_SECONDS='
           || (SELECT j.stop_after_seconds FROM agent_jobs AS j WHERE j.job_name = agent_runs.job_name)
           || ' (since ' || strftime('%Y-%m-%dT%H:%M:%SZ', started_at) || ')'
WHERE status = 'running' AND job_name IN (SELECT job_name FROM agent_jobs WHERE stop_after_seconds IS NOT NULL)
  AND julianday(started_at) + (SELECT j.stop_after_seconds FROM agent_jobs AS j WHERE j.job_name = agent_runs.job_name) / 86400.0
      <= julianday(:now)
RETURNING run_id, job_name, scheduled_for, status, note, operation_id;

-- raise_alerts --
-- The alerts of issue 32 items 1-2, in one statement whatever the number of jobs, each written to the outbox at most once per (run, kind) by the unique index; see the PostgreSQL query of the same name. The p95 is the nearest rank over the job's last :history successful runs (a window, as SQLite has no LATERAL).
WITH recent AS (
    SELECT r.job_name, (julianday(r.finished_at) - julianday(r.started_at)) * 86400.0 AS duration,
           ROW_NUMBER() OVER (PARTITION BY r.job_name ORDER BY r.scheduled_for DESC) AS recency
    FROM agent_runs AS r
    WHERE r.job_name IN (SELECT job_name FROM agent_jobs WHERE slower_than IS NOT NULL)
      AND r.status = 'succeeded' AND r.started_at IS NOT NULL AND r.finished_at < :since
      AND NOT EXISTS (SELECT 1 FROM agent_notifications AS n WHERE n.run_id = r.run_id AND n.kind = 'slower')),
ranked AS (
    SELECT job_name, duration, ROW_NUMBER() OVER (PARTITION BY job_name ORDER BY duration) AS rank_no,
           COUNT(*) OVER (PARTITION BY job_name) AS runs
    FROM recent WHERE recency <= :history),
p95 AS (
    SELECT job_name, MIN(duration) AS p95_seconds FROM ranked
    WHERE runs >= :min_history AND rank_no >= (95 * runs + 99) / 100
    GROUP BY job_name),
alerts AS (
    SELECT r.run_id, r.job_name, 'duration' AS kind, r.status AS outcome,
           'running for more than MAX_DURATION_SECONDS=' || j.max_duration_seconds || ' s (started '
               || strftime('%Y-%m-%dT%H:%M:%SZ', r.started_at) || ')' AS detail
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name
    WHERE j.max_duration_seconds IS NOT NULL AND r.status = 'running'
      AND julianday(r.started_at) + j.max_duration_seconds / 86400.0 <= julianday(:now)
    UNION ALL
    SELECT r.run_id, r.job_name, 'stopped', r.status, r.note
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name
    WHERE j.stop_after_seconds IS NOT NULL AND r.status = 'cancelled' AND r.finished_at >= :since
      AND r.scheduled_for >= :oldest_slot
      AND r.note LIKE 'stopped: running longer than STOP_AFTER_SECONDS=%'
    UNION ALL
    SELECT r.run_id, r.job_name, 'slower', r.status,
           'took ' || printf('%.1f', (julianday(COALESCE(r.finished_at, :now)) - julianday(r.started_at)) * 86400.0)
               || ' s, more than SLOWER_THAN=' || j.slower_than || ' x the p95 of its recent successful runs ('
               || printf('%.1f', p.p95_seconds) || ' s)'
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name JOIN p95 AS p ON p.job_name = r.job_name
    WHERE r.started_at IS NOT NULL AND p.p95_seconds > 0
      AND (r.status = 'running' OR (r.status IN ('succeeded', 'failed') AND r.finished_at >= :since
                                     AND r.scheduled_for >= :oldest_slot))
      AND (julianday(COALESCE(r.finished_at, :now)) - julianday(r.started_at)) * 86400.0 > j.slower_than * p.p95_seconds
    UNION ALL
    SELECT r.run_id, r.job_name, 'deadline', r.status,
           'no success within DEADLINE_SECONDS=' || j.deadline_seconds || ' s of the slot '
               || strftime('%Y-%m-%dT%H:%M:%SZ', r.scheduled_for) || ': the run is ' || r.status
               || COALESCE(' (' || r.note || ')', '')
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name
    WHERE j.deadline_seconds IS NOT NULL AND r.kind = 'scheduled'
      AND julianday(r.scheduled_for) + j.deadline_seconds / 86400.0 <= julianday(:now)
      AND julianday(r.scheduled_for) + j.deadline_seconds / 86400.0 > julianday(:since)
      AND NOT (r.status = 'succeeded' AND julianday(r.finished_at) <= julianday(r.scheduled_for) + j.deadline_seconds / 86400.0)
      AND NOT (r.status = 'skipped' AND (r.note LIKE 'paused%' OR r.note LIKE 'calendar:%' OR r.note LIKE 'skipped: the job%')))
INSERT INTO agent_notifications (run_id, job_name, kind, outcome, detail, url, status, attempts, created_at, next_attempt_at)
SELECT a.run_id, a.job_name, a.kind, a.outcome, a.detail,
       COALESCE(j.notify_webhook_url, :default_url, ''),
       CASE WHEN COALESCE(j.notify_webhook_url, :default_url) IS NULL THEN 'unsent' ELSE 'pending' END,
       0, :now, :now
FROM alerts AS a JOIN agent_jobs AS j ON j.job_name = a.job_name
WHERE TRUE
ORDER BY a.run_id, a.kind
ON CONFLICT (run_id, kind) DO NOTHING
RETURNING notification_id, run_id, job_name, kind, outcome, detail, status;

-- next_alert_moment --
-- The earliest moment after :now at which raise_alerts (or stop_overdue_runs) may have something new to say; see the PostgreSQL query of the same name.
SELECT strftime('%Y-%m-%d %H:%M:%f', MIN(moment)) AS next_alert_at FROM (
    SELECT julianday(r.started_at) + j.max_duration_seconds / 86400.0 AS moment
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name
    WHERE j.max_duration_seconds IS NOT NULL AND r.status = 'running'
      AND julianday(r.started_at) + j.max_duration_seconds / 86400.0 > julianday(:now)
    UNION ALL
    SELECT julianday(r.started_at) + j.stop_after_seconds / 86400.0
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name
    WHERE j.stop_after_seconds IS NOT NULL AND r.status = 'running'
      AND julianday(r.started_at) + j.stop_after_seconds / 86400.0 > julianday(:now)
    UNION ALL
    SELECT julianday(r.scheduled_for) + j.deadline_seconds / 86400.0
    FROM agent_runs AS r JOIN agent_jobs AS j ON j.job_name = r.job_name
    WHERE j.deadline_seconds IS NOT NULL AND r.kind = 'scheduled' AND r.status <> 'succeeded'
      AND julianday(r.scheduled_for) + j.deadline_seconds / 86400.0 > julianday(:now)
    UNION ALL
    SELECT julianday(j.next_due_at) + j.deadline_seconds / 86400.0
    FROM agent_jobs AS j
    WHERE j.deadline_seconds IS NOT NULL AND j.next_due_at IS NOT NULL AND j.enabled = 1 AND j.valid = 1) AS m;

-- quiet_horizon --
-- What a quiet tick needs to know (shared/engine/quiet.py): the earliest time anything in the control database can come due: a job's next slot, a pending run (a retry, a delayed or held run), a lease in flight (its expiry), a pause's end, a notification's next delivery; and whether anything is due now or a fleet run waits (then every tick connects). One statement, whatever the job count.
SELECT (SELECT MIN(next_due_at) FROM agent_jobs WHERE next_due_at IS NOT NULL) AS next_slot_at,
       (SELECT MIN(runnable_at) FROM agent_runs WHERE status = 'pending') AS next_runnable_at,
       (SELECT MIN(lease_expires_at) FROM agent_runs WHERE status IN ('queued', 'running')) AS next_lease_at,
       (SELECT COUNT(*) FROM agent_runs WHERE status IN ('queued', 'running') AND lease_expires_at IS NULL) AS unleased,
       (SELECT COUNT(*) FROM agent_runs WHERE status = 'waiting') AS waiting,
       (SELECT MIN(paused_until) FROM agent_job_pauses WHERE paused_until > :now) AS next_pause_end_at,
       (SELECT MIN(CASE WHEN status = 'sending' THEN claimed_until ELSE next_attempt_at END) FROM agent_notifications
        WHERE status IN ('pending', 'sending')) AS next_notification_at,
       (SELECT MIN(CASE WHEN a.valid IS NULL THEN :now
                        WHEN a.probe_query IS NOT NULL THEN COALESCE(a.next_check_at, :now)
                        WHEN EXISTS (SELECT 1 FROM agent_attempts AS t WHERE t.finished_at > a.checked_until
                                     AND t.outcome NOT IN ('running', 'succeeded')) THEN :now END)
        FROM agent_alerts AS a WHERE a.enabled = 1 AND (a.valid IS NULL OR a.valid = 1)) AS next_condition_alert_at;

-- token_context --
-- What a run's SQL Agent tokens need besides the run (shared/jobs/tokens.py): its job's name (a fleet execution's through its run) and time zone. Read only for a command that has a token.
SELECT COALESCE(r.job_name, p.job_name) AS job_name, j.timezone
FROM agent_runs AS r
LEFT JOIN agent_runs AS p ON p.run_id = r.parent_run_id
LEFT JOIN agent_jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name)
WHERE r.run_id = :run_id;

-- sync_settings_alerts --
-- Condition alerts from the settings (a JSON array of {alert_name, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify, notify_webhook_url, response_job, enabled, valid, config_error}): each written as source 'settings', checked again by the next tick when its definition changed (valid NULL), its counters and times kept; a name an alert defined with agent.add_alert holds is left to that alert; settings alerts no longer in the settings are removed. Returns the names a database alert holds.
INSERT INTO agent_alerts (alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds,
                          notify, notify_webhook_url, response_job, enabled, valid, config_error, created_at, updated_at)
SELECT json_extract(x.value, '$.alert_name'), 'settings', NULL, json_extract(x.value, '$.probe_query'),
       json_extract(x.value, '$.schedule'), json_extract(x.value, '$.timezone'), json_extract(x.value, '$.errors'),
       json_extract(x.value, '$.timeout_seconds'), json_extract(x.value, '$.delay_seconds'), json_extract(x.value, '$.notify'),
       json_extract(x.value, '$.notify_webhook_url'), json_extract(x.value, '$.response_job'), json_extract(x.value, '$.enabled'),
       CASE WHEN json_extract(x.value, '$.valid') = 0 THEN 0 END, json_extract(x.value, '$.config_error'), :now, :now
FROM json_each(:alerts) AS x WHERE true
ON CONFLICT (alert_name) DO UPDATE SET
    probe_query = excluded.probe_query, schedule = excluded.schedule, timezone = excluded.timezone, errors = excluded.errors,
    timeout_seconds = excluded.timeout_seconds, delay_seconds = excluded.delay_seconds, notify = excluded.notify,
    notify_webhook_url = excluded.notify_webhook_url, response_job = excluded.response_job, enabled = excluded.enabled,
    valid = excluded.valid, config_error = excluded.config_error, next_check_at = NULL, updated_at = :now
WHERE agent_alerts.source = 'settings'
  AND (agent_alerts.probe_query IS NOT excluded.probe_query OR agent_alerts.schedule IS NOT excluded.schedule
       OR agent_alerts.timezone IS NOT excluded.timezone OR agent_alerts.errors IS NOT excluded.errors
       OR agent_alerts.timeout_seconds IS NOT excluded.timeout_seconds OR agent_alerts.delay_seconds IS NOT excluded.delay_seconds
       OR agent_alerts.notify IS NOT excluded.notify OR agent_alerts.notify_webhook_url IS NOT excluded.notify_webhook_url
       OR agent_alerts.response_job IS NOT excluded.response_job OR agent_alerts.enabled IS NOT excluded.enabled
       OR agent_alerts.config_error IS NOT excluded.config_error OR agent_alerts.valid = 0);
DELETE FROM agent_alerts WHERE source = 'settings'
  AND alert_name NOT IN (SELECT json_extract(x.value, '$.alert_name') FROM json_each(:alerts) AS x);
SELECT a.alert_name FROM agent_alerts AS a
WHERE a.source = 'database' AND a.alert_name IN (SELECT json_extract(x.value, '$.alert_name') FROM json_each(:alerts) AS x);

-- select_alert_work --
-- The condition alerts a tick looks at (shared/engine/condition_alerts.py): every enabled alert not yet checked (valid NULL), every valid probe due at :now, and every valid ERRORS alert (each tick reads the failures since its last check). One statement, whatever the number of alerts.
SELECT alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify,
       notify_webhook_url, response_job, valid, next_check_at, checked_until, updated_at
FROM agent_alerts
WHERE enabled = 1 AND (valid IS NULL OR (valid = 1 AND (errors IS NOT NULL OR next_check_at IS NULL OR next_check_at <= :now)))
ORDER BY alert_name;

-- claim_alert_checks --
-- Claim this tick's checks (a JSON array of {alert_name, seen_check_at, updated_at, next_check_at, valid, config_error}): each alert's next check moves on (and a definition checked records valid and why not), only where no other tick moved it since it was read and the definition is the one read; the alerts returned are this tick's to check. An ERRORS alert starts watching the failures from its first check.
UPDATE agent_alerts SET next_check_at = c.next_check_at, valid = c.valid, config_error = c.config_error,
    checked_until = CASE WHEN c.valid = 1 THEN COALESCE(agent_alerts.checked_until, :now) END
FROM (SELECT json_extract(x.value, '$.alert_name') AS alert_name, json_extract(x.value, '$.seen_check_at') AS seen_check_at,
             json_extract(x.value, '$.updated_at') AS updated_at, json_extract(x.value, '$.next_check_at') AS next_check_at,
             json_extract(x.value, '$.valid') AS valid, json_extract(x.value, '$.config_error') AS config_error
      FROM json_each(:checks) AS x) AS c
WHERE agent_alerts.alert_name = c.alert_name AND agent_alerts.updated_at = c.updated_at
  AND agent_alerts.next_check_at IS c.seen_check_at
RETURNING agent_alerts.alert_name, agent_alerts.valid, agent_alerts.checked_until;

-- alert_failures --
-- The attempts that failed with an error after :since and up to :now, oldest first, at most :limit (ERRORS alerts: shared/engine/condition_alerts.py matches each against each alert's list). One indexed range read; started_by_alert: the alert whose response started the run (its own response's failure does not trigger that alert again).
SELECT a.attempt_id, a.run_id, r.job_name, a.finished_at, a.outcome, a.error_number, a.error_sqlstate,
       substr(a.error_message, 1, 400) AS error_message,
       (SELECT MIN(f.alert_name) FROM agent_alert_firings AS f WHERE f.response_run_id = a.run_id) AS started_by_alert
FROM agent_attempts AS a JOIN agent_runs AS r ON r.run_id = a.run_id
WHERE a.finished_at > :since AND a.finished_at <= :now AND a.outcome NOT IN ('running', 'succeeded')
  AND a.error_message IS NOT NULL
ORDER BY a.finished_at, a.attempt_id LIMIT :limit;

-- record_alert_results --
-- What this tick's checks found (a JSON array of {alert_name, triggered, error, checked_until, next_response_at}), in one statement: counts and times of occurrences; the probe's error (error_since: when it started failing); the failures looked at; and a response where one occurred and the delay since the last response has passed (next_response_at <= :now). Returns each alert with fired 1 when this check responds, and failing 1 when its probe has just started failing.
UPDATE agent_alerts SET
    last_checked_at = :now,
    last_error = r.error,
    error_since = CASE WHEN r.error IS NULL THEN NULL ELSE COALESCE(agent_alerts.error_since, :now) END,
    occurrences = agent_alerts.occurrences + r.triggered,
    last_occurred_at = CASE WHEN r.triggered = 1 THEN :now ELSE agent_alerts.last_occurred_at END,
    checked_until = COALESCE(r.checked_until, agent_alerts.checked_until),
    last_response_at = CASE WHEN r.triggered = 1 AND (agent_alerts.next_response_at IS NULL OR agent_alerts.next_response_at <= :now)
                            THEN :now ELSE agent_alerts.last_response_at END,
    responses = agent_alerts.responses + CASE WHEN r.triggered = 1 AND (agent_alerts.next_response_at IS NULL OR agent_alerts.next_response_at <= :now)
                                              THEN 1 ELSE 0 END,
    next_response_at = CASE WHEN r.triggered = 1 AND (agent_alerts.next_response_at IS NULL OR agent_alerts.next_response_at <= :now)
                            THEN r.next_response_at ELSE agent_alerts.next_response_at END
FROM (SELECT json_extract(x.value, '$.alert_name') AS alert_name, json_extract(x.value, '$.triggered') AS triggered,
             json_extract(x.value, '$.error') AS error, json_extract(x.value, '$.checked_until') AS checked_until,
             json_extract(x.value, '$.next_response_at') AS next_response_at
      FROM json_each(:results) AS x) AS r
WHERE agent_alerts.alert_name = r.alert_name
RETURNING agent_alerts.alert_name, CASE WHEN agent_alerts.last_response_at = :now THEN 1 ELSE 0 END AS fired,
          CASE WHEN agent_alerts.last_error IS NOT NULL AND agent_alerts.error_since = :now THEN 1 ELSE 0 END AS failing;

-- insert_alert_firings --
-- The responses of this tick (a JSON array of {alert_name, kind, detail, url, notify}): one row of agent_alert_firings each and, when it notifies, its notification in the outbox (run_id: the firing's id, kind 'condition', 'errors' or 'alert_error'; with no webhook, recorded 'unsent'). Returns each firing.
INSERT INTO agent_alert_firings (alert_name, kind, raised_at, detail)
SELECT json_extract(x.value, '$.alert_name'), json_extract(x.value, '$.kind'), :now, json_extract(x.value, '$.detail')
FROM json_each(:firings) AS x ORDER BY x.key
RETURNING firing_id, alert_name, kind;
INSERT INTO agent_notifications (run_id, job_name, outcome, url, status, attempts, created_at, next_attempt_at, kind, detail)
SELECT f.firing_id, f.alert_name, 'alert', COALESCE(json_extract(x.value, '$.url'), ''),
       CASE WHEN json_extract(x.value, '$.url') IS NULL THEN 'unsent' ELSE 'pending' END, 0, :now, :now, f.kind, f.detail
FROM agent_alert_firings AS f
JOIN json_each(:firings) AS x ON json_extract(x.value, '$.alert_name') = f.alert_name AND json_extract(x.value, '$.kind') = f.kind
WHERE f.raised_at = :now AND json_extract(x.value, '$.notify') = 1
ON CONFLICT (run_id, kind) DO NOTHING;

-- set_alert_response --
-- The run a firing started (RESPONSE_JOB), or why none was started.
UPDATE agent_alert_firings SET response_run_id = :run_id, response_error = :response_error WHERE firing_id = :firing_id;

-- list_alerts --
-- sql-agent alerts and the monitor: every condition alert with its state, by name.
SELECT alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds, delay_seconds, notify,
       notify_webhook_url, response_job, enabled, valid, config_error, next_check_at, last_checked_at, last_occurred_at,
       last_response_at, next_response_at, occurrences, responses, last_error, error_since, updated_at
FROM agent_alerts ORDER BY alert_name;

-- list_alert_firings --
-- The latest responses of condition alerts (optionally of one alert), newest first.
SELECT firing_id, alert_name, kind, raised_at, detail, response_run_id, response_error
FROM agent_alert_firings WHERE (:alert_name IS NULL OR alert_name = :alert_name)
ORDER BY firing_id DESC LIMIT :limit;

-- set_probe_timeout --
-- A probe's time limit (PostgreSQL: statement_timeout for its transaction). The embedded database bounds a probe with a progress handler instead: nothing to do here.
SELECT :timeout_ms AS timeout_ms WHERE 1 = 0;

-- prepare_probe --
-- Where a probe's rows are put (SQL Server: a temporary table). The embedded database reads them from its cursor: nothing to do here.
SELECT 1 AS prepared WHERE 1 = 0;

-- probe_rows --
-- A probe's rows as JSON (PostgreSQL: the setting the probe's SELECT wrote; SQL Server: the temporary table). The embedded database reads them from its cursor: none here.
SELECT NULL AS rows_json WHERE 1 = 0;

-- probe_read_only --
-- A condition alert's probe run as the agent itself: its transaction is read-only from the first statement (PostgreSQL); SQLite sets query_only on the probe's connection instead, SQL Server relies on the rollback.
UPDATE agent_state SET state_value = state_value WHERE 1 = 0;

-- get_job_definition --
-- One job as agent.add_scheduled_job's arguments hold it (the monitor's job form, issue 32 item 6), with where it is defined and its owner. The embedded database has no procedures: every job here is a settings job, shown read-only.
SELECT j.job_name, j.schedule, j.timezone, j.command, j.target_database, j.enabled, j.max_attempts, j.timeout_seconds,
       j.lease_seconds, j.misfire, j.grace_seconds, j.overlap, j.requested_targets, j.requested_target_parallelism,
       COALESCE(j.requested_target_stagger_seconds, 0) AS requested_target_stagger_seconds, j.after_job, j.after_outcome,
       COALESCE(j.catchup_seconds, 0) AS catchup_seconds, j.owner, j.defined_in_database, j.configured, j.valid,
       j.config_error, j.calendars, j.jitter_seconds,
       j.requested_steps
FROM agent_jobs j
WHERE j.job_name = :job_name;

-- define_job --
-- The monitor's job form calls agent.add_scheduled_job's body on PostgreSQL and SQL Server; the embedded database has no procedures and the monitor refuses a definition before it (shared/engine/operations.py, define_job). The same parameters, answered with no row.
SELECT :job_name AS job_name, 'refused' AS action WHERE :sql IS NULL AND :schedule IS NULL AND :run_at IS NULL AND :timezone IS NULL
  AND :enabled IS NULL AND :max_attempts IS NULL AND :timeout_seconds IS NULL AND :overlap IS NULL AND :database IS NULL
  AND :misfire IS NULL AND :grace_seconds IS NULL AND :lease_seconds IS NULL AND :targets IS NULL
  AND :target_parallelism IS NULL AND :after IS NULL AND :after_outcome IS NULL AND :target_stagger_seconds IS NULL
  AND :catchup_seconds IS NULL AND 1 = 0;

-- remove_job --
-- No procedures here (see define_job): the monitor refuses a removal before it. No row.
SELECT :job_name AS job_name, 0 AS skipped_runs WHERE 1 = 0;

-- set_job_owner --
-- Whom a job defined from the monitor runs as (PostgreSQL and SQL Server; here no job is defined in the database).
UPDATE agent_jobs SET owner = :owner WHERE job_name = :job_name AND defined_in_database = 1;

-- set_job_steps --
-- No procedures here (see define_job): the monitor refuses a definition before it. No row.
SELECT :job_name AS job, :steps AS requested_steps WHERE 1 = 0;
