-- 0012 chains and pauses (issue 34, items 3 to 6).
--
-- Item 3, no path creates a cycle: agent.add_scheduled_job checks @after against every job
-- defined now, removed ones that this call defines again included (a job that follows the
-- name being defined closes a cycle whether or not a job of that name exists), names compared
-- case-insensitively, a self-reference refused before the name is looked up, the walk up the
-- chain unbounded but visiting each job once. A redefinition lets the next tick sync the
-- settings again (a settings job refused for a cycle through this job may be valid now).
--
-- Item 4, the run-time guard: agent.runs.chain holds the jobs of the runs that led to a
-- follow-up run ('/a/b/'): start_follow_up_runs records skipped, with the reason, a follow-up
-- for a job already in its chain or past 100 jobs, and the job events say it once.
--
-- Items 5 and 6, pause and resume: slots claimed ahead inside a pause are recorded skipped
-- 'paused' as before, and brought back when the pause no longer holds them (resume, or a new
-- @until before them): agent.settle_paused_runs, called by pause_job and resume_job (and the
-- pause_job / resume_job named queries). A redefinition or removal turns a paused slot ahead
-- into a slot of the old definition (never brought back).

CREATE OR REPLACE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL,
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
    v_path text[];
    v_count int;
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
    -- @after: no cycle, checked first (a job that follows itself need not exist yet); then a job
    -- that exists now (from the settings or from here), by its name as written; then the chain
    -- of jobs it follows, walked up from it through every job defined now (either source,
    -- enabled or not), never reaches a job that follows this one's name, whether or not a job of
    -- that name exists now (it was removed, and this call defines it again). Names compare
    -- case-insensitively, as Azure SQL compares them; the walk visits each job once at most.
    IF add_scheduled_job."after" IS NOT NULL AND lower(add_scheduled_job."after") = lower(add_scheduled_job.name) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job."after")
            || ': expected a chain that ends; this one is a cycle of jobs that follow each other ('
            || add_scheduled_job.name || ' -> ' || add_scheduled_job.name || ': a run of each would start the next, forever)';
    END IF;
    IF add_scheduled_job."after" IS NOT NULL THEN
        SELECT j.job_name INTO v_leader FROM agent.jobs j
        WHERE lower(j.job_name) = lower(add_scheduled_job."after") AND j.configured = 1
        ORDER BY (j.job_name = add_scheduled_job."after") DESC LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job."after")
                || ': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
        END IF;
        WITH RECURSIVE chain (job_name, after_job, path, seen) AS (
            SELECT j.job_name, j.after_job, ARRAY[CAST(j.job_name AS text)], ARRAY[lower(j.job_name)]
            FROM agent.jobs j WHERE j.job_name = v_leader
            UNION ALL
            SELECT j.job_name, j.after_job, c.path || CAST(j.job_name AS text), c.seen || lower(j.job_name)
            FROM chain c JOIN agent.jobs j ON lower(j.job_name) = lower(c.after_job) AND j.configured = 1
            WHERE lower(c.after_job) <> lower(add_scheduled_job.name) AND NOT (lower(j.job_name) = ANY (c.seen)))
        SELECT c.path INTO v_path FROM chain c WHERE lower(c.after_job) = lower(add_scheduled_job.name) LIMIT 1;
        IF v_path IS NOT NULL THEN
            -- In the order runs start each other (the walk reversed); a long cycle shows its first
            -- and last four jobs and how many between (shared/jobs/chains.py, show_chain).
            v_count := array_length(v_path, 1);
            SELECT string_agg(s.x, ' -> ' ORDER BY s.ord DESC) INTO v_cycle FROM (
                SELECT u.x, CAST(u.ord AS numeric) AS ord FROM unnest(v_path) WITH ORDINALITY AS u(x, ord)
                WHERE v_count <= 8 OR u.ord > v_count - 4 OR u.ord <= 4
                UNION ALL
                SELECT '... (' || (v_count - 8) || ' more)', 4.5 WHERE v_count > 8) AS s;
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job."after")
                || ': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                || add_scheduled_job.name || ' -> ' || v_cycle || ' -> ' || add_scheduled_job.name
                || ': a run of each would start the next, forever)';
        END IF;
    END IF;
    -- The slots claimed under the old definition, those a pause recorded skipped ahead included
    -- (a resume must not bring back a slot of a schedule that is gone).
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE r.job_name = add_scheduled_job.name AND r.kind = 'scheduled'
      AND (r.status IN ('pending', 'queued')
           OR (r.status = 'skipped' AND r.note = 'paused' AND r.attempt = 0 AND r.scheduled_for >= v_now));
    -- A settings job refused because its AFTER closed a cycle through this job may be valid now:
    -- the next tick syncs the settings again.
    DELETE FROM agent.state AS s WHERE s.state_key = 'job_config_hash';
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

-- Item 4: the chain of jobs a follow-up run carries ('/a/b/': the jobs of the runs whose ends
-- led to it, the first first; NULL for a run no end started).
ALTER TABLE agent.runs ADD COLUMN chain TEXT NULL;

-- start_follow_up_runs (0010) with the run-time guard: the follow-up of a job already in the
-- chain of the run that ended, or one that would make the chain longer than p_max_chain_jobs,
-- is recorded skipped with the reason instead of started (definitions may have changed while
-- the chain's runs were in flight, or a row was written by hand: the chain ends there), and the
-- job events say it once per reason and definition of the job (not at every recurrence).
DROP FUNCTION agent.start_follow_up_runs(timestamp);
CREATE FUNCTION agent.start_follow_up_runs(p_now timestamp, p_max_chain_jobs int)
RETURNS TABLE (run_id bigint, job_name varchar, followed_run_id bigint, operation_id varchar, status varchar, note text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- Most control databases have no job that follows another: one probe of a partial index.
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS x WHERE x.after_job IS NOT NULL) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH followers AS (
        SELECT f.job_name, f.command, f.target_database, f.overlap, f.max_attempts, f.timeout_seconds,
               f.lease_seconds, f.steps, r.run_id AS followed_run_id, r.job_name AS followed_job,
               r.status AS followed_status, r.operation_id,
               COALESCE(r.chain, '/') || r.job_name || '/' AS chain,
               ROW_NUMBER() OVER (PARTITION BY f.job_name ORDER BY r.run_id) AS nth
        FROM agent.runs AS r
        JOIN agent.jobs AS f ON f.after_job = r.job_name AND f.enabled = 1 AND f.valid = 1 AND f.configured = 1
        WHERE r.finished_at = p_now AND r.kind <> 'target'
          AND NOT EXISTS (SELECT 1 FROM agent.job_pauses AS p
                          WHERE p.job_name = f.job_name AND (p.paused_until IS NULL OR p.paused_until > p_now))
          AND ((f.after_outcome = 'succeeded' AND r.status = 'succeeded')
               OR (f.after_outcome = 'failed' AND r.status IN ('failed', 'poisoned'))
               OR (f.after_outcome = 'completed' AND r.status IN ('succeeded', 'failed', 'poisoned')))),
    judged AS (
        SELECT w.*,
               CASE WHEN position('/' || lower(w.job_name) || '/' IN lower(w.chain)) > 0
                    THEN 'job ' || w.job_name || ' is already in this chain of runs ('
                         || replace(substring(w.chain FROM position('/' || lower(w.job_name) || '/' IN lower(w.chain)) + 1), '/', ' -> ')
                         || w.job_name || '); a chain of jobs that follow each other must end: check their AFTER'
                    WHEN length(w.chain) - length(replace(w.chain, '/', '')) - 1 >= p_max_chain_jobs
                    THEN 'the chain of runs already holds ' || CAST(p_max_chain_jobs AS varchar)
                         || ' jobs, the most one chain may hold' END AS refusal
        FROM followers AS w),
    started AS (
        INSERT INTO agent.runs AS n (job_name, kind, scheduled_for, status, command, target_database, overlap,
                                     max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                                     finished_at, operation_id, note, steps, followed_run_id, chain)
        SELECT d.job_name, 'manual', p_now + (d.nth - 1) * INTERVAL '1 millisecond',
               CASE WHEN d.refusal IS NULL THEN 'pending' ELSE 'skipped' END,
               d.command, d.target_database, d.overlap, d.max_attempts, d.timeout_seconds, d.lease_seconds,
               p_now, p_now, CASE WHEN d.refusal IS NOT NULL THEN p_now END, d.operation_id,
               CASE WHEN d.refusal IS NULL
                    THEN 'after run ' || CAST(d.followed_run_id AS VARCHAR) || ' of ' || d.followed_job
                         || ' (' || d.followed_status || ')'
                    ELSE 'chain: not started after run ' || CAST(d.followed_run_id AS VARCHAR) || ' of '
                         || d.followed_job || ': ' || d.refusal END,
               d.steps, d.followed_run_id, d.chain
        FROM judged AS d
        ORDER BY d.job_name, d.followed_run_id
        ON CONFLICT DO NOTHING
        RETURNING n.run_id, n.job_name, n.followed_run_id, n.operation_id, n.status, n.note),
    told AS (
        INSERT INTO agent.job_events (job_name, event_at, kind, detail)
        SELECT DISTINCT d.job_name, p_now, 'follow_up_refused',
               'not started after job ' || d.followed_job || ': ' || d.refusal
        FROM started AS s
        JOIN judged AS d ON d.job_name = s.job_name AND d.followed_run_id = s.followed_run_id
        JOIN agent.jobs AS j ON j.job_name = d.job_name
        WHERE s.status = 'skipped'
          AND NOT EXISTS (SELECT 1 FROM agent.job_events AS e
                          WHERE e.job_name = d.job_name AND e.kind = 'follow_up_refused' AND e.event_at >= j.updated_at
                            AND e.detail = 'not started after job ' || d.followed_job || ': ' || d.refusal))
    SELECT s.run_id, s.job_name, s.followed_run_id, s.operation_id, s.status, s.note FROM started AS s;
END
$$;

-- Items 5 and 6: what a pause decided about a job's runs, decided again whenever the pause
-- changes (pause_job, a new @until, resume_job), against the pause as it now stands: the window
-- [p_start, p_end) (p_end NULL: until resumed; resume_job passes its own time). The runs looked
-- at are the job's scheduled slots that never started and that a pause decided or may decide:
-- those recorded skipped 'paused' from p_start on, and those waiting for a time to come
-- (pending or queued, runnable from p_now on: slots claimed ahead, and a catch-up waiting for
-- a pause's end). Each becomes:
-- * a slot at or after the end: pending (or left queued), runnable at its slot, no note: the
--   slots claimed ahead that a pause no longer holds run at their time (item 5);
-- * under misfire run-once, the last slot before a known end, when every slot before the end
--   is claimed (next_due_at past it), no slot falls at the end itself, and it is within
--   GRACE_SECONDS of the end (or of now, if later): the catch-up, runnable at the end, note
--   'misfire: caught up late, once' (at resume: outside the grace, skipped with the grace note);
-- * any other: skipped 'paused'.
-- Only runs whose decision changes are written (a queued run keeps its message when its
-- decision stands; a changed one gets a new token, which fences a message sent before). A job
-- that is disabled, invalid or removed has nothing brought back. One statement.
CREATE FUNCTION agent.settle_paused_runs(p_job varchar, p_now timestamp, p_start timestamp, p_end timestamp)
RETURNS TABLE (runs_skipped int, runs_resumed int, runs_caught_up int)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH job AS (
        SELECT j.misfire, j.grace_seconds, j.next_due_at,
               CASE WHEN p_end IS NULL THEN NULL WHEN p_end > p_now THEN p_end ELSE p_now END AS resume_at
        FROM agent.jobs AS j
        WHERE j.job_name = p_job AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1),
    candidate AS (
        SELECT r.run_id, r.scheduled_for, r.status, r.note, r.runnable_at, r.finished_at
        FROM agent.runs AS r
        WHERE r.job_name = p_job AND r.kind = 'scheduled' AND r.attempt = 0 AND EXISTS (SELECT 1 FROM job)
          AND ((r.status = 'skipped' AND r.note = 'paused' AND r.scheduled_for >= p_start)
               OR (r.status IN ('pending', 'queued') AND r.runnable_at >= p_now))),
    latest AS (
        SELECT MAX(c.scheduled_for) AS slot FROM candidate AS c WHERE p_end IS NOT NULL AND c.scheduled_for < p_end),
    judged AS (
        SELECT c.*, j.resume_at,
               CASE WHEN p_end IS NOT NULL AND c.scheduled_for >= p_end THEN 'slot'
                    WHEN c.scheduled_for = l.slot AND j.misfire = 'run-once'
                         AND (j.next_due_at IS NULL OR j.next_due_at > p_end)
                         AND NOT EXISTS (SELECT 1 FROM agent.runs AS e
                                         WHERE e.job_name = p_job AND e.kind = 'scheduled' AND e.scheduled_for = p_end)
                    THEN CASE WHEN c.scheduled_for + j.grace_seconds * INTERVAL '1 second' >= j.resume_at
                              THEN 'catch_up' WHEN p_end <= p_now THEN 'too_late' ELSE 'held' END
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
        UPDATE agent.runs AS r SET status = t.to_status, note = t.to_note, runnable_at = t.to_runnable,
            finished_at = CASE WHEN t.to_status <> 'skipped' THEN NULL
                               WHEN t.status = 'skipped' THEN t.finished_at ELSE p_now END,
            lease_expires_at = NULL, token = r.token + 1
        FROM target AS t
        WHERE r.run_id = t.run_id
          AND (t.to_status <> t.status OR t.to_note IS DISTINCT FROM t.note OR t.to_runnable <> t.runnable_at)
        RETURNING t.status AS was, r.status, r.note)
    SELECT CAST(COUNT(*) FILTER (WHERE c.status = 'skipped' AND c.was <> 'skipped') AS int),
           CAST(COUNT(*) FILTER (WHERE c.status <> 'skipped' AND c.note IS NULL) AS int),
           CAST(COUNT(*) FILTER (WHERE c.status <> 'skipped' AND c.note IS NOT NULL) AS int)
    FROM changed AS c;
END
$$;

-- agent.pause_job (0009) with the settled runs: what the new pause holds is recorded skipped
-- 'paused', what it no longer holds (a new @until before a slot a longer pause held) comes back.
CREATE OR REPLACE FUNCTION agent.pause_job(job_name varchar, until timestamptz DEFAULT NULL, reason varchar DEFAULT NULL)
RETURNS TABLE (paused_at timestamp, paused_until timestamp, paused_by varchar, runs_skipped int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_until timestamp;
    v_start timestamp;
    v_skipped int := 0;
    p text := 'agent.pause_job: ';
BEGIN
    IF pause_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    IF pause_job.until IS NOT NULL AND NOT (pause_job.until >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                            AND pause_job.until < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@until = '
            || quote_literal(pause_job.until::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC), or NULL (until agent.resume_job)';
    END IF;
    v_until := CAST(pause_job.until AT TIME ZONE 'UTC' AS timestamp);
    IF v_until IS NOT NULL AND v_until <= v_now THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@until = '
            || quote_literal(pause_job.until::text) || ': expected a time after now (the database''s clock: '
            || to_char(v_now, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC), or NULL (until agent.resume_job)';
    END IF;
    IF pause_job.reason IS NOT NULL AND length(pause_job.reason) > 400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@reason = '
            || quote_literal(left(pause_job.reason, 80)) || '...: expected NULL or at most 400 characters';
    END IF;
    PERFORM pg_advisory_xact_lock(7428015);
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = pause_job.job_name AND j.configured = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(pause_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
    END IF;
    INSERT INTO agent.job_pauses AS x (job_name, paused_at, paused_until, paused_by, reason)
    VALUES (pause_job.job_name, v_now, v_until, CAST(session_user AS varchar), pause_job.reason)
    ON CONFLICT ON CONSTRAINT job_pauses_pkey DO UPDATE SET
        paused_at = CASE WHEN x.paused_until IS NULL OR x.paused_until > v_now THEN x.paused_at ELSE EXCLUDED.paused_at END,
        paused_until = EXCLUDED.paused_until, paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason
    RETURNING x.paused_at INTO v_start;
    SELECT s.runs_skipped INTO v_skipped FROM agent.settle_paused_runs(pause_job.job_name, v_now, v_start, v_until) AS s;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (pause_job.job_name, v_now, 'paused',
            'paused by ' || CAST(session_user AS varchar) || ' (agent.pause_job) '
            || COALESCE('until ' || to_char(v_until, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC', 'until resumed')
            || COALESCE(': ' || pause_job.reason, '') || '; ' || v_skipped || ' claimed slot(s) skipped');
    RETURN QUERY SELECT x.paused_at, x.paused_until, x.paused_by, v_skipped
    FROM agent.job_pauses AS x WHERE x.job_name = pause_job.job_name;
END
$$;

-- agent.resume_job (0009) with the settled runs: the slots claimed ahead that the pause had
-- recorded skipped run at their time, and the misfire policy decides the last slot it held.
CREATE OR REPLACE FUNCTION agent.resume_job(job_name varchar)
RETURNS TABLE (paused_at timestamp, resumed_at timestamp)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_paused_at timestamp;
    v_settled record;
    p text := 'agent.resume_job: ';
BEGIN
    IF resume_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    PERFORM pg_advisory_xact_lock(7428015);
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = resume_job.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(resume_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job';
    END IF;
    DELETE FROM agent.job_pauses AS x
    WHERE x.job_name = resume_job.job_name AND (x.paused_until IS NULL OR x.paused_until > v_now)
    RETURNING x.paused_at INTO v_paused_at;
    IF v_paused_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@job_name = ' || quote_literal(resume_job.job_name)
            || ': expected a paused job; it is not paused';
    END IF;
    SELECT * INTO v_settled FROM agent.settle_paused_runs(resume_job.job_name, v_now, v_paused_at, v_now);
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (resume_job.job_name, v_now, 'resumed',
            'resumed by ' || CAST(session_user AS varchar) || ' (agent.resume_job); paused since '
            || to_char(v_paused_at, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC; ' || v_settled.runs_resumed
            || ' slot(s) claimed ahead run at their time, ' || v_settled.runs_caught_up || ' caught up');
    RETURN QUERY SELECT v_paused_at, v_now;
END
$$;

-- agent.remove_scheduled_job (0005): the paused slots claimed ahead become slots of a removed
-- job too (a resume must not bring them back: a job defined later under the name may differ).
CREATE OR REPLACE FUNCTION agent.remove_scheduled_job(name varchar)
RETURNS TABLE (job_name varchar, skipped_runs int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_existing record;
    v_skipped int := 0;
    p text := 'agent.remove_scheduled_job: ';
BEGIN
    IF remove_scheduled_job.name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = NULL: expected the name of a job defined by agent.add_scheduled_job';
    END IF;
    PERFORM pg_advisory_xact_lock(7428014);
    SELECT j.job_name, j.defined_in_database, j.configured INTO v_existing FROM agent.jobs j
    WHERE j.job_name = remove_scheduled_job.name AND j.configured = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@name = ' || quote_literal(left(remove_scheduled_job.name, 80))
            || ': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
    END IF;
    IF v_existing.defined_in_database = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(remove_scheduled_job.name)
            || ': expected a job defined in the database; this job is defined in the app settings (JOB__'
            || remove_scheduled_job.name || '__*): remove it there';
    END IF;
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job was removed by agent.remove_scheduled_job after this slot was claimed'
    WHERE r.job_name = remove_scheduled_job.name AND r.kind = 'scheduled'
      AND (r.status IN ('pending', 'queued')
           OR (r.status = 'skipped' AND r.note = 'paused' AND r.attempt = 0 AND r.scheduled_for >= v_now));
    GET DIAGNOSTICS v_skipped = ROW_COUNT;
    UPDATE agent.jobs AS j SET configured = 0, next_due_at = NULL, needs_planning = 0, updated_at = v_now
    WHERE j.job_name = remove_scheduled_job.name;
    DELETE FROM agent.state AS s WHERE s.state_key = 'job_config_hash';
    RETURN QUERY SELECT CAST(remove_scheduled_job.name AS varchar), v_skipped;
END
$$;

-- The engine's own functions of this migration are not the operators' (they are neither
-- SECURITY DEFINER nor checked for an operator's arguments): closed to PUBLIC, as
-- agent.cancel_fleet_executions is. agent.pause_job and agent.resume_job run as their owner.
REVOKE ALL ON FUNCTION agent.settle_paused_runs(varchar, timestamp, timestamp, timestamp) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.start_follow_up_runs(timestamp, int) FROM PUBLIC;
