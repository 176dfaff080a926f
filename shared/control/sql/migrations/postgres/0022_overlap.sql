-- 0022 overlap policies buffer-one and cancel-previous (issue 33 item 5).
--
-- * buffer-one: a due run waits while a run of its job is running (as queue), but at most one
--   waits: a due run while one runs and another (older) already waits is skipped, its note
--   'overlap: a run of this job was running and another was already waiting; policy buffer-one'.
-- * cancel-previous: when a run is due, the runs of its job in flight before it (running, due,
--   queued or waiting for a retry) are stopped as `stop JOB` stops them (cancelled, the token bump
--   fences the worker, whose lease renewal finds it gone and stops the work; their fleet target
--   executions with them), noted 'stopped: a newer run of this job is due; policy cancel-previous',
--   and the new run starts.
-- Decided under the start lock, set-based, in agent.dispatch_runs, agent.claim_runs and
-- agent.start_run (their signatures unchanged: CREATE OR REPLACE keeps their grants), and
-- accepted by agent.add_scheduled_job's @overlap (its body, agent.add_scheduled_job_unaudited,
-- since 0017). agent.jobs.overlap and agent.runs.overlap (VARCHAR(16)) hold both names.
--
-- * agent.runs.kind 'backfill': a run `sql-agent backfill` made for a slot of a past window (keyed
--   by its slot, as the scheduled run of that slot would be; outside the misfire rules).

-- * agent.jobs.catchup_seconds (JOB__<name>__CATCHUP_SECONDS; 0: none): after downtime, every
--   missed slot within that many seconds of now is claimed to run, oldest first (noted
--   'catch-up: ...'), and a claim never skips such a run as a misfire; overlap and the cap apply.

ALTER TABLE agent.jobs ADD COLUMN catchup_seconds INT NOT NULL DEFAULT 0;
ALTER TABLE agent.runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('scheduled', 'manual', 'task', 'target', 'backfill'));

CREATE OR REPLACE FUNCTION agent.dispatch_runs(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_lookahead_until timestamp, p_ahead_limit int, p_dispatch_lease_seconds int)
RETURNS TABLE (decision text, run_id bigint, token bigint, job_name varchar, kind varchar, operation_id varchar, scheduled_for timestamp, attempt int, runnable_at timestamp, note text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
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
           OR (r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND (
                EXISTS (SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                          AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                          AND n.status NOT IN ('skipped', 'cancelled'))
                OR EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name
                             AND (j.misfire = 'skip'
                                  OR r.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp))))))
    RETURNING 'skipped'::text AS decision, r.run_id, r.token, r.job_name, r.kind, r.operation_id, r.scheduled_for,
              r.attempt, r.runnable_at, r.note)
        SELECT decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note FROM changed;
    -- Overlap buffer-one: a due run while one of its job runs and another already waits is skipped.
    RETURN QUERY
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        note = 'overlap: a run of this job was running and another was already waiting; policy buffer-one'
    WHERE r.status = 'pending' AND r.runnable_at <= CAST(p_now AS timestamp) AND r.job_name IS NOT NULL AND r.overlap = 'buffer-one'
      AND EXISTS (SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                    AND o.status = 'running')
      AND EXISTS (SELECT 1 FROM agent.runs w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                    AND w.status IN ('pending', 'queued') AND w.runnable_at <= CAST(p_now AS timestamp)
                    AND (w.scheduled_for < r.scheduled_for
                         OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id)))
    RETURNING 'skipped'::text, r.run_id, r.token, r.job_name, r.kind, r.operation_id, r.scheduled_for,
              r.attempt, r.runnable_at, r.note;
    RETURN QUERY
    WITH due AS (
        SELECT c.run_id FROM agent.runs c
        WHERE c.status = 'pending' AND c.runnable_at <= CAST(p_now AS timestamp)
          AND NOT (c.task_order IS NOT NULL AND EXISTS (
                SELECT 1 FROM agent.runs t
                WHERE t.kind = 'task' AND t.task_order < c.task_order AND t.status IN ('pending', 'queued', 'running')))
          AND NOT (c.job_name IS NOT NULL AND c.overlap <> 'allow' AND EXISTS (
                SELECT 1 FROM agent.runs o
                WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
                  AND ((c.overlap IN ('queue', 'buffer-one') AND o.status = 'running')
                       OR (o.status IN ('pending', 'queued')
                           AND (c.overlap IN ('queue', 'buffer-one') OR o.runnable_at <= CAST(p_now AS timestamp))
                           AND (o.scheduled_for < c.scheduled_for
                                OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
        ORDER BY c.runnable_at, c.run_id
        LIMIT GREATEST(0, CAST(p_max_concurrency AS INT) - (
            (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'running' AND f.awaiting_targets = 0)
            + (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'queued' AND f.runnable_at <= CAST(p_now AS timestamp))))
        FOR UPDATE OF c SKIP LOCKED),
    ahead AS (
        SELECT c.run_id FROM agent.runs c
        WHERE c.status = 'pending' AND c.runnable_at > CAST(p_now AS timestamp)
          AND c.runnable_at <= CAST(p_lookahead_until AS timestamp)
        ORDER BY c.runnable_at, c.run_id
        LIMIT CAST(p_ahead_limit AS INT)
        FOR UPDATE OF c SKIP LOCKED)
    UPDATE agent.runs AS r SET
        status = 'queued',
        token = r.token + 1,
        lease_expires_at = GREATEST(r.runnable_at, CAST(p_now AS timestamp))
                           + CAST(p_dispatch_lease_seconds AS INT) * INTERVAL '1 second',
        dispatched_at = CAST(p_now AS timestamp)
    WHERE r.run_id IN (SELECT run_id FROM due UNION ALL SELECT run_id FROM ahead)
    RETURNING 'queued'::text AS decision, r.run_id, r.token, r.job_name, r.kind, r.operation_id, r.scheduled_for,
              r.attempt, r.runnable_at, r.note;
END
$$;

CREATE OR REPLACE FUNCTION agent.claim_runs(p_now timestamp, p_late_cutoff timestamp, p_batch int, p_max_concurrency int, p_worker varchar)
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
           OR (r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND (
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
    -- Overlap buffer-one: a due run while one of its job runs and another already waits is skipped.
    RETURN QUERY
    WITH changed AS (
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        note = 'overlap: a run of this job was running and another was already waiting; policy buffer-one'
    WHERE r.status = 'pending' AND r.runnable_at <= CAST(p_now AS timestamp) AND r.job_name IS NOT NULL AND r.overlap = 'buffer-one'
      AND EXISTS (SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                    AND o.status = 'running')
      AND EXISTS (SELECT 1 FROM agent.runs w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                    AND w.status IN ('pending', 'queued') AND w.runnable_at <= CAST(p_now AS timestamp)
                    AND (w.scheduled_for < r.scheduled_for
                         OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id)))
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
    -- Overlap cancel-previous: the runs of its job in flight before a due run are stopped, as
    -- `stop` stops them (cancelled, the token bump fences their workers), their fleet target
    -- executions with them.
    UPDATE agent.runs AS x SET status = 'cancelled', token = x.token + 1, finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        note = 'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
    WHERE x.parent_run_id IS NOT NULL AND x.status IN ('waiting', 'pending', 'queued', 'running')
      AND x.parent_run_id IN (SELECT p.run_id FROM agent.runs p WHERE p.job_name IS NOT NULL AND p.status IN ('pending', 'queued', 'running')
          AND (p.status = 'running' OR p.runnable_at <= CAST(p_now AS timestamp) OR p.attempt > 0)
          AND EXISTS (SELECT 1 FROM agent.runs c WHERE c.job_name = p.job_name AND c.run_id <> p.run_id AND p.kind <> 'backfill'
                        AND c.overlap = 'cancel-previous' AND c.status = 'pending' AND c.runnable_at <= CAST(p_now AS timestamp)
                        AND (p.scheduled_for < c.scheduled_for
                             OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id))));
    RETURN QUERY
    WITH changed AS (
    UPDATE agent.runs AS r SET status = 'cancelled', token = r.token + 1, finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        awaiting_targets = 0, note = 'stopped: a newer run of this job is due; policy cancel-previous'
    WHERE r.job_name IS NOT NULL AND r.status IN ('pending', 'queued', 'running')
          AND (r.status = 'running' OR r.runnable_at <= CAST(p_now AS timestamp) OR r.attempt > 0)
          AND EXISTS (SELECT 1 FROM agent.runs c WHERE c.job_name = r.job_name AND c.run_id <> r.run_id AND r.kind <> 'backfill'
                        AND c.overlap = 'cancel-previous' AND c.status = 'pending' AND c.runnable_at <= CAST(p_now AS timestamp)
                        AND (r.scheduled_for < c.scheduled_for
                             OR (r.scheduled_for = c.scheduled_for AND r.run_id < c.run_id)))
    RETURNING 'cancelled'::text AS decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
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
                  AND ((c.overlap IN ('queue', 'buffer-one') AND o.status = 'running')
                       OR (o.status IN ('pending', 'queued')
                           AND (c.overlap IN ('queue', 'buffer-one') OR o.runnable_at <= CAST(p_now AS timestamp))
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

CREATE OR REPLACE FUNCTION agent.start_run(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_run_id bigint, p_token bigint, p_worker varchar, p_dequeue_count int)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int, owner varchar, params text, job_params text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- The start lock is held until the commit: do not wait for the WAL flush with it held. A
    -- start lost in a server crash is taken back like any lapse (the token fences the worker).
    PERFORM set_config('synchronous_commit', 'off', true);
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
    -- Overlap cancel-previous: when the run may start (not early, skipped by its misfire policy or
    -- held by task order), the runs of its job in flight before it are stopped first, as `stop`
    -- stops them, their fleet target executions with them.
    UPDATE agent.runs AS x SET status = 'cancelled', token = x.token + 1, finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        note = 'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
    WHERE x.parent_run_id IS NOT NULL AND x.status IN ('waiting', 'pending', 'queued', 'running')
      AND x.parent_run_id IN (SELECT p.run_id FROM agent.runs p WHERE p.job_name IS NOT NULL AND p.status IN ('pending', 'queued', 'running')
          AND (p.status = 'running' OR p.runnable_at <= CAST(p_now AS timestamp) OR p.attempt > 0)
          AND EXISTS (SELECT 1 FROM agent.runs c WHERE c.job_name = p.job_name AND c.run_id <> p.run_id AND p.kind <> 'backfill'
                        AND c.overlap = 'cancel-previous' AND c.run_id = p_run_id AND c.token = p_token AND c.status = 'queued' AND c.runnable_at <= CAST(p_now AS timestamp)
                        AND NOT (c.kind = 'scheduled' AND c.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(c.note, '') NOT LIKE 'catch-up:%' AND (
                             EXISTS (SELECT 1 FROM agent.runs n WHERE n.job_name = c.job_name AND n.kind = 'scheduled'
                                       AND n.scheduled_for > c.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                                       AND n.status NOT IN ('skipped', 'cancelled'))
                             OR EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = c.job_name
                                          AND (j.misfire = 'skip'
                                               OR c.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp)))))
                        AND NOT (c.task_order IS NOT NULL AND EXISTS (
                             SELECT 1 FROM agent.runs t WHERE t.kind = 'task' AND t.task_order < c.task_order
                               AND t.status IN ('pending', 'queued', 'running')))
                        AND (p.scheduled_for < c.scheduled_for
                             OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id))));
    UPDATE agent.runs AS o SET status = 'cancelled', token = o.token + 1, finished_at = CAST(p_now AS timestamp), lease_expires_at = NULL,
        awaiting_targets = 0, note = 'stopped: a newer run of this job is due; policy cancel-previous'
    WHERE o.job_name IS NOT NULL AND o.status IN ('pending', 'queued', 'running')
          AND (o.status = 'running' OR o.runnable_at <= CAST(p_now AS timestamp) OR o.attempt > 0)
          AND EXISTS (SELECT 1 FROM agent.runs c WHERE c.job_name = o.job_name AND c.run_id <> o.run_id AND o.kind <> 'backfill'
                        AND c.overlap = 'cancel-previous' AND c.run_id = p_run_id AND c.token = p_token AND c.status = 'queued' AND c.runnable_at <= CAST(p_now AS timestamp)
                        AND NOT (c.kind = 'scheduled' AND c.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(c.note, '') NOT LIKE 'catch-up:%' AND (
                             EXISTS (SELECT 1 FROM agent.runs n WHERE n.job_name = c.job_name AND n.kind = 'scheduled'
                                       AND n.scheduled_for > c.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                                       AND n.status NOT IN ('skipped', 'cancelled'))
                             OR EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = c.job_name
                                          AND (j.misfire = 'skip'
                                               OR c.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp)))))
                        AND NOT (c.task_order IS NOT NULL AND EXISTS (
                             SELECT 1 FROM agent.runs t WHERE t.kind = 'task' AND t.task_order < c.task_order
                               AND t.status IN ('pending', 'queued', 'running')))
                        AND (o.scheduled_for < c.scheduled_for
                             OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id)));
    RETURN QUERY
    WITH c AS (
        SELECT r.run_id,
               CASE WHEN r.runnable_at > CAST(p_now AS timestamp) THEN 'early'
                    WHEN r.job_name IS NOT NULL AND r.overlap = 'skip' AND EXISTS (
                         SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                           AND o.status = 'running') THEN 'skip-overlap'
                    WHEN r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND EXISTS (
                         SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                           AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                           AND n.status NOT IN ('skipped', 'cancelled')) THEN 'skip-superseded'
                    WHEN r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND EXISTS (
                         SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name AND j.misfire = 'skip') THEN 'skip-misfire'
                    WHEN r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND COALESCE(r.note, '') NOT LIKE 'catch-up:%' AND EXISTS (
                         SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name
                           AND r.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp)) THEN 'skip-grace'
                    WHEN r.task_order IS NOT NULL AND EXISTS (
                         SELECT 1 FROM agent.runs t WHERE t.kind = 'task' AND t.task_order < r.task_order
                           AND t.status IN ('pending', 'queued', 'running')) THEN 'held-order'
                    WHEN r.job_name IS NOT NULL AND r.overlap = 'buffer-one' AND EXISTS (
                         SELECT 1 FROM agent.runs o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                           AND o.status = 'running') AND EXISTS (
                         SELECT 1 FROM agent.runs w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                           AND w.status IN ('pending', 'queued') AND w.runnable_at <= CAST(p_now AS timestamp)
                           AND (w.scheduled_for < r.scheduled_for
                                OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id))) THEN 'skip-buffer'
                    WHEN r.job_name IS NOT NULL AND r.overlap IN ('queue', 'buffer-one') AND EXISTS (
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
                WHEN 'skip-buffer' THEN 'overlap: a run of this job was running and another was already waiting; policy buffer-one'
                WHEN 'skip-superseded' THEN 'misfire: a later slot of this job is due too; caught up once, with the latest'
                WHEN 'skip-misfire' THEN 'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
                WHEN 'skip-grace' THEN 'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped'
                WHEN 'held-order' THEN 'held: waits for the tasks of a lower order to finish'
                WHEN 'held-overlap' THEN CASE WHEN r.overlap = 'buffer-one'
                                              THEN 'held: waits for the previous run of this job (overlap buffer-one)'
                                              ELSE 'held: waits for the previous run of this job (overlap queue)' END
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

-- agent.add_scheduled_job takes @target_stagger_seconds (issue 33's loose end: TARGET_STAGGER_SECONDS
-- for a fleet job defined from T-SQL; agent.jobs.requested_target_stagger_seconds, planned into its
-- fleet step as @target_parallelism is) and @overlap's two new names: a parameter more, so the
-- audited function and its body are dropped and created again (0017's way), with their grants.
ALTER TABLE agent.jobs ADD COLUMN requested_target_stagger_seconds INT NULL;
DROP FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar);
DROP FUNCTION agent.add_scheduled_job_unaudited(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar);
CREATE FUNCTION agent.add_scheduled_job_unaudited(name varchar, sql text, schedule varchar DEFAULT NULL,
                                        run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC',
                                        enabled int DEFAULT 1, max_attempts int DEFAULT 3,
                                        timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip',
                                        "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once',
                                        grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60,
                                        targets varchar DEFAULT NULL, target_parallelism int DEFAULT 8,
                                        "after" varchar DEFAULT NULL, after_outcome varchar DEFAULT 'succeeded',
                                        target_stagger_seconds int DEFAULT 0)
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
                                 requested_target_stagger_seconds)
    VALUES (add_scheduled_job_unaudited.name, v_schedule, add_scheduled_job_unaudited.timezone, add_scheduled_job_unaudited.sql,
            add_scheduled_job_unaudited."database", add_scheduled_job_unaudited.enabled, 1, NULL, add_scheduled_job_unaudited.max_attempts,
            add_scheduled_job_unaudited.timeout_seconds, add_scheduled_job_unaudited.lease_seconds, lower(add_scheduled_job_unaudited.misfire),
            add_scheduled_job_unaudited.grace_seconds, lower(add_scheduled_job_unaudited.overlap), NULL, NULL, 1, v_now, 1, 1, NULL,
            btrim(add_scheduled_job_unaudited.targets), add_scheduled_job_unaudited.target_parallelism,
            agent.calling_principal(), v_leader,
            CASE WHEN v_leader IS NOT NULL THEN lower(add_scheduled_job_unaudited.after_outcome) END,
            NULLIF(add_scheduled_job_unaudited.target_stagger_seconds, 0))
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
        requested_target_stagger_seconds = EXCLUDED.requested_target_stagger_seconds;
    RETURN QUERY SELECT CAST(add_scheduled_job_unaudited.name AS varchar), v_action;
END
$$;
REVOKE ALL ON FUNCTION agent.add_scheduled_job_unaudited(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int) FROM PUBLIC, agent_operator;

CREATE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL, run_at timestamptz DEFAULT NULL, timezone varchar DEFAULT 'UTC', enabled int DEFAULT 1, max_attempts int DEFAULT 3, timeout_seconds int DEFAULT 1800, overlap varchar DEFAULT 'skip', "database" varchar DEFAULT NULL, misfire varchar DEFAULT 'run-once', grace_seconds int DEFAULT 86400, lease_seconds int DEFAULT 60, targets varchar DEFAULT NULL, target_parallelism int DEFAULT 8, "after" varchar DEFAULT NULL, after_outcome varchar DEFAULT 'succeeded', target_stagger_seconds int DEFAULT 0)
RETURNS TABLE (job_name varchar, action text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rows bigint;
BEGIN
    RETURN QUERY SELECT * FROM agent.add_scheduled_job_unaudited($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM agent.audit_procedure_call('define', $1, NULL, jsonb_build_object('name', left($1, 200), 'sql', left($2, 2000), 'schedule', left($3, 200), 'run_at', $4, 'timezone', left($5, 100), 'enabled', $6, 'max_attempts', $7, 'timeout_seconds', $8, 'overlap', left($9, 20), 'database', left($10, 200), 'misfire', left($11, 20), 'grace_seconds', $12, 'lease_seconds', $13, 'targets', left($14, 400), 'target_parallelism', $15, 'after', left($16, 400), 'after_outcome', left($17, 20), 'target_stagger_seconds', $18), v_rows || ' row(s)');
    RETURN;
END
$$;
REVOKE ALL ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int, varchar, varchar, int) TO agent_operator;

-- agent.remove_scheduled_job (its body since 0017): the job's backfill runs not yet started are
-- skipped with its slots claimed ahead (a removed job runs nothing more of a backfill).
CREATE OR REPLACE FUNCTION agent.remove_scheduled_job_unaudited(name varchar)
RETURNS TABLE (job_name varchar, skipped_runs int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_existing record;
    v_skipped int := 0;
    p text := 'agent.remove_scheduled_job: ';
BEGIN
    IF remove_scheduled_job_unaudited.name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = NULL: expected the name of a job defined by agent.add_scheduled_job';
    END IF;
    PERFORM pg_advisory_xact_lock(7428014);
    SELECT j.job_name, j.defined_in_database, j.configured INTO v_existing FROM agent.jobs j
    WHERE j.job_name = remove_scheduled_job_unaudited.name AND j.configured = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@name = ' || quote_literal(left(remove_scheduled_job_unaudited.name, 80))
            || ': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
    END IF;
    IF v_existing.defined_in_database = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(remove_scheduled_job_unaudited.name)
            || ': expected a job defined in the database; this job is defined in the app settings (JOB__'
            || remove_scheduled_job_unaudited.name || '__*): remove it there';
    END IF;
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job was removed by agent.remove_scheduled_job after this slot was claimed'
    WHERE r.job_name = remove_scheduled_job_unaudited.name AND r.kind IN ('scheduled', 'backfill')
      AND (r.status IN ('pending', 'queued')
           OR (r.status = 'skipped' AND r.note = 'paused' AND r.attempt = 0 AND r.scheduled_for >= v_now));
    GET DIAGNOSTICS v_skipped = ROW_COUNT;
    UPDATE agent.jobs AS j SET configured = 0, next_due_at = NULL, needs_planning = 0, updated_at = v_now
    WHERE j.job_name = remove_scheduled_job_unaudited.name;
    DELETE FROM agent.state AS s WHERE s.state_key = 'job_config_hash';
    RETURN QUERY SELECT CAST(remove_scheduled_job_unaudited.name AS varchar), v_skipped;
END
$$;
