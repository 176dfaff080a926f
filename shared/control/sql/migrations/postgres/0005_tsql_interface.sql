-- 0005 T-SQL interface: jobs defined in the database, the seeds' procedures, SQL Server Agent's
-- verbs and history views, and the agent_operator role (issue 14). Here PostgreSQL functions with
-- the parameters, defaults and results of the T-SQL procedures (shared/control/sql/migrations/mssql).
--
-- The functions take time from the server clock (there is no agent clock inside the database),
-- validate every argument before they change anything (one message: the function, the
-- parameter, the value, what is expected), and never build SQL from text: the SQL they queue is
-- stored as given and run later by the engine, as the app's database user (or
-- AGENT_JOB_PRINCIPAL), like a SQL Server Agent job owned by the agent.
-- SQLSTATE 22023 (invalid parameter value), P0002 (no such job, run or poison message),
-- 55000 (the object is not in a state that allows it); SQL Server throws 51401, 51404, 51409.
-- SECURITY DEFINER with a pinned search_path: a member of agent_operator calls them and reads
-- the views without any right on the tables.

-- Where a job is defined: 0 the app settings (JOB__<name>__*), 1 agent.add_scheduled_job.
ALTER TABLE agent.jobs ADD COLUMN defined_in_database SMALLINT NOT NULL DEFAULT 0;
-- A job defined or changed in the database waits for the engine to check its schedule and time
-- zone and compute its first slot (a procedure cannot read NCRONTAB): every tick, doorbell and
-- local-runner poll looks for these with one indexed query.
ALTER TABLE agent.jobs ADD COLUMN needs_planning SMALLINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_needs_planning ON agent.jobs (needs_planning) WHERE needs_planning = 1;

-- agent.exec_async: queue ad-hoc SQL exactly as `submit` does (the insert_task row) and return its run id.
CREATE FUNCTION agent.exec_async(sql text, execution_order int DEFAULT 0, "database" varchar DEFAULT NULL,
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
                                 created_at, operation_id, note)
    VALUES (NULL, 'task', COALESCE(v_at, v_now), 'pending', exec_async.sql, exec_async."database",
            exec_async.execution_order, 'allow', exec_async.max_attempts, exec_async.timeout_seconds, 60,
            COALESCE(v_at, v_now), v_now, md5(random()::text || clock_timestamp()::text), 'submitted')
    RETURNING r.run_id;
END
$$;

-- agent.add_scheduled_job: define (or redefine) a job in the database. The engine checks the
-- schedule and time zone and plans its first slot (needs_planning); slots of the previous
-- definition claimed ahead are recorded skipped.
CREATE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL,
                                        run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC',
                                        enabled int DEFAULT 1, max_attempts int DEFAULT 3,
                                        timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip',
                                        "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once',
                                        grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60)
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
    IF add_scheduled_job.schedule IS NULL AND add_scheduled_job.run_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@schedule = NULL: expected a six-field NCRONTAB expression (seconds first), or @run_at for a one-time job';
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
    v_schedule := COALESCE(btrim(add_scheduled_job.schedule),
        '@once ' || to_char(add_scheduled_job.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00');
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
                                 defined_in_database, needs_planning)
    VALUES (add_scheduled_job.name, v_schedule, add_scheduled_job.timezone, add_scheduled_job.sql,
            add_scheduled_job."database", add_scheduled_job.enabled, 1, NULL, add_scheduled_job.max_attempts,
            add_scheduled_job.timeout_seconds, add_scheduled_job.lease_seconds, lower(add_scheduled_job.misfire),
            add_scheduled_job.grace_seconds, lower(add_scheduled_job.overlap), NULL, NULL, 1, v_now, 1, 1)
    ON CONFLICT (job_name) DO UPDATE SET
        schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, command = EXCLUDED.command,
        target_database = EXCLUDED.target_database, enabled = EXCLUDED.enabled, valid = 1, config_error = NULL,
        max_attempts = EXCLUDED.max_attempts, timeout_seconds = EXCLUDED.timeout_seconds,
        lease_seconds = EXCLUDED.lease_seconds, misfire = EXCLUDED.misfire, grace_seconds = EXCLUDED.grace_seconds,
        overlap = EXCLUDED.overlap, next_due_at = NULL, advanced_at = NULL, configured = 1,
        updated_at = EXCLUDED.updated_at, defined_in_database = 1, needs_planning = EXCLUDED.needs_planning;
    RETURN QUERY SELECT CAST(add_scheduled_job.name AS varchar), v_action;
END
$$;

-- agent.remove_scheduled_job: the job stops (its slots claimed ahead are recorded skipped); its
-- history stays. The settings hash is cleared: a settings job held off by this name syncs at the next tick.
CREATE FUNCTION agent.remove_scheduled_job(name varchar)
RETURNS TABLE (job_name varchar, skipped_runs int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_existing record;
    v_skipped int;
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
    WHERE r.job_name = remove_scheduled_job.name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued');
    GET DIAGNOSTICS v_skipped = ROW_COUNT;
    UPDATE agent.jobs AS j SET configured = 0, next_due_at = NULL, needs_planning = 0, updated_at = v_now
    WHERE j.job_name = remove_scheduled_job.name;
    DELETE FROM agent.state AS s WHERE s.state_key = 'job_config_hash';
    RETURN QUERY SELECT CAST(remove_scheduled_job.name AS varchar), v_skipped;
END
$$;

-- agent.enable_job: enable or disable a job defined in the database. Disabling records its slots
-- claimed ahead skipped; enabling plans it again from now.
CREATE FUNCTION agent.enable_job(name varchar, enabled int DEFAULT 1)
RETURNS TABLE (job_name varchar, skipped_runs int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_existing record;
    v_skipped int := 0;
    p text := 'agent.enable_job: ';
BEGIN
    IF enable_job.name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = NULL: expected the name of a job defined by agent.add_scheduled_job';
    END IF;
    IF enable_job.enabled IS NULL OR enable_job.enabled NOT IN (0, 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@enabled = '
            || COALESCE(enable_job.enabled::text, 'NULL') || ': expected 1 (enable) or 0 (disable)';
    END IF;
    PERFORM pg_advisory_xact_lock(7428014);
    SELECT j.job_name, j.defined_in_database, j.enabled INTO v_existing FROM agent.jobs j
    WHERE j.job_name = enable_job.name AND j.configured = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@name = ' || quote_literal(left(enable_job.name, 80))
            || ': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
    END IF;
    IF v_existing.defined_in_database = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(enable_job.name)
            || ': expected a job defined in the database; this job is defined in the app settings: set JOB__'
            || enable_job.name || '__ENABLED there';
    END IF;
    IF v_existing.enabled <> enable_job.enabled THEN
        UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
            note = 'skipped: the job was disabled by agent.enable_job after this slot was claimed'
        WHERE r.job_name = enable_job.name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued');
        GET DIAGNOSTICS v_skipped = ROW_COUNT;
        UPDATE agent.jobs AS j SET enabled = enable_job.enabled, needs_planning = enable_job.enabled,
            next_due_at = NULL, advanced_at = NULL, updated_at = v_now
        WHERE j.job_name = enable_job.name;
    END IF;
    RETURN QUERY SELECT CAST(enable_job.name AS varchar), v_skipped;
END
$$;

-- agent.start_job: the run `run-now` makes (the insert_manual_run row), under the start lock, with
-- the job's overlap policy.
CREATE FUNCTION agent.start_job(job_name varchar)
RETURNS TABLE (run_id bigint, status varchar, note text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_job record;
    p text := 'agent.start_job: ';
BEGIN
    IF start_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    SELECT j.job_name, j.valid, j.config_error INTO v_job FROM agent.jobs j
    WHERE j.job_name = start_job.job_name AND j.configured = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(start_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
    END IF;
    IF v_job.valid = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@job_name = ' || quote_literal(start_job.job_name)
            || ': expected a valid job; it is invalid: ' || COALESCE(v_job.config_error, '?');
    END IF;
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
    RETURN QUERY
    INSERT INTO agent.runs AS r (job_name, kind, scheduled_for, status, command, target_database, overlap,
                                 max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                                 finished_at, operation_id, note, steps)
    SELECT j.job_name, 'manual', v_now, d.decision, j.command, j.target_database,
           j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, v_now, v_now,
           CASE WHEN d.decision = 'skipped' THEN v_now END,
           md5(random()::text || clock_timestamp()::text || j.job_name),
           CASE WHEN d.decision = 'skipped'
                THEN 'overlap: the previous run of this job was still in flight; policy skip'
                ELSE 'run-now' END,
           j.steps
    FROM agent.jobs j
    CROSS JOIN LATERAL (
        SELECT CASE WHEN j.overlap = 'skip' AND EXISTS (
                    SELECT 1 FROM agent.runs a
                    WHERE a.job_name = j.job_name
                      AND (a.status = 'running'
                           OR (a.status IN ('pending', 'queued') AND (a.runnable_at <= v_now OR a.kind = 'manual'))))
               THEN 'skipped' ELSE 'pending' END AS decision) AS d
    WHERE j.job_name = start_job.job_name AND j.valid = 1 AND j.configured = 1
    RETURNING r.run_id, r.status, r.note;
END
$$;

-- agent.stop_job: cancel the job's runs in flight (running, or due and not yet started) as
-- `cancel` does each; slots that have not come stay.
CREATE FUNCTION agent.stop_job(job_name varchar)
RETURNS TABLE (cancelled_run_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    p text := 'agent.stop_job: ';
BEGIN
    IF stop_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = stop_job.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(stop_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job';
    END IF;
    RETURN QUERY
    UPDATE agent.runs AS r SET status = 'cancelled', token = r.token + 1, finished_at = v_now,
        lease_expires_at = NULL, note = 'cancelled by operator'
    WHERE r.job_name = stop_job.job_name
      AND (r.status = 'running' OR (r.status IN ('pending', 'queued') AND r.runnable_at <= v_now))
    RETURNING r.run_id;
END
$$;

-- agent.cancel_run: what `cancel` does (the cancel_run row change).
CREATE FUNCTION agent.cancel_run(run_id bigint)
RETURNS TABLE (cancelled_run_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_status varchar;
    v_done bigint;
    p text := 'agent.cancel_run: ';
BEGIN
    IF cancel_run.run_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@run_id = NULL: expected the id of a run';
    END IF;
    UPDATE agent.runs AS r SET status = 'cancelled', token = r.token + 1, finished_at = v_now,
        lease_expires_at = NULL, note = 'cancelled by operator'
    WHERE r.run_id = cancel_run.run_id AND r.status IN ('pending', 'queued', 'running')
    RETURNING r.run_id INTO v_done;
    IF v_done IS NULL THEN
        SELECT r.status INTO v_status FROM agent.runs r WHERE r.run_id = cancel_run.run_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@run_id = ' || cancel_run.run_id
                || ': expected the id of a run; there is no such run';
        END IF;
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@run_id = ' || cancel_run.run_id
            || ': expected a run not yet finished; it is already ' || v_status;
    END IF;
    RETURN QUERY SELECT v_done;
END
$$;

-- agent.requeue_poison: what `poison requeue` does (requeue_run, then mark_poison_requeued).
CREATE FUNCTION agent.requeue_poison(poison_id bigint)
RETURNS TABLE (requeued_run_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_poison record;
    v_status varchar;
    v_done bigint;
    p text := 'agent.requeue_poison: ';
BEGIN
    IF requeue_poison.poison_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@poison_id = NULL: expected the id of a poison message (agent.poison_list)';
    END IF;
    SELECT m.run_id, m.reason INTO v_poison FROM agent.poison_messages m WHERE m.poison_id = requeue_poison.poison_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@poison_id = ' || requeue_poison.poison_id
            || ': expected the id of a poison message (agent.poison_list); there is no such message';
    END IF;
    IF v_poison.run_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@poison_id = ' || requeue_poison.poison_id
            || ': expected a message of a run; it belongs to no run (it was malformed: ' || v_poison.reason || '), nothing to requeue';
    END IF;
    UPDATE agent.runs AS r SET status = 'pending', runnable_at = v_now, finished_at = NULL,
        lease_expires_at = NULL, max_attempts = r.failures + 1, lapses = 0, transient_errors = 0,
        note = 'requeued by operator'
    WHERE r.run_id = v_poison.run_id AND r.status IN ('poisoned', 'failed')
    RETURNING r.run_id INTO v_done;
    IF v_done IS NULL THEN
        SELECT r.status INTO v_status FROM agent.runs r WHERE r.run_id = v_poison.run_id;
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@poison_id = ' || requeue_poison.poison_id
            || ': expected a poisoned or failed run; run ' || v_poison.run_id || ' is ' || COALESCE(v_status, 'gone');
    END IF;
    UPDATE agent.poison_messages AS m SET requeued_at = v_now WHERE m.poison_id = requeue_poison.poison_id;
    RETURN QUERY SELECT v_done;
END
$$;

-- Views (SQL Server Agent's sysjobactivity, sysjobhistory; `poison list`; `stuck`).

-- One row per job: where it is defined, its state, next slot, the run in flight and the last outcome.
CREATE VIEW agent.job_activity AS
SELECT j.job_name,
       CASE WHEN j.defined_in_database = 1 THEN 'database' ELSE 'settings' END AS defined_in,
       CASE WHEN j.configured = 0 THEN 'removed' WHEN j.valid = 0 THEN 'invalid'
            WHEN j.enabled = 0 THEN 'disabled' WHEN j.needs_planning = 1 THEN 'planning'
            WHEN c.run_id IS NOT NULL THEN 'running'
            WHEN j.next_due_at IS NULL AND n.next_slot IS NULL THEN 'idle' ELSE 'scheduled' END AS state,
       j.enabled, j.schedule, j.timezone, COALESCE(n.next_slot, j.next_due_at) AS next_run_at,
       c.run_id AS running_run_id, c.started_at AS running_since, c.worker AS running_worker,
       l.run_id AS last_run_id, l.status AS last_outcome, l.finished_at AS last_finished_at,
       l.last_error AS last_error, j.config_error
FROM agent.jobs AS j
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

-- One row per attempt, plus one for each run that ended without an attempt (a skipped slot, a
-- run cancelled before it started). job_name NULL: an ad-hoc task (exec_async, submit).
CREATE VIEW agent.job_history AS
SELECT r.run_id, a.attempt, r.job_name, r.kind, r.scheduled_for, a.started_at, a.finished_at,
       CAST(EXTRACT(EPOCH FROM (a.finished_at - a.started_at)) * 1000 AS BIGINT) AS duration_ms,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.worker, r.note
FROM agent.attempts AS a
JOIN agent.runs AS r ON r.run_id = a.run_id
UNION ALL
SELECT r.run_id, NULL, r.job_name, r.kind, r.scheduled_for, r.started_at, r.finished_at, NULL,
       r.status, r.last_error_number, NULL, r.last_error, r.worker, r.note
FROM agent.runs AS r
WHERE r.status IN ('succeeded', 'failed', 'poisoned', 'skipped', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM agent.attempts AS x WHERE x.run_id = r.run_id);

-- Poison messages with their run (the table agent.poison_messages keeps the name; this is its view).
CREATE VIEW agent.poison_list AS
SELECT m.poison_id, m.run_id, r.job_name, r.status AS run_status, m.message_id, m.dequeue_count, m.reason,
       m.errors, m.poisoned_at, m.requeued_at
FROM agent.poison_messages AS m
LEFT JOIN agent.runs AS r ON r.run_id = m.run_id;

-- `stuck`'s reconciliation at the server's time: in flight past the lease, or runnable and not
-- started for more than 600 s (the command's default --older-than).
CREATE VIEW agent.stuck_runs AS
SELECT r.run_id, r.job_name, r.kind, r.status, r.scheduled_for, r.runnable_at, r.lease_expires_at, r.token, r.attempt,
       CASE WHEN r.status IN ('queued', 'running') THEN 'lease expired' ELSE 'waiting over 600 s' END AS reason
FROM agent.runs AS r
WHERE (r.status IN ('queued', 'running') AND r.lease_expires_at < CAST(now() AT TIME ZONE 'UTC' AS timestamp))
   OR (r.status = 'pending' AND r.runnable_at < CAST(now() AT TIME ZONE 'UTC' AS timestamp) - INTERVAL '600 seconds');

-- Least privilege: agent_operator calls the functions and reads the views, nothing else. Roles
-- belong to the cluster: another database's init-db, or the admin's grant-sql --agent-login
-- script, may have created it already. Looked up first: CREATE ROLE checks CREATEROLE before it
-- looks for the name, and the agent's least-privilege login has no CREATEROLE.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'agent_operator') THEN
        BEGIN
            CREATE ROLE agent_operator NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'role agent_operator does not exist and the login running init-db (%) may not create roles: run the script of sql-agent grant-sql --agent-login % as an admin first', session_user, session_user;
        END;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;
GRANT USAGE ON SCHEMA agent TO agent_operator;
REVOKE ALL ON FUNCTION agent.exec_async(text, int, varchar, timestamptz, int, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.remove_scheduled_job(varchar) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.enable_job(varchar, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.start_job(varchar) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.stop_job(varchar) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.cancel_run(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.requeue_poison(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.exec_async(text, int, varchar, timestamptz, int, int) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.remove_scheduled_job(varchar) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.enable_job(varchar, int) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.start_job(varchar) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.stop_job(varchar) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.cancel_run(bigint) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.requeue_poison(bigint) TO agent_operator;
GRANT SELECT ON agent.job_activity TO agent_operator;
GRANT SELECT ON agent.job_history TO agent_operator;
GRANT SELECT ON agent.poison_list TO agent_operator;
GRANT SELECT ON agent.stuck_runs TO agent_operator;
