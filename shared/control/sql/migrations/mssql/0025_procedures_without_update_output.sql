-- 0025 the hot-path procedures without UPDATE ... OUTPUT (issue 35, found on Babelfish 4.2).
-- Babelfish re-analyses a procedure's cached statement when its plan is invalidated (an ANALYZE
-- of agent.runs, autovacuum's included, any DDL on a table it reads), and for an UPDATE ... OUTPUT
-- inserted.* it then resolves `inserted` through the alias of the statement the session parsed
-- LAST (a global of its T-SQL parser): the claim, the start, the dispatch and the completion
-- failed with "missing FROM-clause entry for table ..." (a name from another batch, or garbage)
-- from the first invalidation on, until the session ended. Reproduced: call agent.dispatch_runs,
-- ANALYZE agent.runs, run any batch with an UPDATE ... OUTPUT, call it again. INSERT ... OUTPUT
-- is not affected, nor an UPDATE without OUTPUT.
-- Each UPDATE ... OUTPUT ... INTO @t of claim_runs, start_run, dispatch_runs and finish_run (and
-- of the operators' stop_job, cancel_run and requeue_poison, whose bodies are the *_unaudited
-- procedures since 0017)
-- becomes: the rows it would change picked into @pick (with the same WHERE, the same lock hints:
-- update locks held to the end of the transaction on SQL Server), the UPDATE of exactly those
-- rows (the same SET), then @t filled from the updated rows. The same statements run under the
-- same start lock and in the same transaction, so what they decide is unchanged; the procedures'
-- signatures and result sets are unchanged (ALTER PROCEDURE keeps their permissions).

ALTER PROCEDURE agent.claim_runs
    @at DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @batch INT,
    @max_concurrency INT,
    @worker NVARCHAR(200)
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    -- The claim's one time, read once the lock is held: what was committed before it is runnable by it.
    DECLARE @now DATETIME2(6) = COALESCE(@at, SYSUTCDATETIME());
    DECLARE @claimed TABLE (decision NVARCHAR(20), run_id BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16),
                            command NVARCHAR(MAX), target_database NVARCHAR(128), attempt INT, failures INT,
                            max_attempts INT, lapses INT, transient_errors INT, token BIGINT, timeout_seconds INT,
                            lease_seconds INT, operation_id NVARCHAR(32), scheduled_for DATETIME2(6),
                            runnable_at DATETIME2(6), started_at DATETIME2(6), note NVARCHAR(MAX), step INT,
                            steps NVARCHAR(MAX));
    INSERT INTO @pick (run_id) SELECT r.run_id
    FROM agent.runs AS r WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE r.status = N'pending' AND r.runnable_at <= @now AND r.job_name IS NOT NULL
      AND ((r.overlap = N'buffer-one' AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name
                    AND o.run_id <> r.run_id AND o.status = N'running')
                 AND EXISTS (SELECT 1 FROM agent.runs AS w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                    AND w.status IN (N'pending', N'queued') AND w.runnable_at <= @now
                    AND NOT (w.kind = N'scheduled' AND w.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(w.note, N'') NOT LIKE N'catch-up:%')
                    AND (w.scheduled_for < r.scheduled_for OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id))))
           OR (r.job_name IS NOT NULL AND r.overlap = N'skip' AND EXISTS (
                SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id AND o.status = N'running'))
           OR (r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%' AND (
                EXISTS (SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.kind = N'scheduled'
                          AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= @now
                          AND n.status NOT IN (N'skipped', N'cancelled'))
                OR EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = r.job_name
                             AND (j.misfire = N'skip'
                                  OR DATEADD(second, j.grace_seconds, r.scheduled_for) < @now)))));
    UPDATE r SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = CASE
            WHEN r.job_name IS NOT NULL AND r.overlap = N'skip' AND EXISTS (
                 SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id AND o.status = N'running')
            THEN N'overlap: the previous run of this job was still running; policy skip'
            WHEN r.overlap = N'buffer-one' AND NOT (r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6))
                                                    AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%')
            THEN N'overlap: a run of this job was running and another was already waiting; policy buffer-one'
            WHEN EXISTS (
                 SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.kind = N'scheduled'
                   AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= @now
                   AND n.status NOT IN (N'skipped', N'cancelled'))
            THEN N'misfire: a later slot of this job is due too; caught up once, with the latest'
            WHEN EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = r.job_name AND j.misfire = N'skip')
            THEN N'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
            ELSE N'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped' END
    FROM agent.runs AS r, @pick AS k WHERE r.run_id = k.run_id;
    INSERT INTO @claimed
    SELECT N'skipped', u.run_id, u.job_name, u.kind, u.command, u.target_database,
           u.attempt, u.failures, u.max_attempts, u.lapses, u.transient_errors,
           u.token, u.timeout_seconds, u.lease_seconds, u.operation_id,
           u.scheduled_for, u.runnable_at, u.started_at, u.note, u.step,
           u.steps
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    -- Overlap cancel-previous: the runs of its job in flight before a due run are stopped, as `stop` stops them.
    INSERT INTO @pick (run_id) SELECT o.run_id
    FROM agent.runs AS o
    WHERE o.status IN (N'waiting', N'pending', N'queued', N'running') AND EXISTS (
        SELECT 1 FROM agent.runs AS p, agent.runs AS c WHERE p.run_id IN (o.run_id, o.parent_run_id) AND p.job_name IS NOT NULL
          AND p.kind <> N'backfill' AND p.status IN (N'pending', N'queued', N'running')
          AND (p.status = N'running' OR p.runnable_at <= @now OR p.attempt > 0)
          AND c.job_name = p.job_name AND c.run_id <> p.run_id AND c.overlap = N'cancel-previous' AND c.status = N'pending' AND c.runnable_at <= @now
          AND (p.scheduled_for < c.scheduled_for OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id)));
    UPDATE o SET status = N'cancelled', token = o.token + 1, finished_at = @now, lease_expires_at = NULL, awaiting_targets = 0,
        note = CASE WHEN o.job_name IS NULL THEN N'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
                    ELSE N'stopped: a newer run of this job is due; policy cancel-previous' END
    FROM agent.runs AS o, @pick AS k WHERE o.run_id = k.run_id;
    INSERT INTO @claimed
    SELECT N'cancelled', u.run_id, u.job_name, u.kind, u.command, u.target_database,
           u.attempt, u.failures, u.max_attempts, u.lapses, u.transient_errors,
           u.token, u.timeout_seconds, u.lease_seconds, u.operation_id,
           u.scheduled_for, u.runnable_at, u.started_at, u.note, u.step,
           u.steps
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    -- Picked with TOP and ORDER BY in a subselect, the UPDATE keyed on it, as in dispatch_runs (the
    -- same locks, the same reference; Babelfish refuses an UPDATE through a CTE).
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE status = N'pending' AND runnable_at <= @now AND run_id IN (
        SELECT TOP ((SELECT CASE WHEN cap.free > CAST(@batch AS INT) THEN CAST(@batch AS INT)
                                 WHEN cap.free > 0 THEN cap.free ELSE 0 END
                     FROM (SELECT CAST(@max_concurrency AS INT)
                                 - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'running' AND f.awaiting_targets = 0)
                                 - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'queued'
                                       AND f.runnable_at <= @now) AS free) AS cap))
               c.run_id
        FROM agent.runs AS c WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE c.status = N'pending' AND c.runnable_at <= @now
          AND NOT (c.task_order IS NOT NULL AND EXISTS (
                SELECT 1 FROM agent.runs AS t
                WHERE t.kind = N'task' AND t.task_order < c.task_order AND t.status IN (N'pending', N'queued', N'running')))
          AND NOT (c.job_name IS NOT NULL AND c.overlap <> N'allow' AND EXISTS (
                SELECT 1 FROM agent.runs AS o
                WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
                  AND ((c.overlap IN (N'queue', N'buffer-one') AND o.status = N'running')
                       OR (o.status IN (N'pending', N'queued')
                           AND (c.overlap IN (N'queue', N'buffer-one') OR o.runnable_at <= @now)
                           AND (o.scheduled_for < c.scheduled_for
                                OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
        ORDER BY c.runnable_at, c.run_id);
    UPDATE agent.runs SET
        status = N'running',
        token = token + 1,
        attempt = attempt + 1,
        dispatched_at = @now,
        started_at = @now,
        heartbeat_at = @now,
        lease_expires_at = DATEADD(second, lease_seconds, @now),
        worker = CAST(@worker AS NVARCHAR(200)),
        dequeue_count = NULL
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @claimed
    SELECT N'start', u.run_id, u.job_name, u.kind, u.command, u.target_database,
           u.attempt, u.failures, u.max_attempts, u.lapses, u.transient_errors,
           u.token, u.timeout_seconds, u.lease_seconds, u.operation_id,
           u.scheduled_for, u.runnable_at, u.started_at, u.note, u.step,
           u.steps
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
    SELECT s.run_id, s.attempt, s.token, CAST(@worker AS NVARCHAR(200)), NULL, @now, N'running'
    FROM @claimed AS s WHERE s.decision = N'start';
    SELECT s.decision, s.run_id, s.job_name, s.kind, s.command, s.target_database, s.attempt, s.failures,
           s.max_attempts, s.lapses, s.transient_errors, s.token, s.timeout_seconds, s.lease_seconds, s.operation_id,
           s.scheduled_for, s.runnable_at, s.started_at, s.note, s.step, s.steps, r.parent_run_id, r.parent_token,
           r.target_server, r.retry_interval_seconds, COALESCE(r.owner, j.owner, N'') AS owner,
           r.params, jd.params AS job_params
    FROM @claimed AS s JOIN agent.runs AS r ON r.run_id = s.run_id
    LEFT JOIN agent.runs AS p ON p.run_id = r.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = r.job_name
    ORDER BY s.runnable_at, s.run_id;
    COMMIT TRANSACTION;
END
GO
ALTER PROCEDURE agent.start_run
    @now DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @max_concurrency INT,
    @run_id BIGINT,
    @token BIGINT,
    @worker NVARCHAR(200),
    @dequeue_count INT
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    DECLARE @decision NVARCHAR(20);
    SELECT @decision = CASE
            WHEN r.runnable_at > CAST(@now AS DATETIME2(6)) THEN N'early'
            WHEN r.job_name IS NOT NULL AND r.overlap = N'skip' AND EXISTS (
                 SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                   AND o.status = N'running') THEN N'skip-overlap'
            WHEN r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%' AND EXISTS (
                 SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.kind = N'scheduled'
                   AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(@now AS DATETIME2(6))
                   AND n.status NOT IN (N'skipped', N'cancelled')) THEN N'skip-superseded'
            WHEN r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%' AND EXISTS (
                 SELECT 1 FROM agent.jobs AS j WHERE j.job_name = r.job_name AND j.misfire = N'skip') THEN N'skip-misfire'
            WHEN r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%' AND EXISTS (
                 SELECT 1 FROM agent.jobs AS j WHERE j.job_name = r.job_name
                   AND DATEADD(second, j.grace_seconds, r.scheduled_for) < CAST(@now AS DATETIME2(6))) THEN N'skip-grace'
            WHEN r.task_order IS NOT NULL AND EXISTS (
                 SELECT 1 FROM agent.runs AS t WHERE t.kind = N'task' AND t.task_order < r.task_order
                   AND t.status IN (N'pending', N'queued', N'running')) THEN N'held-order'
            WHEN r.job_name IS NOT NULL AND r.overlap = N'buffer-one' AND EXISTS (
                 SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                   AND o.status = N'running') AND EXISTS (
                 SELECT 1 FROM agent.runs AS w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                   AND w.status IN (N'pending', N'queued') AND w.runnable_at <= CAST(@now AS DATETIME2(6))
                   AND (w.scheduled_for < r.scheduled_for
                        OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id))) THEN N'skip-buffer'
            WHEN r.job_name IS NOT NULL AND r.overlap IN (N'queue', N'buffer-one') AND EXISTS (
                 SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id
                   AND (o.status = N'running'
                        OR (o.status IN (N'pending', N'queued')
                            AND (o.scheduled_for < r.scheduled_for
                                 OR (o.scheduled_for = r.scheduled_for AND o.run_id < r.run_id))))) THEN N'held-overlap'
            WHEN (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'running' AND f.awaiting_targets = 0)
                 >= CAST(@max_concurrency AS INT) THEN N'held-cap'
            ELSE N'start' END
    FROM agent.runs AS r WITH (UPDLOCK)
    WHERE r.run_id = @run_id AND r.token = @token AND r.status = N'queued';
    -- Overlap cancel-previous: the runs of its job in flight before it are stopped, as `stop` stops them.
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE run_id = @run_id AND token = @token AND status = N'queued' AND @decision IS NOT NULL;
    UPDATE agent.runs SET status = N'cancelled', token = o.token + 1, finished_at = CAST(@now AS DATETIME2(6)), lease_expires_at = NULL, awaiting_targets = 0,
        note = CASE WHEN o.job_name IS NULL THEN N'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
                    ELSE N'stopped: a newer run of this job is due; policy cancel-previous' END
    FROM agent.runs AS o
    WHERE o.status IN (N'waiting', N'pending', N'queued', N'running') AND EXISTS (
        SELECT 1 FROM agent.runs AS p, agent.runs AS c WHERE p.run_id IN (o.run_id, o.parent_run_id) AND p.job_name IS NOT NULL
          AND p.kind <> N'backfill' AND p.status IN (N'pending', N'queued', N'running')
          AND (p.status = N'running' OR p.runnable_at <= CAST(@now AS DATETIME2(6)) OR p.attempt > 0)
          AND c.job_name = p.job_name AND c.run_id <> p.run_id AND c.overlap = N'cancel-previous' AND @decision IN (N'start', N'held-cap') AND c.run_id = @run_id
          AND (p.scheduled_for < c.scheduled_for OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id)));
    DECLARE @started TABLE (decision NVARCHAR(20), run_id BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16),
                            command NVARCHAR(MAX), target_database NVARCHAR(128), attempt INT, failures INT,
                            max_attempts INT, lapses INT, transient_errors INT, token BIGINT, timeout_seconds INT,
                            lease_seconds INT, operation_id NVARCHAR(32), scheduled_for DATETIME2(6),
                            runnable_at DATETIME2(6), started_at DATETIME2(6), note NVARCHAR(MAX), step INT,
                            steps NVARCHAR(MAX));
    UPDATE agent.runs SET
        status = CASE WHEN @decision = N'start' THEN N'running' WHEN @decision LIKE N'skip-%' THEN N'skipped'
                      WHEN @decision LIKE N'held-%' THEN N'pending' ELSE status END,
        attempt = CASE WHEN @decision = N'start' THEN attempt + 1 ELSE attempt END,
        started_at = CASE WHEN @decision = N'start' THEN CAST(@now AS DATETIME2(6)) ELSE started_at END,
        heartbeat_at = CASE WHEN @decision = N'start' THEN CAST(@now AS DATETIME2(6)) ELSE heartbeat_at END,
        lease_expires_at = CASE WHEN @decision = N'start' THEN DATEADD(second, lease_seconds, CAST(@now AS DATETIME2(6)))
                                WHEN @decision = N'early' THEN lease_expires_at END,
        worker = CASE WHEN @decision = N'start' THEN CAST(@worker AS NVARCHAR(200)) ELSE worker END,
        dequeue_count = CASE WHEN @decision = N'start' THEN CAST(@dequeue_count AS INT) ELSE dequeue_count END,
        finished_at = CASE WHEN @decision LIKE N'skip-%' THEN CAST(@now AS DATETIME2(6)) ELSE finished_at END,
        note = CASE @decision
            WHEN N'skip-overlap' THEN N'overlap: the previous run of this job was still running; policy skip'
            WHEN N'skip-buffer' THEN N'overlap: a run of this job was running and another was already waiting; policy buffer-one'
            WHEN N'skip-superseded' THEN N'misfire: a later slot of this job is due too; caught up once, with the latest'
            WHEN N'skip-misfire' THEN N'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
            WHEN N'skip-grace' THEN N'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped'
            WHEN N'held-order' THEN N'held: waits for the tasks of a lower order to finish'
            WHEN N'held-overlap' THEN CASE WHEN overlap = N'buffer-one'
                                           THEN N'held: waits for the previous run of this job (overlap buffer-one)'
                                           ELSE N'held: waits for the previous run of this job (overlap queue)' END
            WHEN N'held-cap' THEN N'held: AGENT_MAX_CONCURRENCY runs are executing'
            ELSE note END
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @started
    SELECT @decision, u.run_id, u.job_name, u.kind, u.command, u.target_database,
           u.attempt, u.failures, u.max_attempts, u.lapses, u.transient_errors,
           u.token, u.timeout_seconds, u.lease_seconds, u.operation_id,
           u.scheduled_for, u.runnable_at, u.started_at, u.note, u.step,
           u.steps
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
    SELECT s.run_id, s.attempt, s.token, CAST(@worker AS NVARCHAR(200)), CAST(@dequeue_count AS INT),
           CAST(@now AS DATETIME2(6)), N'running'
    FROM @started AS s WHERE s.decision = N'start';
    SELECT s.decision, s.run_id, s.job_name, s.kind, s.command, s.target_database, s.attempt, s.failures,
           s.max_attempts, s.lapses, s.transient_errors, s.token, s.timeout_seconds, s.lease_seconds, s.operation_id,
           s.scheduled_for, s.runnable_at, s.started_at, s.note, s.step, s.steps, r.parent_run_id, r.parent_token,
           r.target_server, r.retry_interval_seconds, COALESCE(r.owner, j.owner, N'') AS owner,
           r.params, jd.params AS job_params
    FROM @started AS s JOIN agent.runs AS r ON r.run_id = s.run_id
    LEFT JOIN agent.runs AS p ON p.run_id = r.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = r.job_name;
    COMMIT TRANSACTION;
END
GO
ALTER PROCEDURE agent.dispatch_runs
    @now DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @max_concurrency INT,
    @lookahead_until DATETIME2(6),
    @ahead_limit INT,
    @dispatch_lease_seconds INT
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    DECLARE @out TABLE (decision NVARCHAR(20), run_id BIGINT, token BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16),
                        operation_id NVARCHAR(32), scheduled_for DATETIME2(6), attempt INT, runnable_at DATETIME2(6),
                        note NVARCHAR(MAX));
    INSERT INTO @pick (run_id) SELECT r.run_id
    FROM agent.runs AS r WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE r.status = N'pending' AND r.runnable_at <= CAST(@now AS DATETIME2(6)) AND r.job_name IS NOT NULL
      AND ((r.overlap = N'buffer-one' AND EXISTS (SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name
                    AND o.run_id <> r.run_id AND o.status = N'running')
                 AND EXISTS (SELECT 1 FROM agent.runs AS w WHERE w.job_name = r.job_name AND w.run_id <> r.run_id
                    AND w.status IN (N'pending', N'queued') AND w.runnable_at <= CAST(@now AS DATETIME2(6))
                    AND NOT (w.kind = N'scheduled' AND w.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(w.note, N'') NOT LIKE N'catch-up:%')
                    AND (w.scheduled_for < r.scheduled_for OR (w.scheduled_for = r.scheduled_for AND w.run_id < r.run_id))))
           OR (r.job_name IS NOT NULL AND r.overlap = N'skip' AND EXISTS (
                SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id AND o.status = N'running'))
           OR (r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6)) AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%' AND (
                EXISTS (SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.kind = N'scheduled'
                          AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(@now AS DATETIME2(6))
                          AND n.status NOT IN (N'skipped', N'cancelled'))
                OR EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = r.job_name
                             AND (j.misfire = N'skip'
                                  OR DATEADD(second, j.grace_seconds, r.scheduled_for) < CAST(@now AS DATETIME2(6)))))));
    UPDATE r SET status = N'skipped', finished_at = CAST(@now AS DATETIME2(6)), lease_expires_at = NULL,
        note = CASE
            WHEN r.job_name IS NOT NULL AND r.overlap = N'skip' AND EXISTS (
                 SELECT 1 FROM agent.runs AS o WHERE o.job_name = r.job_name AND o.run_id <> r.run_id AND o.status = N'running')
            THEN N'overlap: the previous run of this job was still running; policy skip'
            WHEN r.overlap = N'buffer-one' AND NOT (r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6))
                                                    AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%')
            THEN N'overlap: a run of this job was running and another was already waiting; policy buffer-one'
            WHEN EXISTS (
                 SELECT 1 FROM agent.runs AS n WHERE n.job_name = r.job_name AND n.kind = N'scheduled'
                   AND n.scheduled_for > r.scheduled_for AND n.scheduled_for <= CAST(@now AS DATETIME2(6))
                   AND n.status NOT IN (N'skipped', N'cancelled'))
            THEN N'misfire: a later slot of this job is due too; caught up once, with the latest'
            WHEN EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = r.job_name AND j.misfire = N'skip')
            THEN N'misfire: not started within AGENT_MISFIRE_THRESHOLD_SECONDS of its slot; policy skip'
            ELSE N'misfire: not started within the job''s GRACE_SECONDS of its slot; skipped' END
    FROM agent.runs AS r, @pick AS k WHERE r.run_id = k.run_id;
    INSERT INTO @out
    SELECT N'skipped', u.run_id, u.token, u.job_name, u.kind, u.operation_id,
           u.scheduled_for, u.attempt, u.runnable_at, u.note
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    -- Picked with TOP and ORDER BY in a subselect, the UPDATE keyed on it ("TOP (Transact-SQL)",
    -- https://learn.microsoft.com/sql/t-sql/queries/top-transact-sql; Babelfish refuses an UPDATE through a CTE).
    -- The (UPDLOCK, READPAST, ROWLOCK) of the subselect keeps update locks on the picked rows to the end
    -- of the transaction and skips rows another worker holds; the outer WHERE repeats the pending
    -- condition, which PostgreSQL re-checks on a row another starter committed meanwhile.
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE status = N'pending' AND runnable_at <= CAST(@now AS DATETIME2(6)) AND run_id IN (
        SELECT TOP ((SELECT CASE WHEN cap.free > 0 THEN cap.free ELSE 0 END
                     FROM (SELECT CAST(@max_concurrency AS INT)
                                 - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'running' AND f.awaiting_targets = 0)
                                 - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'queued'
                                       AND f.runnable_at <= CAST(@now AS DATETIME2(6))) AS free) AS cap))
               c.run_id
        FROM agent.runs AS c WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE c.status = N'pending' AND c.runnable_at <= CAST(@now AS DATETIME2(6))
          AND NOT (c.task_order IS NOT NULL AND EXISTS (
                SELECT 1 FROM agent.runs AS t
                WHERE t.kind = N'task' AND t.task_order < c.task_order AND t.status IN (N'pending', N'queued', N'running')))
          AND NOT (c.job_name IS NOT NULL AND c.overlap <> N'allow' AND EXISTS (
                SELECT 1 FROM agent.runs AS o
                WHERE o.job_name = c.job_name AND o.run_id <> c.run_id
                  AND ((c.overlap IN (N'queue', N'buffer-one') AND o.status = N'running')
                       OR (o.status IN (N'pending', N'queued')
                           AND (c.overlap IN (N'queue', N'buffer-one') OR o.runnable_at <= CAST(@now AS DATETIME2(6)))
                           AND (o.scheduled_for < c.scheduled_for
                                OR (o.scheduled_for = c.scheduled_for AND o.run_id < c.run_id))))))
        ORDER BY c.runnable_at, c.run_id);
    UPDATE agent.runs SET
        status = N'queued',
        token = token + 1,
        lease_expires_at = DATEADD(second, CAST(@dispatch_lease_seconds AS INT), CAST(@now AS DATETIME2(6))),
        dispatched_at = CAST(@now AS DATETIME2(6))
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @out
    SELECT N'queued', u.run_id, u.token, u.job_name, u.kind, u.operation_id,
           u.scheduled_for, u.attempt, u.runnable_at, u.note
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE status = N'pending' AND runnable_at > CAST(@now AS DATETIME2(6))
      AND runnable_at <= CAST(@lookahead_until AS DATETIME2(6)) AND run_id IN (
        SELECT TOP (CAST(@ahead_limit AS INT)) c.run_id
        FROM agent.runs AS c WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE c.status = N'pending' AND c.runnable_at > CAST(@now AS DATETIME2(6))
          AND c.runnable_at <= CAST(@lookahead_until AS DATETIME2(6))
        ORDER BY c.runnable_at, c.run_id);
    UPDATE agent.runs SET
        status = N'queued',
        token = token + 1,
        lease_expires_at = DATEADD(second, CAST(@dispatch_lease_seconds AS INT), runnable_at),
        dispatched_at = CAST(@now AS DATETIME2(6))
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @out
    SELECT N'queued', u.run_id, u.token, u.job_name, u.kind, u.operation_id,
           u.scheduled_for, u.attempt, u.runnable_at, u.note
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    SELECT decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note FROM @out;
    COMMIT TRANSACTION;
END
GO
ALTER PROCEDURE agent.finish_run
    @run_id BIGINT,
    @token BIGINT,
    @now DATETIME2(6)
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    DECLARE @done TABLE (run_id BIGINT, token BIGINT);
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE run_id = @run_id AND token = @token AND status = N'running';
    UPDATE agent.runs SET status = N'succeeded', finished_at = CAST(@now AS DATETIME2(6)),
        lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @done
    SELECT u.run_id, u.token
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    UPDATE a SET outcome = N'succeeded', finished_at = CAST(@now AS DATETIME2(6))
    FROM agent.attempts AS a
    JOIN @done AS d ON a.run_id = d.run_id AND a.token = d.token
    WHERE a.outcome = N'running';
    IF NOT EXISTS (SELECT 1 FROM @done) THROW 50003, N'fenced: the run is no longer running with this token (its lease was taken over, or it was cancelled)', 1;
    SELECT run_id FROM @done;
END
GO
ALTER PROCEDURE agent.stop_job_unaudited
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    IF @job_name IS NULL
        THROW 51401, N'agent.stop_job: @job_name = NULL: expected the name of a job', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name)
    BEGIN
        SET @message = N'agent.stop_job: @job_name = ''' + REPLACE(@job_name, N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job';
        THROW 51404, @message, 1;
    END;
    DECLARE @cancelled TABLE (cancelled_run_id BIGINT);
    BEGIN TRANSACTION;
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE job_name = @job_name
      AND (status = N'running' OR (status IN (N'pending', N'queued') AND runnable_at <= @now));
    UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = @now,
        lease_expires_at = NULL, note = N'cancelled by operator'
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @cancelled
    SELECT u.run_id
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    UPDATE c SET status = N'cancelled', token = c.token + 1, finished_at = @now, lease_expires_at = NULL,
        note = N'cancelled: its run no longer waits for its targets'
    FROM agent.runs AS c JOIN @cancelled AS d ON c.parent_run_id = d.cancelled_run_id
    WHERE c.status IN (N'waiting', N'pending', N'queued', N'running');
    UPDATE p SET awaiting_targets = 0
    FROM agent.runs AS p JOIN @cancelled AS d ON p.run_id = d.cancelled_run_id
    WHERE p.awaiting_targets = 1;
    COMMIT TRANSACTION;
    SELECT c.cancelled_run_id FROM @cancelled AS c;
END
GO
ALTER PROCEDURE agent.cancel_run_unaudited
    @run_id BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    IF @run_id IS NULL
        THROW 51401, N'agent.cancel_run: @run_id = NULL: expected the id of a run', 1;
    DECLARE @cancelled TABLE (cancelled_run_id BIGINT);
    BEGIN TRANSACTION;
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE run_id = @run_id AND status IN (N'pending', N'queued', N'running', N'waiting');
    UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = @now,
        lease_expires_at = NULL, note = N'cancelled by operator'
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @cancelled
    SELECT u.run_id
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    IF NOT EXISTS (SELECT 1 FROM @cancelled)
    BEGIN
        -- THROW under XACT_ABORT rolls the transaction back.
        DECLARE @status NVARCHAR(16);
        SELECT @status = r.status FROM agent.runs AS r WHERE r.run_id = @run_id;
        IF @status IS NULL
        BEGIN
            SET @message = N'agent.cancel_run: @run_id = ' + CONVERT(NVARCHAR(20), @run_id)
                + N': expected the id of a run; there is no such run';
            THROW 51404, @message, 1;
        END;
        SET @message = N'agent.cancel_run: @run_id = ' + CONVERT(NVARCHAR(20), @run_id)
            + N': expected a run not yet finished; it is already ' + @status;
        THROW 51409, @message, 1;
    END;
    UPDATE c SET status = N'cancelled', token = c.token + 1, finished_at = @now, lease_expires_at = NULL,
        note = N'cancelled: its run no longer waits for its targets'
    FROM agent.runs AS c JOIN @cancelled AS d ON c.parent_run_id = d.cancelled_run_id
    WHERE c.status IN (N'waiting', N'pending', N'queued', N'running');
    UPDATE p SET awaiting_targets = 0
    FROM agent.runs AS p JOIN @cancelled AS d ON p.run_id = d.cancelled_run_id
    WHERE p.awaiting_targets = 1;
    COMMIT TRANSACTION;
    SELECT c.cancelled_run_id FROM @cancelled AS c;
END
GO
ALTER PROCEDURE agent.requeue_poison_unaudited
    @poison_id BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY);
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.requeue_poison: ';
    IF @poison_id IS NULL
        THROW 51401, N'agent.requeue_poison: @poison_id = NULL: expected the id of a poison message (agent.poison_list)', 1;
    DECLARE @found INT = 0;
    DECLARE @run BIGINT;
    DECLARE @reason NVARCHAR(MAX);
    SELECT @found = 1, @run = m.run_id, @reason = m.reason FROM agent.poison_messages AS m WHERE m.poison_id = @poison_id;
    IF @found = 0
    BEGIN
        SET @message = @p + N'@poison_id = ' + CONVERT(NVARCHAR(20), @poison_id)
            + N': expected the id of a poison message (agent.poison_list); there is no such message';
        THROW 51404, @message, 1;
    END;
    IF @run IS NULL
    BEGIN
        SET @message = @p + N'@poison_id = ' + CONVERT(NVARCHAR(20), @poison_id)
            + N': expected a message of a run; it belongs to no run (it was malformed: ' + @reason + N'), nothing to requeue';
        THROW 51409, @message, 1;
    END;
    BEGIN TRANSACTION;
    DECLARE @requeued TABLE (requeued_run_id BIGINT);
    INSERT INTO @pick (run_id) SELECT run_id FROM agent.runs
    WHERE run_id = @run AND status IN (N'poisoned', N'failed');
    UPDATE agent.runs SET status = N'pending', runnable_at = @now, finished_at = NULL,
        lease_expires_at = NULL, max_attempts = failures + 1, lapses = 0, transient_errors = 0,
        note = N'requeued by operator'
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k);
    INSERT INTO @requeued
    SELECT u.run_id
    FROM agent.runs AS u, @pick AS k WHERE u.run_id = k.run_id;
    DELETE FROM @pick;
    IF NOT EXISTS (SELECT 1 FROM @requeued)
    BEGIN
        DECLARE @status NVARCHAR(16);
        SELECT @status = r.status FROM agent.runs AS r WHERE r.run_id = @run;
        SET @message = @p + N'@poison_id = ' + CONVERT(NVARCHAR(20), @poison_id)
            + N': expected a poisoned or failed run; run ' + CONVERT(NVARCHAR(20), @run) + N' is ' + COALESCE(@status, N'gone');
        THROW 51409, @message, 1;
    END;
    UPDATE agent.poison_messages SET requeued_at = @now WHERE poison_id = @poison_id;
    COMMIT TRANSACTION;
    SELECT q.requeued_run_id FROM @requeued AS q;
END
GO
