-- 0010 jobs that follow jobs (issue 27 item 3): JOB__<b>__AFTER=<a> (agent.add_scheduled_job
-- @after): a run of a that ends with b's AFTER_OUTCOME (succeeded, failed or completed) starts a
-- run of b, created in the very transaction that records a's end (start_follow_up_runs, chained
-- after each ending statement), so it exists exactly when a's end does.
--
-- agent.jobs.after_job, after_outcome: whom the job follows, and on which end (NULL: no one).
-- agent.runs.followed_run_id: the run whose end started this one. Unique with the job's name:
-- two transactions ending the same run (a lapsed worker and the retried run's) can never both
-- create its follow-up; the fenced ending lets only one of them end it in the first place.

ALTER TABLE agent.jobs ADD COLUMN after_job VARCHAR(64) NULL;
ALTER TABLE agent.jobs ADD COLUMN after_outcome VARCHAR(16) NULL;
ALTER TABLE agent.jobs ADD CONSTRAINT jobs_after_outcome_check CHECK (after_outcome IN ('succeeded', 'failed', 'completed'));
CREATE INDEX jobs_after_job ON agent.jobs (after_job) WHERE after_job IS NOT NULL;
ALTER TABLE agent.runs ADD COLUMN followed_run_id BIGINT NULL;
CREATE UNIQUE INDEX runs_followed ON agent.runs (followed_run_id, job_name) WHERE followed_run_id IS NOT NULL;

-- The follow-up statement, chained into every transaction that ends runs: a function, so that
-- its plan is made once per session (as agent.finish_run's, 0002), and a job-less database (no
-- job follows another) pays one probe of the jobs_after_job index.
CREATE FUNCTION agent.start_follow_up_runs(p_now timestamp)
RETURNS TABLE (run_id bigint, job_name varchar, followed_run_id bigint, operation_id varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- Most control databases have no job that follows another: one probe of a partial index.
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS x WHERE x.after_job IS NOT NULL) THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO agent.runs AS n (job_name, kind, scheduled_for, status, command, target_database, overlap,
                                 max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                                 operation_id, note, steps, followed_run_id)
    SELECT f.job_name, 'manual',
           p_now + (ROW_NUMBER() OVER (PARTITION BY f.job_name ORDER BY r.run_id) - 1) * INTERVAL '1 millisecond',
           'pending', f.command, f.target_database, f.overlap, f.max_attempts, f.timeout_seconds, f.lease_seconds,
           p_now, p_now, r.operation_id,
           'after run ' || CAST(r.run_id AS VARCHAR) || ' of ' || r.job_name || ' (' || r.status || ')', f.steps, r.run_id
    FROM agent.runs AS r
    JOIN agent.jobs AS f ON f.after_job = r.job_name AND f.enabled = 1 AND f.valid = 1 AND f.configured = 1
    WHERE r.finished_at = p_now AND r.kind <> 'target'
      AND NOT EXISTS (SELECT 1 FROM agent.job_pauses AS p
                      WHERE p.job_name = f.job_name AND (p.paused_until IS NULL OR p.paused_until > p_now))
      AND ((f.after_outcome = 'succeeded' AND r.status = 'succeeded')
           OR (f.after_outcome = 'failed' AND r.status IN ('failed', 'poisoned'))
           OR (f.after_outcome = 'completed' AND r.status IN ('succeeded', 'failed', 'poisoned')))
    ORDER BY f.job_name, r.run_id
    ON CONFLICT DO NOTHING
    RETURNING n.run_id, n.job_name, n.followed_run_id, n.operation_id;
END
$$;

-- The activity view (as 0009 defined it, with the pause) shows whom each job follows too
-- (after_job, after_outcome).
DROP VIEW agent.job_activity;
CREATE VIEW agent.job_activity AS
SELECT j.job_name,
       CASE WHEN j.defined_in_database = 1 THEN 'database' ELSE 'settings' END AS defined_in,
       CASE WHEN j.configured = 0 THEN 'removed' WHEN j.valid = 0 THEN 'invalid'
            WHEN j.enabled = 0 THEN 'disabled' WHEN j.needs_planning = 1 THEN 'planning'
            WHEN p.job_name IS NOT NULL THEN 'paused' WHEN c.run_id IS NOT NULL THEN 'running'
            WHEN j.next_due_at IS NULL AND n.next_slot IS NULL THEN 'idle' ELSE 'scheduled' END AS state,
       j.enabled, j.schedule, j.timezone, COALESCE(n.next_slot, j.next_due_at) AS next_run_at,
       c.run_id AS running_run_id, c.started_at AS running_since, c.worker AS running_worker,
       l.run_id AS last_run_id, l.status AS last_outcome, l.finished_at AS last_finished_at,
       l.last_error AS last_error, j.config_error,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason, j.after_job, j.after_outcome
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p
       ON p.job_name = j.job_name
      AND (p.paused_until IS NULL OR p.paused_until > CAST(now() AT TIME ZONE 'UTC' AS timestamp))
LEFT JOIN LATERAL (
    SELECT r.run_id, r.started_at, r.worker FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status = 'running'
    ORDER BY r.started_at, r.run_id LIMIT 1) AS c ON TRUE
LEFT JOIN LATERAL (
    SELECT MIN(r.scheduled_for) AS next_slot FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued')) AS n ON TRUE
LEFT JOIN LATERAL (
    SELECT r.run_id, r.status, r.finished_at, r.last_error FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status IN ('succeeded', 'failed', 'poisoned', 'skipped', 'cancelled')
    ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1) AS l ON TRUE;
GRANT SELECT ON agent.job_activity TO agent_operator;

-- The history view shows which run a follow-up run followed (views are dropped and created
-- again, never altered: Babelfish has no ALTER VIEW, and the dialects stay alike).
DROP VIEW agent.job_history;
CREATE VIEW agent.job_history AS
SELECT r.run_id, a.attempt, r.job_name, r.kind, r.scheduled_for, a.started_at, a.finished_at,
       CAST(EXTRACT(EPOCH FROM (a.finished_at - a.started_at)) * 1000 AS BIGINT) AS duration_ms,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.worker, r.note, r.followed_run_id
FROM agent.attempts AS a
JOIN agent.runs AS r ON r.run_id = a.run_id
UNION ALL
SELECT r.run_id, NULL, r.job_name, r.kind, r.scheduled_for, r.started_at, r.finished_at, NULL,
       r.status, r.last_error_number, NULL, r.last_error, r.worker, r.note, r.followed_run_id
FROM agent.runs AS r
WHERE r.status IN ('succeeded', 'failed', 'poisoned', 'skipped', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM agent.attempts AS x WHERE x.run_id = r.run_id);
GRANT SELECT ON agent.job_history TO agent_operator;

-- agent.add_scheduled_job (0008) with @after and @after_outcome: a new signature, so the old
-- function goes and its grants are given again.
DROP FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int);
CREATE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL,
                                        run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC',
                                        enabled int DEFAULT 1, max_attempts int DEFAULT 3,
                                        timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip',
                                        "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once',
                                        grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60,
                                        targets varchar DEFAULT NULL, target_parallelism int DEFAULT 8,
                                        "after" varchar DEFAULT NULL, after_outcome varchar DEFAULT 'succeeded')
RETURNS TABLE (job_name varchar, action text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_schedule varchar;
    v_existing record;
    v_action text := 'defined';
    v_leader varchar;
    v_cycle text;
    p text := 'agent.add_scheduled_job: ';
BEGIN
    IF add_scheduled_job.name IS NULL OR add_scheduled_job.name !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = '
            || COALESCE(quote_literal(left(add_scheduled_job.name, 80)), 'NULL') || ': expected a job name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
    END IF;
    IF add_scheduled_job.sql IS NULL OR btrim(add_scheduled_job.sql) = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@sql = '
            || COALESCE(quote_literal(add_scheduled_job.sql), 'NULL') || ': expected the SQL to run (non-empty)';
    END IF;
    IF add_scheduled_job.run_at IS NOT NULL AND NOT (add_scheduled_job.run_at >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                                    AND add_scheduled_job.run_at < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@run_at = '
            || quote_literal(add_scheduled_job.run_at::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC)';
    END IF;
    IF add_scheduled_job.schedule IS NOT NULL AND add_scheduled_job.run_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@run_at = '
            || add_scheduled_job.run_at::text || ': expected NULL when @schedule is given (one or the other)';
    END IF;
    IF add_scheduled_job.schedule IS NOT NULL AND (btrim(add_scheduled_job.schedule) = '' OR length(add_scheduled_job.schedule) > 400) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@schedule = '
            || quote_literal(left(add_scheduled_job.schedule, 80)) || ': expected a six-field NCRONTAB expression (seconds first) of at most 400 characters';
    END IF;
    IF add_scheduled_job.timezone IS NULL OR add_scheduled_job.timezone !~ '^[A-Za-z0-9_+/-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@timezone = '
            || COALESCE(quote_literal(left(add_scheduled_job.timezone, 80)), 'NULL') || ': expected an IANA time zone name such as UTC or Europe/Paris';
    END IF;
    IF add_scheduled_job.enabled IS NULL OR add_scheduled_job.enabled NOT IN (0, 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@enabled = '
            || COALESCE(add_scheduled_job.enabled::text, 'NULL') || ': expected 1 (enabled) or 0 (disabled)';
    END IF;
    IF add_scheduled_job.max_attempts IS NULL OR add_scheduled_job.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@max_attempts = '
            || COALESCE(add_scheduled_job.max_attempts::text, 'NULL') || ': expected a whole number from 1 to 100';
    END IF;
    IF add_scheduled_job.timeout_seconds IS NULL OR add_scheduled_job.timeout_seconds NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@timeout_seconds = '
            || COALESCE(add_scheduled_job.timeout_seconds::text, 'NULL') || ': expected a whole number from 1 to 604800';
    END IF;
    IF add_scheduled_job.overlap IS NULL OR lower(add_scheduled_job.overlap) NOT IN ('skip', 'queue', 'allow') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@overlap = '
            || COALESCE(quote_literal(left(add_scheduled_job.overlap, 80)), 'NULL') || ': expected skip, queue or allow';
    END IF;
    IF add_scheduled_job."database" IS NOT NULL AND add_scheduled_job."database" !~ '^[A-Za-z0-9_-]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@database = '
            || quote_literal(left(add_scheduled_job."database", 140)) || ': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
    END IF;
    IF add_scheduled_job.misfire IS NULL OR lower(add_scheduled_job.misfire) NOT IN ('run-once', 'skip') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@misfire = '
            || COALESCE(quote_literal(left(add_scheduled_job.misfire, 80)), 'NULL') || ': expected run-once or skip';
    END IF;
    IF add_scheduled_job.grace_seconds IS NULL OR add_scheduled_job.grace_seconds NOT BETWEEN 0 AND 31622400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@grace_seconds = '
            || COALESCE(add_scheduled_job.grace_seconds::text, 'NULL') || ': expected a whole number from 0 to 31622400';
    END IF;
    IF add_scheduled_job.lease_seconds IS NULL OR add_scheduled_job.lease_seconds NOT BETWEEN 6 AND 3600 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@lease_seconds = '
            || COALESCE(add_scheduled_job.lease_seconds::text, 'NULL') || ': expected a whole number from 6 to 3600';
    END IF;
    IF add_scheduled_job.targets IS NOT NULL AND (btrim(add_scheduled_job.targets) = '' OR length(add_scheduled_job.targets) > 4000) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@targets = '
            || quote_literal(left(add_scheduled_job.targets, 80)) || ': expected NULL (one database) or a comma list of at most 4000 characters of members such as db:tenant_*, server:<server> or -db:<name>';
    END IF;
    IF add_scheduled_job.targets IS NOT NULL AND add_scheduled_job."database" IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@database = '
            || quote_literal(add_scheduled_job."database") || ': expected NULL when @targets is given (a job runs in its @targets or in one @database, not both)';
    END IF;
    IF add_scheduled_job.target_parallelism IS NULL OR add_scheduled_job.target_parallelism NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@target_parallelism = '
            || COALESCE(add_scheduled_job.target_parallelism::text, 'NULL') || ': expected a whole number from 1 to 1000 (how many target databases of one run at once)';
    END IF;
    IF add_scheduled_job."after" IS NOT NULL AND add_scheduled_job."after" !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = '
            || quote_literal(left(add_scheduled_job."after", 80)) || ': expected NULL (a job that follows no job) or the name of the job whose runs start this one';
    END IF;
    IF add_scheduled_job.after_outcome IS NULL OR lower(add_scheduled_job.after_outcome) NOT IN ('succeeded', 'failed', 'completed') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after_outcome = '
            || COALESCE(quote_literal(left(add_scheduled_job.after_outcome, 80)), 'NULL') || ': expected succeeded, failed or completed';
    END IF;
    -- Neither @schedule nor @run_at: an on-demand job (stored with an empty schedule, as a job in
    -- the settings without SCHEDULE): it claims no slot and runs when started (agent.start_job).
    v_schedule := COALESCE(btrim(add_scheduled_job.schedule),
        '@once ' || to_char(add_scheduled_job.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00',
        '');
    -- The job-definitions lock: the settings sync and these functions decide names one at a time.
    PERFORM pg_advisory_xact_lock(7428014);
    SELECT j.job_name, j.defined_in_database, j.configured INTO v_existing FROM agent.jobs j
    WHERE lower(j.job_name) = lower(add_scheduled_job.name)
    ORDER BY (j.job_name = add_scheduled_job.name) DESC LIMIT 1;
    IF FOUND AND v_existing.job_name <> add_scheduled_job.name THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(add_scheduled_job.name)
            || ': expected a name no other job holds; it differs only by case from job ' || quote_literal(v_existing.job_name)
            || ' (job names are compared case-insensitively, as Azure SQL does)';
    END IF;
    IF FOUND AND v_existing.defined_in_database = 0 AND v_existing.configured = 1 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(add_scheduled_job.name)
            || ': expected a job defined in the database; this job is defined in the app settings (JOB__'
            || add_scheduled_job.name || '__*): change or remove it there';
    END IF;
    IF FOUND AND v_existing.configured = 1 THEN
        v_action := 'redefined';
    END IF;
    -- @after: a job that exists now (from the settings or from here), by its name as written, and
    -- no cycle: the chain of jobs it follows, walked up from it, never comes back to this one.
    IF add_scheduled_job."after" IS NOT NULL THEN
        SELECT j.job_name INTO v_leader FROM agent.jobs j
        WHERE lower(j.job_name) = lower(add_scheduled_job."after") AND j.configured = 1
        ORDER BY (j.job_name = add_scheduled_job."after") DESC LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job."after")
                || ': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
        END IF;
        WITH RECURSIVE chain (job_name, after_job, shown, seen) AS (
            SELECT j.job_name, j.after_job, CAST(j.job_name AS text), ARRAY[CAST(j.job_name AS text)]
            FROM agent.jobs j WHERE j.job_name = v_leader
            UNION ALL
            SELECT j.job_name, j.after_job, CAST(j.job_name AS text) || ' -> ' || c.shown, c.seen || CAST(j.job_name AS text)
            FROM chain c JOIN agent.jobs j ON j.job_name = c.after_job AND j.configured = 1
            WHERE lower(c.job_name) <> lower(add_scheduled_job.name) AND NOT (CAST(j.job_name AS text) = ANY (c.seen)))
        SELECT c.shown INTO v_cycle FROM chain c WHERE lower(c.job_name) = lower(add_scheduled_job.name) LIMIT 1;
        IF v_cycle IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job."after")
                || ': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                || v_cycle || ' -> ' || add_scheduled_job.name || ': a run of each would start the next, forever)';
        END IF;
    END IF;
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE r.job_name = add_scheduled_job.name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued');
    INSERT INTO agent.jobs AS j (job_name, schedule, timezone, command, target_database, enabled, valid,
                                 config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                 grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                 defined_in_database, needs_planning, steps, requested_targets,
                                 requested_target_parallelism, owner, after_job, after_outcome)
    VALUES (add_scheduled_job.name, v_schedule, add_scheduled_job.timezone, add_scheduled_job.sql,
            add_scheduled_job."database", add_scheduled_job.enabled, 1, NULL, add_scheduled_job.max_attempts,
            add_scheduled_job.timeout_seconds, add_scheduled_job.lease_seconds, lower(add_scheduled_job.misfire),
            add_scheduled_job.grace_seconds, lower(add_scheduled_job.overlap), NULL, NULL, 1, v_now, 1, 1, NULL,
            btrim(add_scheduled_job.targets), add_scheduled_job.target_parallelism,
            CAST(session_user AS varchar), v_leader,
            CASE WHEN v_leader IS NOT NULL THEN lower(add_scheduled_job.after_outcome) END)
    ON CONFLICT (job_name) DO UPDATE SET
        schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, command = EXCLUDED.command,
        target_database = EXCLUDED.target_database, enabled = EXCLUDED.enabled, valid = 1, config_error = NULL,
        max_attempts = EXCLUDED.max_attempts, timeout_seconds = EXCLUDED.timeout_seconds,
        lease_seconds = EXCLUDED.lease_seconds, misfire = EXCLUDED.misfire, grace_seconds = EXCLUDED.grace_seconds,
        overlap = EXCLUDED.overlap, next_due_at = NULL, advanced_at = NULL, configured = 1,
        updated_at = EXCLUDED.updated_at, defined_in_database = 1, needs_planning = EXCLUDED.needs_planning,
        steps = NULL, requested_targets = EXCLUDED.requested_targets,
        requested_target_parallelism = EXCLUDED.requested_target_parallelism, owner = EXCLUDED.owner,
        after_job = EXCLUDED.after_job, after_outcome = EXCLUDED.after_outcome;
    RETURN QUERY SELECT CAST(add_scheduled_job.name AS varchar), v_action;
END
$$;
REVOKE ALL ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar) TO agent_operator;
