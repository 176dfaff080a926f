-- 0016 fleet stagger (issue 33 item 3): TARGET_STAGGER_SECONDS spreads the starts of one fleet
-- step's target executions, execution n runnable from the fan-out + (n - 1) * the stagger
-- (fan_out_targets). agent.progress_fleets (0006) let a waiting execution in "runnable now",
-- which would start it before its staggered time; replaced here so that it keeps the later of
-- the two. The function is 0006's otherwise, statement for statement.
CREATE OR REPLACE FUNCTION agent.progress_fleets(p_parent bigint, p_run_id bigint, p_token bigint, p_now timestamp)
RETURNS TABLE (run_id bigint, job_name varchar, status varchar, step int, targets_total int, targets_failed int,
               last_error text, operation_id varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_run_id IS NOT NULL THEN
        -- The common case, without the run's lock (its executions end in parallel): the execution
        -- p_run_id ended in this transaction (still at p_token), so the next waiting one takes its
        -- place, one for one, which keeps the window at TARGET_PARALLELISM whatever ends at once.
        UPDATE agent.runs AS w SET status = 'pending', runnable_at = GREATEST(w.runnable_at, p_now)
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
    UPDATE agent.runs AS c SET status = 'pending', runnable_at = GREATEST(c.runnable_at, p_now)
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
