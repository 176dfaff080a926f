-- 0018 run with parameters, and SQL Agent's tokens at run time (issue 33 item 4).
--
-- * agent.jobs.params: the parameters a job declares (JOB__<name>__PARAMS__<k>__DEFAULT, or
--   agent.add_scheduled_job's @params), as a JSON object {name: default, or null: no default};
--   NULL: none.
-- * agent.runs.params: the values a run was started with (run-now --param, agent.start_job's
--   @params), the job's defaults filled in, as a JSON object; NULL: none given (a scheduled
--   run reads the job's defaults). Recorded with the run and shown in history.
-- * agent.claim_runs and agent.start_run return the run's params and the job's declarations in
--   the claim's own statement (no round trip more for any run): the executor binds the values
--   (never pasted into the SQL). A fleet execution carries its run's values, defaults filled in.

ALTER TABLE agent.jobs ADD COLUMN params TEXT NULL;
ALTER TABLE agent.runs ADD COLUMN params TEXT NULL;

DROP FUNCTION agent.claim_runs(timestamp, timestamp, int, int, varchar);
CREATE FUNCTION agent.claim_runs(p_now timestamp, p_late_cutoff timestamp, p_batch int, p_max_concurrency int, p_worker varchar)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int, owner varchar, params text, job_params text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- The start lock is held until the commit: do not wait for the WAL flush with it held. A
    -- start lost in a server crash is taken back like any lapse (the token fences the worker).
    PERFORM set_config('synchronous_commit', 'off', true);
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
    -- NULL: the database's own clock decides what is runnable (the agent's one clock; taken
    -- under the start lock, so a run started before the lock was granted is seen as due).
    p_now := COALESCE(p_now, CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamp));
    RETURN QUERY
    WITH changed AS (
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        note = CASE
            WHEN r.job_name IS NOT NULL AND r.overlap = 'skip' AND EXISTS (
                 SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id AND o.status = 'running')
            THEN 'overlap: the previous run of this job was still running; policy skip'
            WHEN EXISTS (
                 SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                   AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                   AND n.status NOT IN ('skipped', 'cancelled'))
            THEN 'misfire: a later slot of this job is due too; caught up once, with the latest'
            WHEN EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name AND j.misfire = 'skip')
            THEN 'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
            ELSE 'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped' END
    WHERE r.status = 'pending' AND r.runnable_at <= CAST(p_now AS timestamp) AND r.job_name IS NOT NULL
      AND ((r.job_name IS NOT NULL AND r.overlap = 'skip' AND EXISTS (
                SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id AND o.status = 'running'))
           OR (r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND (
                EXISTS (SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                          AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                          AND n.status NOT IN ('skipped', 'cancelled'))
                OR EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name
                             AND (j.misfire = 'skip'
                                  OR r.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp))))))
    RETURNING 'skipped'::text AS decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
              r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds,
              r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note,
              r.step, r.steps, r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds, r.owner, r.params)
    SELECT x.decision, x.run_id, x.job_name, x.kind, x.command, x.target_database, x.attempt, x.failures,
           x.max_attempts, x.lapses, x.transient_errors, x.token, x.timeout_seconds, x.lease_seconds,
           x.operation_id, x.scheduled_for, x.runnable_at, x.started_at, x.note, x.step, x.steps,
           x.parent_run_id, x.parent_token, x.target_server, x.retry_interval_seconds,
           COALESCE(x.owner, j.owner, '')::varchar, x.params, jd.params
    FROM changed AS x LEFT JOIN agent.runs AS p ON p.run_id = x.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(x.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = x.job_name;
    RETURN QUERY
    WITH picked AS (
        SELECT c.run_id FROM agent.runs c
        WHERE c.status = 'pending' AND c.runnable_at <= CAST(p_now AS timestamp)
          AND NOT (c.task_order IS NOT NULL AND EXISTS (
                SELECT 1 FROM agent.runs t
                WHERE t.kind = 'task' AND t.task_order < c.task_order AND t.status IN ('pending', 'queued', 'running')))
          AND NOT (c.job_name IS NOT NULL AND c.overlap <> 'allow' AND EXISTS (
                SELECT 1 FROM agent.runs o
                WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
                  AND ((c.overlap = 'queue' AND o.status = 'running')
                       OR (o.status IN ('pending', 'queued')
                           AND (c.overlap = 'queue' OR o.runnable_at <= CAST(p_now AS timestamp))
                           AND (o.scheduled_for < c.scheduled_for
                                OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
        ORDER BY c.runnable_at, c.run_id
        LIMIT LEAST(CAST(p_batch AS INT), GREATEST(0, CAST(p_max_concurrency AS INT) - (
            (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'running' AND f.awaiting_targets = 0)
            + (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'queued' AND f.runnable_at <= CAST(p_now AS timestamp)))))
        FOR UPDATE OF c SKIP LOCKED),
    s AS (
        UPDATE agent.runs AS r SET
            status = 'running',
            token = r.token + 1,
            attempt = r.attempt + 1,
            dispatched_at = CAST(p_now AS timestamp),
            started_at = CAST(p_now AS timestamp),
            heartbeat_at = CAST(p_now AS timestamp),
            lease_expires_at = CAST(p_now AS timestamp) + r.lease_seconds * INTERVAL '1 second',
            worker = CAST(p_worker AS VARCHAR),
            dequeue_count = NULL
        FROM picked WHERE r.run_id = picked.run_id
        RETURNING 'start'::text AS decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
                  r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds,
                  r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note,
              r.step, r.steps, r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds, r.owner, r.params),
    a AS (
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT s.run_id, s.attempt, s.token, CAST(p_worker AS VARCHAR), NULL, CAST(p_now AS timestamp), 'running' FROM s)
    SELECT x.decision, x.run_id, x.job_name, x.kind, x.command, x.target_database, x.attempt, x.failures,
           x.max_attempts, x.lapses, x.transient_errors, x.token, x.timeout_seconds, x.lease_seconds,
           x.operation_id, x.scheduled_for, x.runnable_at, x.started_at, x.note, x.step, x.steps,
           x.parent_run_id, x.parent_token, x.target_server, x.retry_interval_seconds,
           COALESCE(x.owner, j.owner, '')::varchar, x.params, jd.params
    FROM s AS x LEFT JOIN agent.runs AS p ON p.run_id = x.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(x.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = x.job_name
    ORDER BY x.runnable_at, x.run_id;
END
$$;

DROP FUNCTION agent.start_run(timestamp, timestamp, int, bigint, bigint, varchar, int);
CREATE FUNCTION agent.start_run(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_run_id bigint, p_token bigint, p_worker varchar, p_dequeue_count int)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int, owner varchar, params text, job_params text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- The start lock is held until the commit: do not wait for the WAL flush with it held. A
    -- start lost in a server crash is taken back like any lapse (the token fences the worker).
    PERFORM set_config('synchronous_commit', 'off', true);
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
    RETURN QUERY
    WITH c AS (
        SELECT r.run_id,
               CASE WHEN r.runnable_at > CAST(p_now AS timestamp) THEN 'early'
                    WHEN r.job_name IS NOT NULL AND r.overlap = 'skip' AND EXISTS (
                         SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                           AND o.status = 'running') THEN 'skip-overlap'
                    WHEN r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND EXISTS (
                         SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                           AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                           AND n.status NOT IN ('skipped', 'cancelled')) THEN 'skip-superseded'
                    WHEN r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND EXISTS (
                         SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name AND j.misfire = 'skip') THEN 'skip-misfire'
                    WHEN r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND EXISTS (
                         SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name
                           AND r.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp)) THEN 'skip-grace'
                    WHEN r.task_order IS NOT NULL AND EXISTS (
                         SELECT 1 FROM agent.runs t WHERE t.kind = 'task' AND t.task_order < r.task_order
                           AND t.status IN ('pending', 'queued', 'running')) THEN 'held-order'
                    WHEN r.job_name IS NOT NULL AND r.overlap = 'queue' AND EXISTS (
                         SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                           AND (o.status = 'running'
                                OR (o.status IN ('pending', 'queued')
                                    AND (o.scheduled_for < r.scheduled_for
                                         OR (o.scheduled_for = r.scheduled_for AND o.run_id < r.run_id))))) THEN 'held-overlap'
                    WHEN (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'running' AND f.awaiting_targets = 0)
                         >= CAST(p_max_concurrency AS INT) THEN 'held-cap'
                    ELSE 'start' END AS decision
        FROM agent.runs AS r
        WHERE r.run_id = p_run_id AND r.token = p_token AND r.status = 'queued'
        FOR UPDATE),
    s AS (
        UPDATE agent.runs AS r SET
            status = CASE WHEN c.decision = 'start' THEN 'running' WHEN c.decision LIKE 'skip-%' THEN 'skipped'
                          WHEN c.decision LIKE 'held-%' THEN 'pending' ELSE r.status END,
            attempt = CASE WHEN c.decision = 'start' THEN r.attempt + 1 ELSE r.attempt END,
            started_at = CASE WHEN c.decision = 'start' THEN CAST(p_now AS timestamp) ELSE r.started_at END,
            heartbeat_at = CASE WHEN c.decision = 'start' THEN CAST(p_now AS timestamp) ELSE r.heartbeat_at END,
            lease_expires_at = CASE WHEN c.decision = 'start' THEN CAST(p_now AS timestamp) + r.lease_seconds * INTERVAL '1 second'
                                    WHEN c.decision = 'early' THEN r.lease_expires_at END,
            worker = CASE WHEN c.decision = 'start' THEN CAST(p_worker AS VARCHAR) ELSE r.worker END,
            dequeue_count = CASE WHEN c.decision = 'start' THEN CAST(p_dequeue_count AS INT) ELSE r.dequeue_count END,
            finished_at = CASE WHEN c.decision LIKE 'skip-%' THEN CAST(p_now AS timestamp) ELSE r.finished_at END,
            note = CASE c.decision
                WHEN 'skip-overlap' THEN 'overlap: the previous run of this job was still running; policy skip'
                WHEN 'skip-superseded' THEN 'misfire: a later slot of this job is due too; caught up once, with the latest'
                WHEN 'skip-misfire' THEN 'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
                WHEN 'skip-grace' THEN 'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped'
                WHEN 'held-order' THEN 'held: waits for the tasks of a lower order to finish'
                WHEN 'held-overlap' THEN 'held: waits for the previous run of this job (overlap queue)'
                WHEN 'held-cap' THEN 'held: AGENT_MAX_CONCURRENCY runs are executing'
                ELSE r.note END
        FROM c WHERE r.run_id = c.run_id
        RETURNING c.decision::text, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
                  r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds,
                  r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note,
              r.step, r.steps, r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds, r.owner, r.params),
    a AS (
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT s.run_id, s.attempt, s.token, CAST(p_worker AS VARCHAR), CAST(p_dequeue_count AS INT),
               CAST(p_now AS timestamp), 'running'
        FROM s WHERE s.decision = 'start')
    SELECT x.decision, x.run_id, x.job_name, x.kind, x.command, x.target_database, x.attempt, x.failures,
           x.max_attempts, x.lapses, x.transient_errors, x.token, x.timeout_seconds, x.lease_seconds,
           x.operation_id, x.scheduled_for, x.runnable_at, x.started_at, x.note, x.step, x.steps,
           x.parent_run_id, x.parent_token, x.target_server, x.retry_interval_seconds,
           COALESCE(x.owner, j.owner, '')::varchar, x.params, jd.params
    FROM s AS x LEFT JOIN agent.runs AS p ON p.run_id = x.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(x.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = x.job_name;
END
$$;

-- The parameters' checks, shared by agent.start_job and agent.set_job_params (as
-- shared/jobs/params.py checks them): a name is an identifier of at most 63 characters; names
-- compare ignoring letter case; not stmt or params (sp_executesql's own parameters, refused on every
-- dialect so that a job moves between them); a value is text of at most 1,000,000 characters (a JSON string:
-- PostgreSQL's text cannot hold U+0000, and json refuses \u0000 when it decodes it).
CREATE FUNCTION agent.param_name_ok(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT name ~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$' AND lower(name) NOT IN ('stmt', 'params')
$$;

-- Whether JSON text holds the escape \u0000 (NUL) outside an escaped backslash: json keeps it,
-- and decoding it to text fails with PostgreSQL's own error; the procedures name it instead.
CREATE FUNCTION agent.json_has_nul(doc text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT doc ~ '(^|[^\\])(\\\\)*\\u0000'
$$;

-- agent.start_job: the run `run-now` makes (the insert_manual_run row), under the start lock, with
-- the job's overlap policy; @params: its parameters as a JSON object {"name": "value"} (NULL: none
-- given), checked against the job's declarations, the defaults filled in, recorded on the run
-- (agent.runs.params). The values are data: the job's SQL reads them bound.
-- Since 0017 agent.start_job is the audited wrapper of agent.start_job_unaudited: both take @params now.
DROP FUNCTION agent.start_job(varchar);
DROP FUNCTION agent.start_job_unaudited(varchar);
CREATE FUNCTION agent.start_job_unaudited(job_name varchar, params text DEFAULT NULL)
RETURNS TABLE (run_id bigint, status varchar, note text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_job record;
    v_given json;
    v_declared json;
    v_values jsonb := '{}'::jsonb;
    v_key text;
    v_value json;
    v_name text;
    v_text text;
    v_params text;
    p text := 'agent.start_job: ';
BEGIN
    IF start_job_unaudited.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    SELECT j.job_name, j.valid, j.config_error, j.params INTO v_job FROM agent.jobs j
    WHERE j.job_name = start_job_unaudited.job_name AND j.configured = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(start_job_unaudited.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
    END IF;
    IF v_job.valid = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@job_name = ' || quote_literal(start_job_unaudited.job_name)
            || ': expected a valid job; it is invalid: ' || COALESCE(v_job.config_error, '?');
    END IF;
    v_declared := CAST(COALESCE(v_job.params, '{}') AS json);
    IF start_job_unaudited.params IS NOT NULL THEN
        BEGIN
            v_given := CAST(start_job_unaudited.params AS json);
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params = ' || quote_literal(left(start_job_unaudited.params, 80))
                || ': expected a JSON object {"name": "value", ...}';
        END;
        IF json_typeof(v_given) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params = ' || quote_literal(left(start_job_unaudited.params, 80))
                || ': expected a JSON object {"name": "value", ...}';
        END IF;
        IF agent.json_has_nul(start_job_unaudited.params) THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params = ' || quote_literal(left(start_job_unaudited.params, 80))
                || ': expected text without NUL (\u0000): PostgreSQL''s text cannot hold it';
        END IF;
        FOR v_key, v_value IN SELECT e.key, e.value FROM json_each(v_given) AS e LOOP
            SELECT d.key INTO v_name FROM json_each(v_declared) AS d WHERE lower(d.key) = lower(v_key);
            IF v_name IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(left(v_key, 80))
                    || ': expected a parameter job ' || quote_literal(start_job_unaudited.job_name) || ' declares ('
                    || COALESCE((SELECT string_agg(d.key, ', ' ORDER BY d.key) FROM json_each(v_declared) AS d), 'none') || ')';
            END IF;
            IF v_values ? v_name THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(left(v_key, 80))
                    || ': expected each parameter given once';
            END IF;
            IF json_typeof(v_value) <> 'string' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_name) || ' = '
                    || left(CAST(v_value AS text), 80) || ': expected a JSON string (a value is text)';
            END IF;
            BEGIN
                v_text := v_value #>> '{}';
            EXCEPTION WHEN others THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_name)
                    || ': expected text without NUL (U+0000): ' || SQLERRM;
            END;
            IF length(v_text) > 1000000 THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_name)
                    || ': expected at most 1000000 characters (found ' || length(v_text) || ')';
            END IF;
            v_values := v_values || jsonb_build_object(v_name, v_text);
            v_name := NULL;
        END LOOP;
    END IF;
    FOR v_key, v_value IN SELECT d.key, d.value FROM json_each(v_declared) AS d LOOP
        IF NOT v_values ? v_key THEN
            IF json_typeof(v_value) = 'null' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_key)
                    || ': expected a value: job ' || quote_literal(start_job_unaudited.job_name) || ' declares ' || quote_literal(v_key)
                    || ' without a default';
            END IF;
            v_values := v_values || jsonb_build_object(v_key, v_value #>> '{}');
        END IF;
    END LOOP;
    v_params := CASE WHEN v_values = '{}'::jsonb THEN NULL ELSE CAST(v_values AS text) END;
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
    RETURN QUERY
    INSERT INTO agent.runs AS r (job_name, kind, scheduled_for, status, command, target_database, overlap,
                                 max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                                 finished_at, operation_id, note, steps, params)
    SELECT j.job_name, 'manual', v_now, d.decision, j.command, j.target_database,
           j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, v_now, v_now,
           CASE WHEN d.decision = 'skipped' THEN v_now END,
           md5(random()::text || clock_timestamp()::text || j.job_name),
           CASE WHEN d.decision = 'skipped'
                THEN 'overlap: the previous run of this job was still in flight; policy skip'
                ELSE 'run-now' END,
           j.steps, v_params
    FROM agent.jobs j
    CROSS JOIN LATERAL (
        SELECT CASE WHEN j.overlap = 'skip' AND EXISTS (
                    SELECT 1 FROM agent.runs a
                    WHERE a.job_name = j.job_name
                      AND (a.status = 'running'
                           OR (a.status IN ('pending', 'queued') AND (a.runnable_at <= v_now OR a.kind = 'manual'))))
               THEN 'skipped' ELSE 'pending' END AS decision) AS d
    WHERE j.job_name = start_job_unaudited.job_name AND j.valid = 1 AND j.configured = 1
    RETURNING r.run_id, r.status, r.note;
END
$$;

-- agent.set_job_params: the parameters a job defined from the database declares (a settings job
-- takes JOB__<name>__PARAMS__<k>__DEFAULT / __REQUIRED), as agent.set_job_calendars sets its
-- calendars: @params a JSON object {"name": "default", or null: no default}; NULL or {}: none.
-- A redefinition by agent.add_scheduled_job keeps them.
CREATE FUNCTION agent.set_job_params_unaudited(job_name varchar, params text)
RETURNS TABLE (job varchar, declared text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_given json;
    v_declared jsonb := '{}'::jsonb;
    v_key text;
    v_value json;
    v_text text;
    v_params text;
    p text := 'agent.set_job_params: ';
BEGIN
    IF set_job_params_unaudited.params IS NOT NULL THEN
        BEGIN
            v_given := CAST(set_job_params_unaudited.params AS json);
        EXCEPTION WHEN others THEN
            v_given := NULL;
        END;
        IF v_given IS NULL OR json_typeof(v_given) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params = ' || quote_literal(left(set_job_params_unaudited.params, 80))
                || ': expected a JSON object {"name": "default", or null for none}';
        END IF;
        IF agent.json_has_nul(set_job_params_unaudited.params) THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params = ' || quote_literal(left(set_job_params_unaudited.params, 80))
                || ': expected text without NUL (\u0000): PostgreSQL''s text cannot hold it';
        END IF;
        FOR v_key, v_value IN SELECT e.key, e.value FROM json_each(v_given) AS e LOOP
            IF NOT agent.param_name_ok(v_key) THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(left(v_key, 80))
                    || ': expected a parameter name: a letter or _, then letters, digits or _, at most 63 characters, not stmt or params';
            END IF;
            IF EXISTS (SELECT 1 FROM jsonb_object_keys(v_declared) AS k WHERE lower(k) = lower(v_key)) THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_key)
                    || ': expected names that differ by more than letter case';
            END IF;
            IF json_typeof(v_value) NOT IN ('string', 'null') THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_key) || ' = '
                    || left(CAST(v_value AS text), 80) || ': expected a JSON string (the default) or null (no default)';
            END IF;
            BEGIN
                v_text := v_value #>> '{}';
            EXCEPTION WHEN others THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_key)
                    || ': expected text without NUL (U+0000): ' || SQLERRM;
            END;
            IF length(v_text) > 1000000 THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params ' || quote_literal(v_key)
                    || ': expected a default of at most 1000000 characters';
            END IF;
            v_declared := v_declared || jsonb_build_object(v_key, v_text);
        END LOOP;
        IF (SELECT count(*) FROM jsonb_object_keys(v_declared)) > 50 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@params: expected at most 50 parameters';
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = set_job_params_unaudited.job_name AND j.configured = 1
                                              AND j.defined_in_database = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || COALESCE(quote_literal(left(set_job_params_unaudited.job_name, 80)), 'NULL')
            || ': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes '
            || 'JOB__<name>__PARAMS__<k>__DEFAULT or __REQUIRED)';
    END IF;
    v_params := CASE WHEN v_declared = '{}'::jsonb THEN NULL ELSE CAST(v_declared AS text) END;
    UPDATE agent.jobs AS j SET params = v_params, updated_at = v_now WHERE j.job_name = set_job_params_unaudited.job_name;
    RETURN QUERY SELECT set_job_params_unaudited.job_name, v_params;
END
$$;

-- The audited functions of the old names (0017's way): the call and its audit row in one transaction.
CREATE FUNCTION agent.start_job(job_name varchar, params text DEFAULT NULL)
RETURNS TABLE (run_id bigint, status varchar, note text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run bigint;
    v_status varchar;
    v_note text;
BEGIN
    FOR v_run, v_status, v_note IN SELECT r.run_id, r.status, r.note FROM agent.start_job_unaudited($1, $2) AS r LOOP
        RETURN QUERY SELECT v_run, v_status, v_note;
    END LOOP;
    PERFORM agent.audit_procedure_call('run-now', $1, v_run,
        jsonb_build_object('job_name', left($1, 200), 'params', left($2, 2000)), v_status || COALESCE(': ' || v_note, ''));
    RETURN;
END
$$;

CREATE FUNCTION agent.set_job_params(job_name varchar, params text)
RETURNS TABLE (job varchar, declared text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT * FROM agent.set_job_params_unaudited($1, $2);
    PERFORM agent.audit_procedure_call('set-params', $1, NULL,
        jsonb_build_object('job_name', left($1, 200), 'params', left($2, 2000)), 'declared');
END
$$;

REVOKE ALL ON FUNCTION agent.start_job_unaudited(varchar, text) FROM PUBLIC, agent_operator;
REVOKE ALL ON FUNCTION agent.set_job_params_unaudited(varchar, text) FROM PUBLIC, agent_operator;
REVOKE ALL ON FUNCTION agent.start_job(varchar, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.start_job(varchar, text) TO agent_operator;
REVOKE ALL ON FUNCTION agent.set_job_params(varchar, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.set_job_params(varchar, text) TO agent_operator;
-- The helpers are the procedures' own (called inside them, as their owner): nobody else's.
REVOKE ALL ON FUNCTION agent.param_name_ok(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.json_has_nul(text) FROM PUBLIC;
