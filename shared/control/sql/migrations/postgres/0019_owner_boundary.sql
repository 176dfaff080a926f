-- 0019 the owner boundary (issue 34, item 1): what a job leaves behind never runs as the agent,
-- and what a job asks of the agent is asked as the job's owner.
--
-- An owned job (one an operator defined from the database side, or any job under
-- AGENT_JOB_PRINCIPAL) runs inside a SECURITY DEFINER function owned by its principal, on the
-- agent's session (shared/control/store.py, Store._run_as). Inside it current_user is the
-- principal, but session_user is still the agent's login: agent.exec_async, agent.add_scheduled_job,
-- agent.pause_job, agent.resume_job and agent.add_calendar recorded session_user as their caller,
-- so a job that called one of them queued work (or recorded a name) as the AGENT, and that work
-- then ran with the agent's rights. Now every one of them records agent.calling_principal():
-- the principal of the owned job this session is running, when it runs one, else session_user.
--
-- agent.owned_sessions: which principal's job a session is running. The agent writes the row in
-- the job's transaction before the job's SQL starts and deletes it in the same batch after the
-- job's function returned (shared/control/store.py); a job cannot write it (no right on it), so
-- it cannot pose as anyone else, and the row never outlives the transaction (a failed job rolls
-- it back with everything else). UNLOGGED: it holds nothing a crash must keep.
CREATE UNLOGGED TABLE agent.owned_sessions (
    backend_pid INT NOT NULL PRIMARY KEY,
    transaction_id BIGINT NOT NULL,
    owner VARCHAR(256) NOT NULL
);

-- Who calls an agent.* function: the owner of the job this session runs (in that job's own
-- transaction only), else the session's login role. Called only by the agent's own functions.
CREATE FUNCTION agent.calling_principal() RETURNS varchar
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT COALESCE((SELECT s.owner FROM agent.owned_sessions AS s
                     WHERE s.backend_pid = pg_backend_pid() AND s.transaction_id = txid_current()),
                    CAST(session_user AS varchar));
$$;
REVOKE ALL ON FUNCTION agent.calling_principal() FROM PUBLIC;

-- The functions that record their caller, as they were (0008, 0012, 0014), with
-- agent.calling_principal() for session_user. Since 0017 (the audit trail) each is the body
-- agent.<name>_unaudited behind an audited function of the old name, so the body is what is
-- redefined here (its parameters qualified by its own name); CREATE OR REPLACE keeps its grants
-- (none: only the audited function calls it). The audit row names the same caller.
CREATE OR REPLACE FUNCTION agent.audit_procedure_call(p_action varchar, p_job varchar, p_run bigint, p_arguments jsonb,
                                                      p_detail text)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO agent.audit (acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail)
    SELECT CAST(now() AT TIME ZONE 'UTC' AS timestamp), left(agent.calling_principal(), 256),
            left(COALESCE(NULLIF(current_setting('application_name', true), ''), '(no application name)')
                 || ' from ' || COALESCE(host(inet_client_addr()), 'a local socket'), 400),
            'tsql', p_action, left(p_job, 200), p_run, a.arguments, 'done', left(p_detail, 2000)
    FROM (SELECT CAST(jsonb_strip_nulls(p_arguments) AS text) AS text) AS j
    CROSS JOIN LATERAL (SELECT CASE WHEN length(j.text) <= 8000 THEN j.text
                                    ELSE '{"truncated": true}' END AS arguments) AS a;
$$;

CREATE OR REPLACE FUNCTION agent.exec_async_unaudited(sql text, execution_order int DEFAULT 0, "database" varchar DEFAULT NULL,
                                 run_at timestamptz DEFAULT NULL, max_attempts int DEFAULT 1,
                                 timeout_seconds int DEFAULT 1800)
RETURNS TABLE (run_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_at timestamp := CAST(exec_async_unaudited.run_at AT TIME ZONE 'UTC' AS timestamp);
BEGIN
    IF exec_async_unaudited.sql IS NULL OR btrim(exec_async_unaudited.sql) = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @sql = '
            || COALESCE(quote_literal(exec_async_unaudited.sql), 'NULL') || ': expected the SQL to run (non-empty)';
    END IF;
    IF exec_async_unaudited.run_at IS NOT NULL AND NOT (exec_async_unaudited.run_at >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                             AND exec_async_unaudited.run_at < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @run_at = '
            || quote_literal(exec_async_unaudited.run_at::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC)';
    END IF;
    IF exec_async_unaudited.execution_order < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @execution_order = '
            || exec_async_unaudited.execution_order || ': expected NULL (no order) or a whole number from 0 (it starts once every task of a lower order has finished)';
    END IF;
    IF exec_async_unaudited."database" IS NOT NULL AND exec_async_unaudited."database" !~ '^[A-Za-z0-9_-]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @database = '
            || quote_literal(left(exec_async_unaudited."database", 140)) || ': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
    END IF;
    IF exec_async_unaudited.max_attempts IS NULL OR exec_async_unaudited.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @max_attempts = '
            || COALESCE(exec_async_unaudited.max_attempts::text, 'NULL') || ': expected a whole number from 1 to 100';
    END IF;
    IF exec_async_unaudited.timeout_seconds IS NULL OR exec_async_unaudited.timeout_seconds NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'agent.exec_async: @timeout_seconds = '
            || COALESCE(exec_async_unaudited.timeout_seconds::text, 'NULL') || ': expected a whole number from 1 to 604800';
    END IF;
    RETURN QUERY
    INSERT INTO agent.runs AS r (job_name, kind, scheduled_for, status, command, target_database, task_order,
                                 overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                                 created_at, operation_id, note, owner)
    VALUES (NULL, 'task', COALESCE(v_at, v_now), 'pending', exec_async_unaudited.sql, exec_async_unaudited."database",
            exec_async_unaudited.execution_order, 'allow', exec_async_unaudited.max_attempts, exec_async_unaudited.timeout_seconds, 60,
            COALESCE(v_at, v_now), v_now, md5(random()::text || clock_timestamp()::text), 'submitted',
            agent.calling_principal())
    RETURNING r.run_id;
END
$$;

CREATE OR REPLACE FUNCTION agent.add_scheduled_job_unaudited(name varchar, sql text, schedule varchar DEFAULT NULL,
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
    IF add_scheduled_job_unaudited.overlap IS NULL OR lower(add_scheduled_job_unaudited.overlap) NOT IN ('skip', 'queue', 'allow') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@overlap = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.overlap, 80)), 'NULL') || ': expected skip, queue or allow';
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
    IF add_scheduled_job_unaudited."after" IS NOT NULL AND add_scheduled_job_unaudited."after" !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after = '
            || quote_literal(left(add_scheduled_job_unaudited."after", 80)) || ': expected NULL (a job that follows no job) or the name of the job whose runs start this one';
    END IF;
    IF add_scheduled_job_unaudited.after_outcome IS NULL OR lower(add_scheduled_job_unaudited.after_outcome) NOT IN ('succeeded', 'failed', 'completed') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@after_outcome = '
            || COALESCE(quote_literal(left(add_scheduled_job_unaudited.after_outcome, 80)), 'NULL') || ': expected succeeded, failed or completed';
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
                                 requested_target_parallelism, owner, after_job, after_outcome)
    VALUES (add_scheduled_job_unaudited.name, v_schedule, add_scheduled_job_unaudited.timezone, add_scheduled_job_unaudited.sql,
            add_scheduled_job_unaudited."database", add_scheduled_job_unaudited.enabled, 1, NULL, add_scheduled_job_unaudited.max_attempts,
            add_scheduled_job_unaudited.timeout_seconds, add_scheduled_job_unaudited.lease_seconds, lower(add_scheduled_job_unaudited.misfire),
            add_scheduled_job_unaudited.grace_seconds, lower(add_scheduled_job_unaudited.overlap), NULL, NULL, 1, v_now, 1, 1, NULL,
            btrim(add_scheduled_job_unaudited.targets), add_scheduled_job_unaudited.target_parallelism,
            agent.calling_principal(), v_leader,
            CASE WHEN v_leader IS NOT NULL THEN lower(add_scheduled_job_unaudited.after_outcome) END)
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
    RETURN QUERY SELECT CAST(add_scheduled_job_unaudited.name AS varchar), v_action;
END
$$;

CREATE OR REPLACE FUNCTION agent.pause_job_unaudited(job_name varchar, until timestamptz DEFAULT NULL, reason varchar DEFAULT NULL)
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
    IF pause_job_unaudited.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    IF pause_job_unaudited.until IS NOT NULL AND NOT (pause_job_unaudited.until >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                            AND pause_job_unaudited.until < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@until = '
            || quote_literal(pause_job_unaudited.until::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC), or NULL (until agent.resume_job)';
    END IF;
    v_until := CAST(pause_job_unaudited.until AT TIME ZONE 'UTC' AS timestamp);
    IF v_until IS NOT NULL AND v_until <= v_now THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@until = '
            || quote_literal(pause_job_unaudited.until::text) || ': expected a time after now (the database''s clock: '
            || to_char(v_now, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC), or NULL (until agent.resume_job)';
    END IF;
    IF pause_job_unaudited.reason IS NOT NULL AND length(pause_job_unaudited.reason) > 400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@reason = '
            || quote_literal(left(pause_job_unaudited.reason, 80)) || '...: expected NULL or at most 400 characters';
    END IF;
    PERFORM pg_advisory_xact_lock(7428015);
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = pause_job_unaudited.job_name AND j.configured = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(pause_job_unaudited.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
    END IF;
    INSERT INTO agent.job_pauses AS x (job_name, paused_at, paused_until, paused_by, reason)
    VALUES (pause_job_unaudited.job_name, v_now, v_until, agent.calling_principal(), pause_job_unaudited.reason)
    ON CONFLICT ON CONSTRAINT job_pauses_pkey DO UPDATE SET
        paused_at = CASE WHEN x.paused_until IS NULL OR x.paused_until > v_now THEN x.paused_at ELSE EXCLUDED.paused_at END,
        paused_until = EXCLUDED.paused_until, paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason
    RETURNING x.paused_at INTO v_start;
    SELECT s.runs_skipped INTO v_skipped FROM agent.settle_paused_runs(pause_job_unaudited.job_name, v_now, v_start, v_until) AS s;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (pause_job_unaudited.job_name, v_now, 'paused',
            'paused by ' || agent.calling_principal() || ' (agent.pause_job) '
            || COALESCE('until ' || to_char(v_until, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC', 'until resumed')
            || COALESCE(': ' || pause_job_unaudited.reason, '') || '; ' || v_skipped || ' claimed slot(s) skipped');
    RETURN QUERY SELECT x.paused_at, x.paused_until, x.paused_by, v_skipped
    FROM agent.job_pauses AS x WHERE x.job_name = pause_job_unaudited.job_name;
END
$$;

CREATE OR REPLACE FUNCTION agent.resume_job_unaudited(job_name varchar)
RETURNS TABLE (paused_at timestamp, resumed_at timestamp)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_paused_at timestamp;
    v_settled record;
    p text := 'agent.resume_job: ';
BEGIN
    IF resume_job_unaudited.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    PERFORM pg_advisory_xact_lock(7428015);
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = resume_job_unaudited.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(resume_job_unaudited.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job';
    END IF;
    DELETE FROM agent.job_pauses AS x
    WHERE x.job_name = resume_job_unaudited.job_name AND (x.paused_until IS NULL OR x.paused_until > v_now)
    RETURNING x.paused_at INTO v_paused_at;
    IF v_paused_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@job_name = ' || quote_literal(resume_job_unaudited.job_name)
            || ': expected a paused job; it is not paused';
    END IF;
    SELECT * INTO v_settled FROM agent.settle_paused_runs(resume_job_unaudited.job_name, v_now, v_paused_at, v_now);
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (resume_job_unaudited.job_name, v_now, 'resumed',
            'resumed by ' || agent.calling_principal() || ' (agent.resume_job); paused since '
            || to_char(v_paused_at, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC; ' || v_settled.runs_resumed
            || ' slot(s) claimed ahead run at their time, ' || v_settled.runs_caught_up || ' caught up');
    RETURN QUERY SELECT v_paused_at, v_now;
END
$$;

CREATE OR REPLACE FUNCTION agent.add_calendar_unaudited(name varchar, dates text DEFAULT NULL, weekly text DEFAULT NULL)
RETURNS TABLE (calendar_name varchar, action varchar, jobs_replanned int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_action varchar := 'defined';
    p text := 'agent.add_calendar: ';
BEGIN
    IF add_calendar_unaudited.name IS NULL OR add_calendar_unaudited.name = '' OR length(add_calendar_unaudited.name) > 64
       OR add_calendar_unaudited.name ~ '[^A-Za-z0-9_.-]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = ' || COALESCE(quote_literal(left(add_calendar_unaudited.name, 80)), 'NULL')
            || ': expected a calendar name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
    END IF;
    IF NULLIF(btrim(COALESCE(add_calendar_unaudited.dates, '')), '') IS NULL AND NULLIF(btrim(COALESCE(add_calendar_unaudited.weekly, '')), '') IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@dates = NULL, @weekly = NULL: expected dates '
            || '(''2026-12-25, 2026-12-24..2026-12-26'') or weekly windows (''SAT-SUN, FRI 22:00-06:00''), or both';
    END IF;
    IF length(add_calendar_unaudited.dates) > 40000 OR length(add_calendar_unaudited.weekly) > 4000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@dates or @weekly: expected at most 40000 and 4000 characters';
    END IF;
    -- Names compare case-insensitively (as SQL Server's default collation does): one definer at a time.
    PERFORM pg_advisory_xact_lock(hashtext('agent.calendars'));
    IF EXISTS (SELECT 1 FROM agent.calendars c WHERE lower(c.name) = lower(add_calendar_unaudited.name)) THEN
        v_action := 'redefined';
        UPDATE agent.calendars AS c SET name = add_calendar_unaudited.name, dates = add_calendar_unaudited.dates, weekly = add_calendar_unaudited.weekly,
               defined_by = agent.calling_principal(), updated_at = v_now
        WHERE lower(c.name) = lower(add_calendar_unaudited.name);
    ELSE
        INSERT INTO agent.calendars (name, dates, weekly, defined_by, updated_at)
        VALUES (add_calendar_unaudited.name, add_calendar_unaudited.dates, add_calendar_unaudited.weekly, agent.calling_principal(), v_now);
    END IF;
    RETURN QUERY SELECT CAST(add_calendar_unaudited.name AS varchar), v_action, agent.replan_calendar_users(add_calendar_unaudited.name, v_now);
END
$$;
