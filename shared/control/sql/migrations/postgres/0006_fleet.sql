-- 0006 fleet jobs: one step across many databases (Elastic Jobs' target groups). A run of a
-- fleet step creates one execution per target database: a run of its own (kind 'target',
-- parent_run_id), with its own token, lease, attempts and poison handling. The run waits for
-- them (awaiting_targets = 1: status running, no lease, no worker slot) and follows its flow
-- when the last one ends.

-- An execution: its run and that run's token when it fanned out (a later visit of the same step
-- is a new set), its server (NULL: the agent's own) and its step's retry interval.
ALTER TABLE agent.runs ADD COLUMN parent_run_id BIGINT NULL;
ALTER TABLE agent.runs ADD COLUMN parent_token BIGINT NULL;
ALTER TABLE agent.runs ADD COLUMN target_server VARCHAR(256) NULL;
ALTER TABLE agent.runs ADD COLUMN retry_interval_seconds INT NULL;
-- The run of a fleet step while its executions run: how many at once, where its flow goes when
-- they all succeeded / when any failed (a step number; 0 quits with success, -1 with failure),
-- and the run's target counts (every fleet step of the run, added up).
ALTER TABLE agent.runs ADD COLUMN awaiting_targets SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE agent.runs ADD COLUMN target_parallelism INT NULL;
ALTER TABLE agent.runs ADD COLUMN next_step_on_success INT NULL;
ALTER TABLE agent.runs ADD COLUMN next_step_on_failure INT NULL;
ALTER TABLE agent.runs ADD COLUMN targets_total INT NULL;
ALTER TABLE agent.runs ADD COLUMN targets_failed INT NULL;

-- 'waiting': an execution not yet let in by its run's TARGET_PARALLELISM; 'target': an execution.
ALTER TABLE agent.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE agent.runs ADD CONSTRAINT runs_status_check CHECK (status IN (
    'pending', 'queued', 'running', 'succeeded', 'failed', 'poisoned', 'skipped', 'cancelled', 'waiting'));
ALTER TABLE agent.runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('scheduled', 'manual', 'task', 'target'));

-- A run's executions by state (the window, the end of the step); the runs waiting for theirs.
CREATE INDEX runs_parent ON agent.runs (parent_run_id, parent_token, status) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_awaiting_targets ON agent.runs (run_id) WHERE awaiting_targets = 1;

-- The starters, as in 0002, but: the concurrency cap counts runs executing (a run waiting for
-- its targets holds no worker), and a started run's step and fleet columns come back from the
-- claim itself (a join after it would read the row as it was before the start lock was taken:
-- a run moved on to its next step by its last target execution meanwhile showed its old step).
DROP FUNCTION agent.claim_runs(timestamp, timestamp, int, int, varchar);
CREATE FUNCTION agent.claim_runs(p_now timestamp, p_late_cutoff timestamp, p_batch int, p_max_concurrency int, p_worker varchar)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int)
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
              r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note,
              r.step, r.steps, r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds)
        SELECT decision, run_id, job_name, kind, command, target_database, attempt, failures, max_attempts, lapses, transient_errors, token, timeout_seconds, lease_seconds, operation_id, scheduled_for, runnable_at, started_at, note, step, steps, parent_run_id, parent_token, target_server, retry_interval_seconds FROM changed;
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
              r.step, r.steps, r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds),
    a AS (
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT s.run_id, s.attempt, s.token, CAST(p_worker AS VARCHAR), NULL, CAST(p_now AS timestamp), 'running' FROM s)
    SELECT decision, run_id, job_name, kind, command, target_database, attempt, failures, max_attempts, lapses,
           transient_errors, token, timeout_seconds, lease_seconds, operation_id, scheduled_for, runnable_at,
           started_at, note, step, steps, parent_run_id, parent_token, target_server, retry_interval_seconds
    FROM s ORDER BY runnable_at, run_id;
END
$$;

DROP FUNCTION agent.start_run(timestamp, timestamp, int, bigint, bigint, varchar, int);
CREATE FUNCTION agent.start_run(p_now timestamp, p_late_cutoff timestamp, p_max_concurrency int, p_run_id bigint, p_token bigint, p_worker varchar, p_dequeue_count int)
RETURNS TABLE (decision text, run_id bigint, job_name varchar, kind varchar, command text, target_database varchar, attempt int, failures int, max_attempts int, lapses int, transient_errors int, token bigint, timeout_seconds int, lease_seconds int, operation_id varchar, scheduled_for timestamp, runnable_at timestamp, started_at timestamp, note text, step int, steps text, parent_run_id bigint, parent_token bigint, target_server varchar, retry_interval_seconds int)
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
              r.step, r.steps, r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds),
    a AS (
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT s.run_id, s.attempt, s.token, CAST(p_worker AS VARCHAR), CAST(p_dequeue_count AS INT),
               CAST(p_now AS timestamp), 'running'
        FROM s WHERE s.decision = 'start')
    SELECT decision, run_id, job_name, kind, command, target_database, attempt, failures, max_attempts, lapses,
           transient_errors, token, timeout_seconds, lease_seconds, operation_id, scheduled_for, runnable_at,
           started_at, note, step, steps, parent_run_id, parent_token, target_server, retry_interval_seconds
    FROM s;
END
$$;

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

-- A fleet's progress, after an execution ended (p_parent, p_run_id at p_token) or at every tick
-- (NULL: every run waiting for its targets). An execution that ended lets the next waiting one
-- in, in its place, without locking the run; only when none is waiting (the fleet's tail), and
-- at ticks and cancels: executions of a run no longer waiting for them are cancelled; the
-- waiting ones are let in up to TARGET_PARALLELISM; a run whose executions all ended follows its
-- flow (the next step, runnable now, or its end) and its step's attempt closes with the counts
-- and the failing databases. The runs' rows are locked first there, so that two last executions
-- ending at once are counted one after the other (each later statement sees the other's commit).
-- One-for-one swaps commit atomically, so the count a locked pass reads never overshoots.
CREATE FUNCTION agent.progress_fleets(p_parent bigint, p_run_id bigint, p_token bigint, p_now timestamp)
RETURNS TABLE (run_id bigint, job_name varchar, status varchar, step int, targets_total int, targets_failed int,
               last_error text, operation_id varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_run_id IS NOT NULL THEN
        -- The common case, without the run's lock (its executions end in parallel): the execution
        -- p_run_id ended in this transaction (still at p_token), so the next waiting one takes its
        -- place, one for one, which keeps the window at TARGET_PARALLELISM whatever ends at once.
        UPDATE agent.runs AS w SET status = 'pending', runnable_at = p_now
        WHERE w.run_id = (
            SELECT x.run_id
            FROM agent.runs AS e
            JOIN agent.runs AS p ON p.run_id = e.parent_run_id AND p.token = e.parent_token
                                AND p.awaiting_targets = 1 AND p.status = 'running'
            JOIN agent.runs AS x ON x.parent_run_id = e.parent_run_id AND x.parent_token = e.parent_token
                                AND x.status = 'waiting'
            WHERE e.run_id = p_run_id AND e.token = p_token AND e.status IN ('succeeded', 'failed', 'poisoned')
            ORDER BY x.run_id LIMIT 1
            FOR UPDATE OF x SKIP LOCKED)
          AND w.status = 'waiting';
        IF FOUND THEN
            RETURN;   -- one was still waiting: this was not the last, the run does not move yet
        END IF;
    END IF;
    -- The tail of a fleet (nothing waiting), a tick or a cancel: under the runs' row locks.
    PERFORM 1 FROM agent.runs AS p
    WHERE p.awaiting_targets = 1 AND (p_parent IS NULL OR p.run_id = p_parent)
    ORDER BY p.run_id FOR UPDATE;
    UPDATE agent.runs AS c SET status = 'cancelled', token = c.token + 1, finished_at = p_now,
        lease_expires_at = NULL, note = 'cancelled: its run no longer waits for its targets'
    FROM agent.runs AS p
    WHERE c.parent_run_id = p.run_id AND (p_parent IS NULL OR p.run_id = p_parent)
      AND c.status IN ('waiting', 'pending', 'queued', 'running')
      AND (p.awaiting_targets = 0 OR p.status <> 'running' OR p.token <> c.parent_token);
    -- A run that ended while it waited (cancelled, stopped) waits no more.
    UPDATE agent.runs AS p SET awaiting_targets = 0
    WHERE p.awaiting_targets = 1 AND p.status <> 'running' AND (p_parent IS NULL OR p.run_id = p_parent);
    UPDATE agent.runs AS c SET status = 'pending', runnable_at = p_now
    FROM (SELECT w.run_id
          FROM agent.runs AS p
          CROSS JOIN LATERAL (
              SELECT x.run_id FROM agent.runs AS x
              WHERE x.parent_run_id = p.run_id AND x.parent_token = p.token AND x.status = 'waiting'
              ORDER BY x.run_id
              LIMIT GREATEST(0, p.target_parallelism - (
                  SELECT COUNT(*) FROM agent.runs AS f
                  WHERE f.parent_run_id = p.run_id AND f.parent_token = p.token
                    AND f.status IN ('pending', 'queued', 'running')))) AS w
          WHERE p.awaiting_targets = 1 AND p.status = 'running' AND (p_parent IS NULL OR p.run_id = p_parent)) AS let_in
    -- Checked again on the row itself: one a swap let in (and a worker started) since this
    -- statement's snapshot must not be put back to pending.
    WHERE c.run_id = let_in.run_id AND c.status = 'waiting';
    RETURN QUERY
    WITH ended AS (
        SELECT p.run_id, p.token, p.step AS at_step,
               COUNT(c.run_id) AS total,
               COUNT(c.run_id) FILTER (WHERE c.status <> 'succeeded') AS failed
        FROM agent.runs AS p
        LEFT JOIN agent.runs AS c ON c.parent_run_id = p.run_id AND c.parent_token = p.token
        WHERE p.awaiting_targets = 1 AND p.status = 'running' AND (p_parent IS NULL OR p.run_id = p_parent)
        GROUP BY p.run_id, p.token, p.step
        HAVING COUNT(c.run_id) FILTER (WHERE c.status IN ('waiting', 'pending', 'queued', 'running')) = 0),
    verdict AS (
        SELECT e.*, CASE WHEN e.failed = 0 THEN r.next_step_on_success ELSE r.next_step_on_failure END AS next_step,
               CASE WHEN e.failed = 0 THEN NULL ELSE
                    'step ' || e.at_step || ': ' || e.failed || ' of ' || e.total || ' target(s) failed: '
                    || (SELECT string_agg(n.name, ', ' ORDER BY n.name) FROM (
                            SELECT COALESCE(f.target_server || '/', '') || f.target_database || ' (' || f.status || ')' AS name
                            FROM agent.runs AS f
                            WHERE f.parent_run_id = e.run_id AND f.parent_token = e.token AND f.status <> 'succeeded'
                            ORDER BY f.target_server NULLS FIRST, f.target_database LIMIT 20) AS n)
                    || CASE WHEN e.failed > 20 THEN ', ...' ELSE '' END END AS summary
        FROM ended AS e JOIN agent.runs AS r ON r.run_id = e.run_id),
    moved AS (
        UPDATE agent.runs AS p SET
            awaiting_targets = 0,
            status = CASE WHEN v.next_step > 0 THEN 'pending' WHEN v.next_step = 0 THEN 'succeeded' ELSE 'failed' END,
            step = CASE WHEN v.next_step > 0 THEN v.next_step ELSE p.step END,
            failures = 0,
            runnable_at = p_now,
            lease_expires_at = NULL,
            finished_at = CASE WHEN v.next_step > 0 THEN NULL ELSE p_now END,
            failed_step = CASE WHEN v.failed > 0 THEN v.at_step ELSE p.failed_step END,
            targets_failed = COALESCE(p.targets_failed, 0) + v.failed,
            last_error = v.summary,
            last_error_number = NULL
        FROM verdict AS v
        WHERE p.run_id = v.run_id AND p.token = v.token
        RETURNING p.run_id, p.job_name, p.status, p.step, p.targets_total, p.targets_failed, p.last_error,
                  p.operation_id, p.token, v.total, v.failed),
    closed AS (
        UPDATE agent.attempts AS a SET outcome = CASE WHEN m.failed = 0 THEN 'succeeded' ELSE 'failed' END,
            finished_at = p_now, error_message = m.last_error,
            output = m.total || ' target(s): ' || (m.total - m.failed) || ' succeeded, ' || m.failed || ' failed'
        FROM moved AS m WHERE a.run_id = m.run_id AND a.token = m.token AND a.outcome = 'running')
    SELECT m.run_id, m.job_name, m.status, m.step, m.targets_total, m.targets_failed, m.last_error, m.operation_id
    FROM moved AS m;
END
$$;

-- agent.cancel_run and agent.stop_job (0005) as `cancel` and `stop` do with fleets: a run waiting
-- for its targets ends with its executions in the same transaction (not at the next tick), and
-- an execution not yet let in ('waiting') can be cancelled on its own (it counts as a failed
-- target). CREATE OR REPLACE keeps the owner and the grants of 0005.

-- The executions of runs an operator just cancelled (the runs' rows are already locked by that
-- UPDATE, so this takes them in the same order as progress_fleets: run, then executions).
CREATE FUNCTION agent.cancel_fleet_executions(p_runs bigint[], p_now timestamp)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE agent.runs AS c SET status = 'cancelled', token = c.token + 1, finished_at = p_now,
        lease_expires_at = NULL, note = 'cancelled: its run no longer waits for its targets'
    WHERE c.parent_run_id = ANY (p_runs) AND c.status IN ('waiting', 'pending', 'queued', 'running');
    UPDATE agent.runs AS p SET awaiting_targets = 0 WHERE p.run_id = ANY (p_runs) AND p.awaiting_targets = 1;
$$;
REVOKE ALL ON FUNCTION agent.cancel_fleet_executions(bigint[], timestamp) FROM PUBLIC;

CREATE OR REPLACE FUNCTION agent.stop_job(job_name varchar)
RETURNS TABLE (cancelled_run_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_done bigint[];
    p text := 'agent.stop_job: ';
BEGIN
    IF stop_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = stop_job.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(stop_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job';
    END IF;
    WITH stopped AS (
        UPDATE agent.runs AS r SET status = 'cancelled', token = r.token + 1, finished_at = v_now,
            lease_expires_at = NULL, note = 'cancelled by operator'
        WHERE r.job_name = stop_job.job_name
          AND (r.status = 'running' OR (r.status IN ('pending', 'queued') AND r.runnable_at <= v_now))
        RETURNING r.run_id)
    SELECT COALESCE(array_agg(s.run_id), '{}') INTO v_done FROM stopped AS s;
    PERFORM agent.cancel_fleet_executions(v_done, v_now);
    RETURN QUERY SELECT unnest(v_done);
END
$$;

CREATE OR REPLACE FUNCTION agent.cancel_run(run_id bigint)
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
    WHERE r.run_id = cancel_run.run_id AND r.status IN ('pending', 'queued', 'running', 'waiting')
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
    PERFORM agent.cancel_fleet_executions(ARRAY[v_done], v_now);
    RETURN QUERY SELECT v_done;
END
$$;

-- Fleet jobs from T-SQL: agent.add_scheduled_job (0005) takes @targets and @target_parallelism,
-- as JOB__<name>__TARGETS and __TARGET_PARALLELISM. The procedure keeps what it was given; the
-- engine checks the members when it plans the job (a procedure cannot parse them) and writes the
-- job's one fleet step into steps, as the settings sync does for a settings job.
ALTER TABLE agent.jobs ADD COLUMN requested_targets VARCHAR(4000) NULL;
ALTER TABLE agent.jobs ADD COLUMN requested_target_parallelism INT NULL;

-- agent.add_scheduled_job: define (or redefine) a job in the database. The engine checks the
-- schedule, time zone and targets and plans its first slot (needs_planning); slots of the
-- previous definition claimed ahead are recorded skipped. Two parameters more than in 0005: the
-- function is dropped and created again, so its grants are given again.
DROP FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int);
CREATE FUNCTION agent.add_scheduled_job(name varchar, sql text, schedule varchar DEFAULT NULL,
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
                                 defined_in_database, needs_planning, steps, requested_targets,
                                 requested_target_parallelism)
    VALUES (add_scheduled_job.name, v_schedule, add_scheduled_job.timezone, add_scheduled_job.sql,
            add_scheduled_job."database", add_scheduled_job.enabled, 1, NULL, add_scheduled_job.max_attempts,
            add_scheduled_job.timeout_seconds, add_scheduled_job.lease_seconds, lower(add_scheduled_job.misfire),
            add_scheduled_job.grace_seconds, lower(add_scheduled_job.overlap), NULL, NULL, 1, v_now, 1, 1, NULL,
            btrim(add_scheduled_job.targets), add_scheduled_job.target_parallelism)
    ON CONFLICT (job_name) DO UPDATE SET
        schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, command = EXCLUDED.command,
        target_database = EXCLUDED.target_database, enabled = EXCLUDED.enabled, valid = 1, config_error = NULL,
        max_attempts = EXCLUDED.max_attempts, timeout_seconds = EXCLUDED.timeout_seconds,
        lease_seconds = EXCLUDED.lease_seconds, misfire = EXCLUDED.misfire, grace_seconds = EXCLUDED.grace_seconds,
        overlap = EXCLUDED.overlap, next_due_at = NULL, advanced_at = NULL, configured = 1,
        updated_at = EXCLUDED.updated_at, defined_in_database = 1, needs_planning = EXCLUDED.needs_planning,
        steps = NULL, requested_targets = EXCLUDED.requested_targets,
        requested_target_parallelism = EXCLUDED.requested_target_parallelism;
    RETURN QUERY SELECT CAST(add_scheduled_job.name AS varchar), v_action;
END
$$;
REVOKE ALL ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.add_scheduled_job(varchar, text, varchar, timestamptz, varchar, int, int, int, varchar, varchar, varchar, int, int, varchar, int) TO agent_operator;
