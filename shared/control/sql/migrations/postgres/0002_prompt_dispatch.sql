-- 0002 prompt dispatch: the runs table is the queue of the local runner, starts are decided
-- under one lock (cap, task order, overlap), and a lease lapse or a transient error no longer
-- spends the run's attempts.

-- Starts (and dispatches) take this table's lock for the rest of their transaction, so the
-- concurrency cap, the task order and the overlap policy are decided by one starter at a time.
CREATE TABLE agent.start_lock (
    lock_id INT PRIMARY KEY
);
INSERT INTO agent.start_lock (lock_id) VALUES (1);

-- attempt counts every start (the history numbering); failures counts the attempts spent by
-- errors in the job's SQL (bounded by max_attempts); lapses counts leases that lapsed because
-- the worker died or lost the database (bounded by AGENT_MAX_LAPSES); transient_errors counts
-- transient failures of the local runner (bounded by AGENT_MAX_DEQUEUE_COUNT, as deliveries are).
ALTER TABLE agent.runs ADD COLUMN failures INT NOT NULL DEFAULT 0;
ALTER TABLE agent.runs ADD COLUMN lapses INT NOT NULL DEFAULT 0;
ALTER TABLE agent.runs ADD COLUMN transient_errors INT NOT NULL DEFAULT 0;
UPDATE agent.runs SET failures = CASE WHEN status IN ('failed', 'pending', 'poisoned') THEN attempt
                                      ELSE GREATEST(attempt - 1, 0) END;
ALTER TABLE agent.runs ADD CONSTRAINT runs_status_check CHECK (status IN (
    'pending', 'queued', 'running', 'succeeded', 'failed', 'poisoned', 'skipped', 'cancelled'));
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('scheduled', 'manual', 'task'));

-- The tick time that last moved a job's next slot: a tick whose clock ran far ahead is found
-- (advanced_at later than any sane tick) and undone by the next sane tick.
ALTER TABLE agent.jobs ADD COLUMN advanced_at TIMESTAMP NULL;

-- What a starter looks for: pending runs in the order they became runnable.
CREATE INDEX runs_pending ON agent.runs (runnable_at, run_id) WHERE status = 'pending';

-- The local runner claims straight from agent.runs; the queue table is gone.
DROP TABLE agent.queue_messages;

-- Slots that may have to be skipped (overlap, misfire) are job runs: a backlog of tasks costs
-- the skip pass nothing.
CREATE INDEX runs_pending_jobs ON agent.runs (runnable_at) WHERE status = 'pending' AND job_name IS NOT NULL;

-- Task order is checked at every start: the unfinished tasks, by order.
CREATE INDEX runs_open_tasks ON agent.runs (task_order)
    WHERE kind = 'task' AND status IN ('pending', 'queued', 'running');

-- The hot statements as functions: PostgreSQL plans a function's statements once per session
-- (a long statement sent as text is parsed and planned on every call), which is most of what a
-- claim costs. Each takes the start lock first; every statement after it sees what the other
-- starters committed (READ COMMITTED: a new snapshot per statement). Their bodies are the
-- named queries' logic, one statement each; shared/control/sql/postgres.sql calls them.

-- The local runner's claim: skip what may not run, start what may.
CREATE FUNCTION agent.claim_runs(p_now timestamp, p_late_cutoff timestamp, p_batch int, p_max_concurrency int, p_worker varchar)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- The start lock is held until the commit: do not wait for the WAL flush with it held. A
    -- start lost in a server crash is taken back like any lapse (the token fences the worker).
    PERFORM set_config('synchronous_commit', 'off', true);
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
           OR (r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND (
                EXISTS (SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                          AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                          AND n.status NOT IN ('skipped', 'cancelled'))
                OR EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name
                             AND (j.misfire = 'skip'
                                  OR r.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp))))))
    RETURNING 'skipped'::text AS decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
              r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds,
              r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note)
        SELECT decision, run_id, job_name, kind, command, target_database, attempt, failures, max_attempts, lapses, transient_errors, token, timeout_seconds, lease_seconds, operation_id, scheduled_for, runnable_at, started_at, note FROM changed;
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
            (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'running')
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
                  r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note),
    a AS (
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT s.run_id, s.attempt, s.token, CAST(p_worker AS VARCHAR), NULL, CAST(p_now AS timestamp), 'running' FROM s)
    SELECT decision, run_id, job_name, kind, command, target_database, attempt, failures, max_attempts, lapses,
           transient_errors, token, timeout_seconds, lease_seconds, operation_id, scheduled_for, runnable_at,
           started_at, note
    FROM s ORDER BY runnable_at, run_id;
END
$$;

-- The queue trigger's fenced start of one run.
CREATE FUNCTION agent.start_run(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_run_id bigint, p_token bigint, p_worker varchar, p_dequeue_count int)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text)
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
                    WHEN (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'running')
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
                  r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note),
    a AS (
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT s.run_id, s.attempt, s.token, CAST(p_worker AS VARCHAR), CAST(p_dequeue_count AS INT),
               CAST(p_now AS timestamp), 'running'
        FROM s WHERE s.decision = 'start')
    SELECT decision, run_id, job_name, kind, command, target_database, attempt, failures, max_attempts, lapses,
           transient_errors, token, timeout_seconds, lease_seconds, operation_id, scheduled_for, runnable_at,
           started_at, note
    FROM s;
END
$$;

-- Queue mode's dispatch: skip what may not run, queue what may (and what is due within the lookahead).
CREATE FUNCTION agent.dispatch_runs(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_lookahead_until timestamp, p_ahead_limit int, p_dispatch_lease_seconds int)
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
           OR (r.kind = 'scheduled' AND r.scheduled_for < CAST(p_late_cutoff AS timestamp) AND (
                EXISTS (SELECT 1 FROM agent.runs n WHERE n.job_name = r.job_name AND n.kind = 'scheduled'
                          AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(p_now AS timestamp)
                          AND n.status NOT IN ('skipped', 'cancelled'))
                OR EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = r.job_name
                             AND (j.misfire = 'skip'
                                  OR r.scheduled_for + j.grace_seconds * INTERVAL '1 second' < CAST(p_now AS timestamp))))))
    RETURNING 'skipped'::text AS decision, r.run_id, r.token, r.job_name, r.kind, r.operation_id, r.scheduled_for,
              r.attempt, r.runnable_at, r.note)
        SELECT decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note FROM changed;
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
                  AND ((c.overlap = 'queue' AND o.status = 'running')
                       OR (o.status IN ('pending', 'queued')
                           AND (c.overlap = 'queue' OR o.runnable_at <= CAST(p_now AS timestamp))
                           AND (o.scheduled_for < c.scheduled_for
                                OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
        ORDER BY c.runnable_at, c.run_id
        LIMIT GREATEST(0, CAST(p_max_concurrency AS INT) - (
            (SELECT COUNT(*) FROM agent.runs f WHERE f.status = 'running')
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

-- The fenced completion, in the job's transaction: the run, then its open attempt.
CREATE FUNCTION agent.finish_run(p_run_id bigint, p_token bigint, p_now timestamp)
RETURNS TABLE (run_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH done AS (
        UPDATE agent.runs SET status = 'succeeded', finished_at = p_now,
            lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
        WHERE run_id = p_run_id AND token = p_token AND status = 'running'
        RETURNING run_id, token),
    closed AS (
        UPDATE agent.attempts AS a SET outcome = 'succeeded', finished_at = p_now
        FROM done WHERE a.run_id = done.run_id AND a.token = done.token AND a.outcome = 'running')
    SELECT done.run_id FROM done;
END
$$;
