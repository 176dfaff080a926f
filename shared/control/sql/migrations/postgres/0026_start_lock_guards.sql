-- 0026 less work under the start lock (issue 35, concurrency 4): agent.dispatch_runs,
-- agent.claim_runs and agent.start_run take agent.start_lock (SHARE ROW EXCLUSIVE) and hold it
-- to their commit, so the starts run one at a time; every one of them ran the statements of the
-- rare policies (misfire and overlap skip, buffer-one, cancel-previous) whatever the queue held,
-- and cancel-previous's read every run in flight (a bitmap scan of all pending, queued and running
-- runs: a claim from a queue of 1,000 tasks read the 1,000 of them twice, about half of its time).
-- Each of those statements now runs only when a run it could act on exists, asked first by an
-- index probe that is a necessary condition of the statement's own WHERE (a due pending run of a
-- job — the runs_pending_jobs index —, of that overlap policy for buffer-one and cancel-previous;
-- for start_run's cancel-previous, the queued run it names, by its primary key). What they decide
-- is unchanged (the same statements, in the same order, under the same lock): a claim from a
-- plain queue of tasks does the claim alone under the lock. Signatures unchanged: CREATE OR
-- REPLACE keeps their grants.

CREATE OR REPLACE FUNCTION agent.dispatch_runs(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_lookahead_until timestamp, p_ahead_limit int, p_dispatch_lease_seconds int)
RETURNS TABLE (decision text, run_id bigint, token bigint, job_name varchar, kind varchar, operation_id varchar, scheduled_for timestamp, attempt int, runnable_at timestamp, note text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE;
    -- The rare policies (misfire, overlap skip, buffer-one) act only on a due pending run of a
    -- job: their statements run only when one exists (an index probe of runs_pending_jobs).
    IF EXISTS (SELECT 1 FROM agent.runs g WHERE g.status = 'pending' AND g.job_name IS NOT NULL
                 AND g.runnable_at <= CAST(p_now AS timestamp)) THEN
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
        IF EXISTS (SELECT 1 FROM agent.runs g WHERE g.status = 'pending' AND g.job_name IS NOT NULL
                     AND g.runnable_at <= CAST(p_now AS timestamp) AND g.overlap = 'buffer-one') THEN
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
        END IF;
    END IF;
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
    -- The rare policies (misfire, overlap skip, buffer-one, cancel-previous) act only on a due
    -- pending run of a job: their statements run only when one exists (an index probe of
    -- runs_pending_jobs), so a claim from a queue of tasks does only the claim under the lock.
    IF EXISTS (SELECT 1 FROM agent.runs g WHERE g.status = 'pending' AND g.job_name IS NOT NULL
                 AND g.runnable_at <= CAST(p_now AS timestamp)) THEN
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
        IF EXISTS (SELECT 1 FROM agent.runs g WHERE g.status = 'pending' AND g.job_name IS NOT NULL
                     AND g.runnable_at <= CAST(p_now AS timestamp) AND g.overlap = 'buffer-one') THEN
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
        END IF;
        IF EXISTS (SELECT 1 FROM agent.runs g WHERE g.status = 'pending' AND g.job_name IS NOT NULL
                     AND g.runnable_at <= CAST(p_now AS timestamp) AND g.overlap = 'cancel-previous') THEN
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
        END IF;
    END IF;
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
    -- (Only when the run named is one of a job with that policy, queued with this token: a
    -- primary key probe, so a start of any other run does not look at the runs in flight.)
    IF EXISTS (SELECT 1 FROM agent.runs g WHERE g.run_id = p_run_id AND g.token = p_token AND g.status = 'queued'
                 AND g.job_name IS NOT NULL AND g.overlap = 'cancel-previous') THEN
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
    END IF;
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
