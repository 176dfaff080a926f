-- 0008 on-demand jobs from T-SQL (issue 27): agent.add_scheduled_job with neither @schedule nor
-- @run_at defines a job that runs only when started (agent.start_job, run-now), as a job in the
-- app settings without SCHEDULE does. agent.add_scheduled_job (0007) redefined: the same
-- parameters and checks, less the one that refused a job without a schedule.
--
-- Both procedures also refuse a @run_at no job can be keyed by ('infinity', '-infinity', years
-- past 9999), with the one-line parameter error the other arguments get (it was a raw constraint
-- error showing internal SQL). On SQL Server DATETIMEOFFSET holds no such value.

CREATE OR REPLACE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL,
                                        run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC',
                                        enabled int DEFAULT 1, max_attempts int DEFAULT 3,
                                        timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip',
                                        "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once',
                                        grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60,
                                        targets varchar DEFAULT NULL, target_parallelism int DEFAULT 8)
RETURNS TABLE (job_name varchar, action text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_schedule varchar;
    v_existing record;
    v_action text := 'defined';
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
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE r.job_name = add_scheduled_job.name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued');
    INSERT INTO agent.jobs AS j (job_name, schedule, timezone, command, target_database, enabled, valid,
                                 config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                 grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                 defined_in_database, needs_planning, steps, requested_targets,
                                 requested_target_parallelism, owner)
    VALUES (add_scheduled_job.name, v_schedule, add_scheduled_job.timezone, add_scheduled_job.sql,
            add_scheduled_job."database", add_scheduled_job.enabled, 1, NULL, add_scheduled_job.max_attempts,
            add_scheduled_job.timeout_seconds, add_scheduled_job.lease_seconds, lower(add_scheduled_job.misfire),
            add_scheduled_job.grace_seconds, lower(add_scheduled_job.overlap), NULL, NULL, 1, v_now, 1, 1, NULL,
            btrim(add_scheduled_job.targets), add_scheduled_job.target_parallelism,
            CAST(session_user AS varchar))
    ON CONFLICT (job_name) DO UPDATE SET
        schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, command = EXCLUDED.command,
        target_database = EXCLUDED.target_database, enabled = EXCLUDED.enabled, valid = 1, config_error = NULL,
        max_attempts = EXCLUDED.max_attempts, timeout_seconds = EXCLUDED.timeout_seconds,
        lease_seconds = EXCLUDED.lease_seconds, misfire = EXCLUDED.misfire, grace_seconds = EXCLUDED.grace_seconds,
        overlap = EXCLUDED.overlap, next_due_at = NULL, advanced_at = NULL, configured = 1,
        updated_at = EXCLUDED.updated_at, defined_in_database = 1, needs_planning = EXCLUDED.needs_planning,
        steps = NULL, requested_targets = EXCLUDED.requested_targets,
        requested_target_parallelism = EXCLUDED.requested_target_parallelism, owner = EXCLUDED.owner;
    RETURN QUERY SELECT CAST(add_scheduled_job.name AS varchar), v_action;
END
$$;

CREATE OR REPLACE FUNCTION agent.exec_async(sql text, execution_order int DEFAULT 0, "database" varchar DEFAULT NULL,
                                 run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 1,
                                 timeout_seconds int DEFAULT 1800)
RETURNS TABLE (run_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_at timestamp := CAST(exec_async.run_at AT TIME ZONE 'UTC' AS timestamp);
BEGIN
    IF exec_async.sql IS NULL OR btrim(exec_async.sql) = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @sql = '
            || COALESCE(quote_literal(exec_async.sql), 'NULL') || ': expected the SQL to run (non-empty)';
    END IF;
    IF exec_async.run_at IS NOT NULL AND NOT (exec_async.run_at >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                             AND exec_async.run_at < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @run_at = '
            || quote_literal(exec_async.run_at::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC)';
    END IF;
    IF exec_async.execution_order < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @execution_order = '
            || exec_async.execution_order || ': expected NULL (no order) or a whole number from 0 (it starts once every task of a lower order has finished)';
    END IF;
    IF exec_async."database" IS NOT NULL AND exec_async."database" !~ '^[A-Za-z0-9_-]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @database = '
            || quote_literal(left(exec_async."database", 140)) || ': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
    END IF;
    IF exec_async.max_attempts IS NULL OR exec_async.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @max_attempts = '
            || COALESCE(exec_async.max_attempts::text, 'NULL') || ': expected a whole number from 1 to 100';
    END IF;
    IF exec_async.timeout_seconds IS NULL OR exec_async.timeout_seconds NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @timeout_seconds = '
            || COALESCE(exec_async.timeout_seconds::text, 'NULL') || ': expected a whole number from 1 to 604800';
    END IF;
    RETURN QUERY
    INSERT INTO agent.runs AS r (job_name, kind, scheduled_for, status, command, target_database, task_order,
                                 overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                                 created_at, operation_id, note, owner)
    VALUES (NULL, 'task', COALESCE(v_at, v_now), 'pending', exec_async.sql, exec_async."database",
            exec_async.execution_order, 'allow', exec_async.max_attempts, exec_async.timeout_seconds, 60,
            COALESCE(v_at, v_now), v_now, md5(random()::text || clock_timestamp()::text), 'submitted',
            CAST(session_user AS varchar))
    RETURNING r.run_id;
END
$$;
