-- 0020 run with parameters, and SQL Agent's tokens at run time (issue 33 item 4).
--
-- * agent.jobs.params: the parameters a job declares (JOB__<name>__PARAMS__<k>__DEFAULT, or
--   agent.add_scheduled_job's @params), as a JSON object {name: default, or null: no default};
--   NULL: none.
-- * agent.runs.params: the values a run was started with (run-now --param, agent.start_job's
--   @params), the job's defaults filled in, as a JSON object; NULL: none given (a scheduled
--   run reads the job's defaults). Recorded with the run and shown in history.
-- * agent.claim_runs and agent.start_run return the run's params, the job's declarations,
--   the job's time zone and name (a fleet execution's too, through its parent) in the claim's own statement (no round trip more for any run): the
--   executor binds the values (never pasted into the SQL) and replaces the run-time SQL Agent
--   tokens ($(ESCAPE_SQUOTE(STRTDT)) ...) in the job's time zone.

ALTER TABLE agent.jobs ADD COLUMN params TEXT NULL;
ALTER TABLE agent.runs ADD COLUMN params TEXT NULL;

DROP FUNCTION agent.claim_runs(timestamp, timestamp, int, int, varchar);
CREATE FUNCTION agent.claim_runs(p_now timestamp, p_late_cutoff timestamp, p_batch int, p_max_concurrency int, p_worker varchar)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int, owner varchar, params text, job_params text, job_timezone varchar, run_job_name varchar)
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
           COALESCE(x.owner, j.owner, '')::varchar, x.params, jd.params, jd.timezone, jd.job_name
    FROM changed AS x LEFT JOIN agent.runs AS p ON p.run_id = x.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(x.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = COALESCE(x.job_name, p.job_name);
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
           COALESCE(x.owner, j.owner, '')::varchar, x.params, jd.params, jd.timezone, jd.job_name
    FROM s AS x LEFT JOIN agent.runs AS p ON p.run_id = x.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(x.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = COALESCE(x.job_name, p.job_name)
    ORDER BY x.runnable_at, x.run_id;
END
$$;

DROP FUNCTION agent.start_run(timestamp, timestamp, int, bigint, bigint, varchar, int);
CREATE FUNCTION agent.start_run(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_run_id bigint, p_token bigint, p_worker varchar, p_dequeue_count int)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int, owner varchar, params text, job_params text, job_timezone varchar, run_job_name varchar)
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
           COALESCE(x.owner, j.owner, '')::varchar, x.params, jd.params, jd.timezone, jd.job_name
    FROM s AS x LEFT JOIN agent.runs AS p ON p.run_id = x.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(x.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = COALESCE(x.job_name, p.job_name);
END
$$;
