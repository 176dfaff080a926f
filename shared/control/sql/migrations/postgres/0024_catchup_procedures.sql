-- 0024 agent.add_scheduled_job's @catchup_seconds (issue 33 item 5): JOB__<name>__CATCHUP_SECONDS
-- for a job defined from T-SQL. 0022's add_scheduled_job and its body (agent.add_scheduled_job_unaudited,
-- since 0017) are dropped and created again with the one argument more (defaulted, so every call
-- written before still works), stored in agent.jobs.catchup_seconds (0022). Validated as the
-- settings are (shared/jobs/from_settings.py, _check_catchup): 0 to 31622400, at most
-- @grace_seconds, and refused with no @schedule, with @misfire = 'skip' and with @overlap = 'skip' or
-- 'cancel-previous' (the default 'skip' too: a catch-up window names its overlap policy).

DROP FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int);
DROP FUNCTION agent.add_scheduled_job_unaudited(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int);
CREATE FUNCTION agent.add_scheduled_job_unaudited(name varchar, sql text, schedule varchar DEFAULT NULL,
                                        run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC',
                                        enabled int DEFAULT 1, max_attempts int DEFAULT 3,
                                        timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip',
                                        "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once',
                                        grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60,
                                        targets varchar DEFAULT NULL, target_parallelism int DEFAULT 8,
                                        "after" varchar DEFAULT NULL, after_outcome varchar DEFAULT 'succeeded',
                                        target_stagger_seconds int DEFAULT 0, catchup_seconds int DEFAULT 0)
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
    IF add_scheduled_job_unaudited.name IS NULL OR add_scheduled_job_unaudited.name !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.name, 80)), 'NULL') || ': expected a job name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
    END IF;
    IF add_scheduled_job_unaudited.sql IS NULL OR btrim(add_scheduled_job_unaudited.sql) = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@sql = '
            || COALESCE(quote_literal(add_scheduled_job_unaudited.sql), 'NULL') || ': expected the SQL to run (non-empty)';
    END IF;
    IF add_scheduled_job_unaudited.run_at IS NOT NULL AND NOT (add_scheduled_job_unaudited.run_at >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                                    AND add_scheduled_job_unaudited.run_at < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@run_at = '
            || quote_literal(add_scheduled_job_unaudited.run_at::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC)';
    END IF;
    IF add_scheduled_job_unaudited.schedule IS NOT NULL AND add_scheduled_job_unaudited.run_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@run_at = '
            || add_scheduled_job_unaudited.run_at::text || ': expected NULL when @schedule is given (one or the other)';
    END IF;
    IF add_scheduled_job_unaudited.schedule IS NOT NULL AND (btrim(add_scheduled_job_unaudited.schedule) = '' OR length(add_scheduled_job_unaudited.schedule) > 400) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@schedule = '
            || quote_literal(left(add_scheduled_job_unaudited.schedule, 80)) || ': expected a six-field NCRONTAB expression (seconds first) of at most 400 characters';
    END IF;
    IF add_scheduled_job_unaudited.timezone IS NULL OR add_scheduled_job_unaudited.timezone !~ '^[A-Za-z0-9_+/-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@timezone = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.timezone, 80)), 'NULL') || ': expected an IANA time zone name such as UTC or Europe/Paris';
    END IF;
    IF add_scheduled_job_unaudited.enabled IS NULL OR add_scheduled_job_unaudited.enabled NOT IN (0, 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@enabled = '
            || COALESCE(add_scheduled_job_unaudited.enabled::text, 'NULL') || ': expected 1 (enabled) or 0 (disabled)';
    END IF;
    IF add_scheduled_job_unaudited.max_attempts IS NULL OR add_scheduled_job_unaudited.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@max_attempts = '
            || COALESCE(add_scheduled_job_unaudited.max_attempts::text, 'NULL') || ': expected a whole number from 1 to 100';
    END IF;
    IF add_scheduled_job_unaudited.timeout_seconds IS NULL OR add_scheduled_job_unaudited.timeout_seconds NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@timeout_seconds = '
            || COALESCE(add_scheduled_job_unaudited.timeout_seconds::text, 'NULL') || ': expected a whole number from 1 to 604800';
    END IF;
    IF add_scheduled_job_unaudited.overlap IS NULL OR lower(add_scheduled_job_unaudited.overlap) NOT IN ('skip', 'queue', 'allow', 'buffer-one', 'cancel-previous') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@overlap = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.overlap, 80)), 'NULL') || ': expected skip, queue, allow, buffer-one or cancel-previous';
    END IF;
    IF add_scheduled_job_unaudited."database" IS NOT NULL AND add_scheduled_job_unaudited."database" !~ '^[A-Za-z0-9_-]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@database = '
            || quote_literal(left(add_scheduled_job_unaudited."database", 140)) || ': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
    END IF;
    IF add_scheduled_job_unaudited.misfire IS NULL OR lower(add_scheduled_job_unaudited.misfire) NOT IN ('run-once', 'skip') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@misfire = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.misfire, 80)), 'NULL') || ': expected run-once or skip';
    END IF;
    IF add_scheduled_job_unaudited.grace_seconds IS NULL OR add_scheduled_job_unaudited.grace_seconds NOT BETWEEN 0 AND 31622400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@grace_seconds = '
            || COALESCE(add_scheduled_job_unaudited.grace_seconds::text, 'NULL') || ': expected a whole number from 0 to 31622400';
    END IF;
    IF add_scheduled_job_unaudited.lease_seconds IS NULL OR add_scheduled_job_unaudited.lease_seconds NOT BETWEEN 6 AND 3600 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@lease_seconds = '
            || COALESCE(add_scheduled_job_unaudited.lease_seconds::text, 'NULL') || ': expected a whole number from 6 to 3600';
    END IF;
    IF add_scheduled_job_unaudited.targets IS NOT NULL AND (btrim(add_scheduled_job_unaudited.targets) = '' OR length(add_scheduled_job_unaudited.targets) > 4000) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@targets = '
            || quote_literal(left(add_scheduled_job_unaudited.targets, 80)) || ': expected NULL (one database) or a comma list of at most 4000 characters of members such as db:tenant_*, server:<server> or -db:<name>';
    END IF;
    IF add_scheduled_job_unaudited.targets IS NOT NULL AND add_scheduled_job_unaudited."database" IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@database = '
            || quote_literal(add_scheduled_job_unaudited."database") || ': expected NULL when @targets is given (a job runs in its @targets or in one @database, not both)';
    END IF;
    IF add_scheduled_job_unaudited.target_parallelism IS NULL OR add_scheduled_job_unaudited.target_parallelism NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@target_parallelism = '
            || COALESCE(add_scheduled_job_unaudited.target_parallelism::text, 'NULL') || ': expected a whole number from 1 to 1000 (how many target databases of one run at once)';
    END IF;
    IF add_scheduled_job_unaudited.target_stagger_seconds IS NULL OR add_scheduled_job_unaudited.target_stagger_seconds NOT BETWEEN 0 AND 3600 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@target_stagger_seconds = '
            || COALESCE(add_scheduled_job_unaudited.target_stagger_seconds::text, 'NULL') || ': expected a whole number from 0 to 3600 (execution n of a run starts (n - 1) times this many seconds after the fan-out; 0: as the window lets them in)';
    END IF;
    IF add_scheduled_job_unaudited."after" IS NOT NULL AND add_scheduled_job_unaudited."after" !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = '
            || quote_literal(left(add_scheduled_job_unaudited."after", 80)) || ': expected NULL (a job that follows no job) or the name of the job whose runs start this one';
    END IF;
    IF add_scheduled_job_unaudited.after_outcome IS NULL OR lower(add_scheduled_job_unaudited.after_outcome) NOT IN ('succeeded', 'failed', 'completed') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after_outcome = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.after_outcome, 80)), 'NULL') || ': expected succeeded, failed or completed';
    END IF;
    -- @catchup_seconds (JOB__<name>__CATCHUP_SECONDS): as the settings check it
    -- (shared/jobs/from_settings.py, _check_catchup), each refusal naming the arguments.
    IF add_scheduled_job_unaudited.catchup_seconds IS NULL OR add_scheduled_job_unaudited.catchup_seconds NOT BETWEEN 0 AND 31622400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@catchup_seconds = '
            || COALESCE(add_scheduled_job_unaudited.catchup_seconds::text, 'NULL') || ': expected a whole number from 0 to 31622400 (after downtime, every missed slot within this many seconds of now runs, oldest first; 0: none)';
    END IF;
    IF add_scheduled_job_unaudited.catchup_seconds > 0 AND btrim(COALESCE(add_scheduled_job_unaudited.schedule, '')) = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@catchup_seconds = '
            || add_scheduled_job_unaudited.catchup_seconds::text || ': expected 0 for a job without a @schedule (it has no slot to miss)';
    END IF;
    IF add_scheduled_job_unaudited.catchup_seconds > 0 AND lower(add_scheduled_job_unaudited.misfire) = 'skip' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@catchup_seconds = '
            || add_scheduled_job_unaudited.catchup_seconds::text || ' and @misfire = ''skip'' conflict: skip records every missed slot skipped, the catch-up window runs them; expected @misfire = ''run-once'' (the default) with a catch-up window, or @catchup_seconds = 0';
    END IF;
    IF add_scheduled_job_unaudited.catchup_seconds > add_scheduled_job_unaudited.grace_seconds THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@catchup_seconds = '
            || add_scheduled_job_unaudited.catchup_seconds::text || ': expected at most @grace_seconds = ' || add_scheduled_job_unaudited.grace_seconds::text || ' (a slot older than the grace period never runs)';
    END IF;
    IF add_scheduled_job_unaudited.catchup_seconds > 0 AND lower(add_scheduled_job_unaudited.overlap) IN ('skip', 'cancel-previous') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@catchup_seconds = '
            || add_scheduled_job_unaudited.catchup_seconds::text || ' and @overlap = ' || quote_literal(lower(add_scheduled_job_unaudited.overlap)) || ' conflict: the missed slots are due together, and '
            || lower(add_scheduled_job_unaudited.overlap) || ' would run only one of them; expected @overlap = ''queue'' (one after another, oldest first), ''allow'' (side by side, up to AGENT_MAX_CONCURRENCY) or ''buffer-one'' (the oldest and one more)';
    END IF;
    -- Neither @schedule nor @run_at: an on-demand job (stored with an empty schedule, as a job in
    -- the settings without SCHEDULE): it claims no slot and runs when started (agent.start_job).
    v_schedule := COALESCE(btrim(add_scheduled_job_unaudited.schedule),
        '@once ' || to_char(add_scheduled_job_unaudited.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00',
        '');
    -- The job-definitions lock: the settings sync and these functions decide names one at a time.
    PERFORM pg_advisory_xact_lock(7428014);
    SELECT j.job_name, j.defined_in_database, j.configured INTO v_existing FROM agent.jobs j
    WHERE lower(j.job_name) = lower(add_scheduled_job_unaudited.name)
    ORDER BY (j.job_name = add_scheduled_job_unaudited.name) DESC LIMIT 1;
    IF FOUND AND v_existing.job_name <> add_scheduled_job_unaudited.name THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(add_scheduled_job_unaudited.name)
            || ': expected a name no other job holds; it differs only by case from job ' || quote_literal(v_existing.job_name)
            || ' (job names are compared case-insensitively, as Azure SQL does)';
    END IF;
    IF FOUND AND v_existing.defined_in_database = 0 AND v_existing.configured = 1 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(add_scheduled_job_unaudited.name)
            || ': expected a job defined in the database; this job is defined in the app settings (JOB__'
            || add_scheduled_job_unaudited.name || '__*): change or remove it there';
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
    IF add_scheduled_job_unaudited."after" IS NOT NULL AND lower(add_scheduled_job_unaudited."after") = lower(add_scheduled_job_unaudited.name) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job_unaudited."after")
            || ': expected a chain that ends; this one is a cycle of jobs that follow each other ('
            || add_scheduled_job_unaudited.name || ' -> ' || add_scheduled_job_unaudited.name || ': a run of each would start the next, forever)';
    END IF;
    IF add_scheduled_job_unaudited."after" IS NOT NULL THEN
        SELECT j.job_name INTO v_leader FROM agent.jobs j
        WHERE lower(j.job_name) = lower(add_scheduled_job_unaudited."after") AND j.configured = 1
        ORDER BY (j.job_name = add_scheduled_job_unaudited."after") DESC LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job_unaudited."after")
                || ': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
        END IF;
        WITH RECURSIVE chain (job_name, after_job, path, seen) AS (
            SELECT j.job_name, j.after_job, ARRAY[CAST(j.job_name AS text)], ARRAY[lower(j.job_name)]
            FROM agent.jobs j WHERE j.job_name = v_leader
            UNION ALL
            SELECT j.job_name, j.after_job, c.path || CAST(j.job_name AS text), c.seen || lower(j.job_name)
            FROM chain c JOIN agent.jobs j ON lower(j.job_name) = lower(c.after_job) AND j.configured = 1
            WHERE lower(c.after_job) <> lower(add_scheduled_job_unaudited.name) AND NOT (lower(j.job_name) = ANY (c.seen)))
        SELECT c.path INTO v_path FROM chain c WHERE lower(c.after_job) = lower(add_scheduled_job_unaudited.name) LIMIT 1;
        IF v_path IS NOT NULL THEN
            -- In the order runs start each other (the walk reversed); a long cycle shows its first
            -- and last four jobs and how many between (shared/jobs/chains.py, show_chain).
            v_count := array_length(v_path, 1);
            SELECT string_agg(s.x, ' -> ' ORDER BY s.ord DESC) INTO v_cycle FROM (
                SELECT u.x, CAST(u.ord AS numeric) AS ord FROM unnest(v_path) WITH ORDINALITY AS u(x, ord)
                WHERE v_count <= 8 OR u.ord > v_count - 4 OR u.ord <= 4
                UNION ALL
                SELECT '... (' || (v_count - 8) || ' more)', 4.5 WHERE v_count > 8) AS s;
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = ' || quote_literal(add_scheduled_job_unaudited."after")
                || ': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                || add_scheduled_job_unaudited.name || ' -> ' || v_cycle || ' -> ' || add_scheduled_job_unaudited.name
                || ': a run of each would start the next, forever)';
        END IF;
    END IF;
    -- The slots claimed under the old definition, those a pause recorded skipped ahead included
    -- (a resume must not bring back a slot of a schedule that is gone).
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE r.job_name = add_scheduled_job_unaudited.name AND r.kind = 'scheduled'
      AND (r.status IN ('pending', 'queued')
           OR (r.status = 'skipped' AND r.note = 'paused' AND r.attempt = 0 AND r.scheduled_for >= v_now));
    -- A settings job refused because its AFTER closed a cycle through this job may be valid now:
    -- the next tick syncs the settings again.
    DELETE FROM agent.state AS s WHERE s.state_key = 'job_config_hash';
    INSERT INTO agent.jobs AS j (job_name, schedule, timezone, command, target_database, enabled, valid,
                                 config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                 grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                 defined_in_database, needs_planning, steps, requested_targets,
                                 requested_target_parallelism, owner, after_job, after_outcome,
                                 requested_target_stagger_seconds, catchup_seconds)
    VALUES (add_scheduled_job_unaudited.name, v_schedule, add_scheduled_job_unaudited.timezone, add_scheduled_job_unaudited.sql,
            add_scheduled_job_unaudited."database", add_scheduled_job_unaudited.enabled, 1, NULL, add_scheduled_job_unaudited.max_attempts,
            add_scheduled_job_unaudited.timeout_seconds, add_scheduled_job_unaudited.lease_seconds, lower(add_scheduled_job_unaudited.misfire),
            add_scheduled_job_unaudited.grace_seconds, lower(add_scheduled_job_unaudited.overlap), NULL, NULL, 1, v_now, 1, 1, NULL,
            btrim(add_scheduled_job_unaudited.targets), add_scheduled_job_unaudited.target_parallelism,
            agent.calling_principal(), v_leader,
            CASE WHEN v_leader IS NOT NULL THEN lower(add_scheduled_job_unaudited.after_outcome) END,
            NULLIF(add_scheduled_job_unaudited.target_stagger_seconds, 0), add_scheduled_job_unaudited.catchup_seconds)
    ON CONFLICT (job_name) DO UPDATE SET
        schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, command = EXCLUDED.command,
        target_database = EXCLUDED.target_database, enabled = EXCLUDED.enabled, valid = 1, config_error = NULL,
        max_attempts = EXCLUDED.max_attempts, timeout_seconds = EXCLUDED.timeout_seconds,
        lease_seconds = EXCLUDED.lease_seconds, misfire = EXCLUDED.misfire, grace_seconds = EXCLUDED.grace_seconds,
        overlap = EXCLUDED.overlap, next_due_at = NULL, advanced_at = NULL, configured = 1,
        updated_at = EXCLUDED.updated_at, defined_in_database = 1, needs_planning = EXCLUDED.needs_planning,
        steps = NULL, requested_targets = EXCLUDED.requested_targets,
        requested_target_parallelism = EXCLUDED.requested_target_parallelism, owner = EXCLUDED.owner,
        after_job = EXCLUDED.after_job, after_outcome = EXCLUDED.after_outcome,
        requested_target_stagger_seconds = EXCLUDED.requested_target_stagger_seconds,
        catchup_seconds = EXCLUDED.catchup_seconds;
    RETURN QUERY SELECT CAST(add_scheduled_job_unaudited.name AS varchar), v_action;
END
$$;
REVOKE ALL ON FUNCTION agent.add_scheduled_job_unaudited(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int, int) FROM PUBLIC, agent_operator;

CREATE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL, run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC', enabled int DEFAULT 1, max_attempts int DEFAULT 3, timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip', "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once', grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60, targets varchar DEFAULT NULL, target_parallelism int DEFAULT 8, "after" varchar DEFAULT NULL, after_outcome varchar DEFAULT 'succeeded', target_stagger_seconds int DEFAULT 0, catchup_seconds int DEFAULT 0)
RETURNS TABLE (job_name varchar, action text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
BEGIN
    RETURN QUERY SELECT * FROM agent.add_scheduled_job_unaudited($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM agent.audit_procedure_call('define', $1, NULL, jsonb_build_object('name', left($1, 200), 'sql', left($2, 2000), 'schedule', left($3, 200), 'run_at', $4, 'timezone', left($5, 100), 'enabled', $6, 'max_attempts', $7, 'timeout_seconds', $8, 'overlap', left($9, 20), 'database', left($10, 200), 'misfire', left($11, 20), 'grace_seconds', $12, 'lease_seconds', $13, 'targets', left($14, 400), 'target_parallelism', $15, 'after', left($16, 400), 'after_outcome', left($17, 20), 'target_stagger_seconds', $18, 'catchup_seconds', $19), v_rows || ' row(s)');
    RETURN;
END
$$;
REVOKE ALL ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int, int) TO agent_operator;
