-- 0023 the T-SQL hot path as stored procedures (issue 35 item 3). The claim, the start and the
-- completion of a run were ad-hoc batches: about 8 round trips and 21 KB sent per task on the
-- local path, 10 and 32 KB on the queue path (the claim alone was 6,800 characters, parsed and
-- looked up in the plan cache on every call). Here they become procedures of the agent schema,
-- planned once, called with parameters (shared/control/sql/mssql.sql: EXEC agent.<name> ?, ...):
-- * claim_runs, start_run and dispatch_runs run in a transaction of their own (the connection is
--   in autocommit mode outside the work transaction: no COMMIT round trip after a claim);
-- * a run's completion is one batch (Store.commit_with): the session settings, then
--   check_work_transaction, lock_starts (queue mode), finish_run, start_follow_up_runs and
--   dispatch_runs (queue mode), then COMMIT; finish_run raises (50003) when fenced, so the
--   COMMIT is never reached and XACT_ABORT rolls the job's work back.
-- The bodies are the named queries of 0022 (claim_runs, start_run and dispatch_runs with 0022's overlap buffer-one and cancel-previous and the catch-up exemption), their :name parameters the procedures' @name (the
-- same statements, the same locks, the same OUTPUT ... INTO discipline). No CREATE OR ALTER, no
-- MERGE (Babelfish). Each procedure returns exactly one result set (its last SELECT), except
-- lock_starts (none): the Store reads a completion's results by that count.
-- Not granted to anyone: the agent's own user runs them (it owns the schema); a job's owner, run
-- through EXECUTE AS USER ... WITH COOKIE, has no EXECUTE on schema agent (docs/tsql.md).
-- claim_runs (the local runner's claim): the named query claim_runs of 0022, its :now the parameter @at
-- (the body declares the claim's @now, read once the start lock is held).
CREATE PROCEDURE agent.claim_runs
    @at DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @batch INT,
    @max_concurrency INT,
    @worker NVARCHAR(200)
AS
BEGIN
    SET NOCOUNT ON;
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
    OUTPUT N'skipped', inserted.run_id, inserted.job_name, inserted.kind, inserted.command, inserted.target_database,
           inserted.attempt, inserted.failures, inserted.max_attempts, inserted.lapses, inserted.transient_errors,
           inserted.token, inserted.timeout_seconds, inserted.lease_seconds, inserted.operation_id,
           inserted.scheduled_for, inserted.runnable_at, inserted.started_at, inserted.note, inserted.step,
           inserted.steps INTO @claimed
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
    -- Overlap cancel-previous: the runs of its job in flight before a due run are stopped, as `stop` stops them.
    UPDATE o SET status = N'cancelled', token = o.token + 1, finished_at = @now, lease_expires_at = NULL, awaiting_targets = 0,
        note = CASE WHEN o.job_name IS NULL THEN N'cancelled: its run was stopped for a newer run of its job (overlap cancel-previous)'
                    ELSE N'stopped: a newer run of this job is due; policy cancel-previous' END
    OUTPUT N'cancelled', inserted.run_id, inserted.job_name, inserted.kind, inserted.command, inserted.target_database,
           inserted.attempt, inserted.failures, inserted.max_attempts, inserted.lapses, inserted.transient_errors,
           inserted.token, inserted.timeout_seconds, inserted.lease_seconds, inserted.operation_id,
           inserted.scheduled_for, inserted.runnable_at, inserted.started_at, inserted.note, inserted.step,
           inserted.steps INTO @claimed
    FROM agent.runs AS o
    WHERE o.status IN (N'waiting', N'pending', N'queued', N'running') AND EXISTS (
        SELECT 1 FROM agent.runs AS p, agent.runs AS c WHERE p.run_id IN (o.run_id, o.parent_run_id) AND p.job_name IS NOT NULL
          AND p.kind <> N'backfill' AND p.status IN (N'pending', N'queued', N'running')
          AND (p.status = N'running' OR p.runnable_at <= @now OR p.attempt > 0)
          AND c.job_name = p.job_name AND c.run_id <> p.run_id AND c.overlap = N'cancel-previous' AND c.status = N'pending' AND c.runnable_at <= @now
          AND (p.scheduled_for < c.scheduled_for OR (p.scheduled_for = c.scheduled_for AND p.run_id < c.run_id)));
    -- Picked with TOP and ORDER BY in a subselect, the UPDATE keyed on it, as in dispatch_runs (the
    -- same locks, the same reference; Babelfish refuses an UPDATE through a CTE).
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
    OUTPUT N'start', inserted.run_id, inserted.job_name, inserted.kind, inserted.command, inserted.target_database,
           inserted.attempt, inserted.failures, inserted.max_attempts, inserted.lapses, inserted.transient_errors,
           inserted.token, inserted.timeout_seconds, inserted.lease_seconds, inserted.operation_id,
           inserted.scheduled_for, inserted.runnable_at, inserted.started_at, inserted.note, inserted.step,
           inserted.steps INTO @claimed
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
-- start_run (the queue trigger's fenced start of the run a message names): the named query of 0022.
CREATE PROCEDURE agent.start_run
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
    UPDATE o SET status = N'cancelled', token = o.token + 1, finished_at = CAST(@now AS DATETIME2(6)), lease_expires_at = NULL, awaiting_targets = 0,
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
    OUTPUT @decision, inserted.run_id, inserted.job_name, inserted.kind, inserted.command, inserted.target_database,
           inserted.attempt, inserted.failures, inserted.max_attempts, inserted.lapses, inserted.transient_errors,
           inserted.token, inserted.timeout_seconds, inserted.lease_seconds, inserted.operation_id,
           inserted.scheduled_for, inserted.runnable_at, inserted.started_at, inserted.note, inserted.step,
           inserted.steps INTO @started
    WHERE run_id = @run_id AND token = @token AND status = N'queued' AND @decision IS NOT NULL;
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
-- dispatch_runs (queue mode: the tick's dispatch, and the hand-on dispatch in a run's completion): the
-- named query of 0022.
CREATE PROCEDURE agent.dispatch_runs
    @now DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @max_concurrency INT,
    @lookahead_until DATETIME2(6),
    @ahead_limit INT,
    @dispatch_lease_seconds INT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    DECLARE @out TABLE (decision NVARCHAR(20), run_id BIGINT, token BIGINT, job_name NVARCHAR(64), kind NVARCHAR(16),
                        operation_id NVARCHAR(32), scheduled_for DATETIME2(6), attempt INT, runnable_at DATETIME2(6),
                        note NVARCHAR(MAX));
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
    OUTPUT N'skipped', inserted.run_id, inserted.token, inserted.job_name, inserted.kind, inserted.operation_id,
           inserted.scheduled_for, inserted.attempt, inserted.runnable_at, inserted.note INTO @out
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
    -- Picked with TOP and ORDER BY in a subselect, the UPDATE keyed on it ("TOP (Transact-SQL)",
    -- https://learn.microsoft.com/sql/t-sql/queries/top-transact-sql; Babelfish refuses an UPDATE through a CTE).
    -- The (UPDLOCK, READPAST, ROWLOCK) of the subselect keeps update locks on the picked rows to the end
    -- of the transaction and skips rows another worker holds; the outer WHERE repeats the pending
    -- condition, which PostgreSQL re-checks on a row another starter committed meanwhile.
    UPDATE agent.runs SET
        status = N'queued',
        token = token + 1,
        lease_expires_at = DATEADD(second, CAST(@dispatch_lease_seconds AS INT), CAST(@now AS DATETIME2(6))),
        dispatched_at = CAST(@now AS DATETIME2(6))
    OUTPUT N'queued', inserted.run_id, inserted.token, inserted.job_name, inserted.kind, inserted.operation_id,
           inserted.scheduled_for, inserted.attempt, inserted.runnable_at, inserted.note INTO @out
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
        lease_expires_at = DATEADD(second, CAST(@dispatch_lease_seconds AS INT), runnable_at),
        dispatched_at = CAST(@now AS DATETIME2(6))
    OUTPUT N'queued', inserted.run_id, inserted.token, inserted.job_name, inserted.kind, inserted.operation_id,
           inserted.scheduled_for, inserted.attempt, inserted.runnable_at, inserted.note INTO @out
    WHERE status = N'pending' AND runnable_at > CAST(@now AS DATETIME2(6))
      AND runnable_at <= CAST(@lookahead_until AS DATETIME2(6)) AND run_id IN (
        SELECT TOP (CAST(@ahead_limit AS INT)) c.run_id
        FROM agent.runs AS c WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE c.status = N'pending' AND c.runnable_at > CAST(@now AS DATETIME2(6))
          AND c.runnable_at <= CAST(@lookahead_until AS DATETIME2(6))
        ORDER BY c.runnable_at, c.run_id);
    SELECT decision, run_id, token, job_name, kind, operation_id, scheduled_for, attempt, runnable_at, note FROM @out;
    COMMIT TRANSACTION;
END
GO
-- start_follow_up_runs (in every transaction that ends runs): the named query of 0022, its :max_chain_jobs
-- the parameter @chain_limit (the body declares @max_chain_jobs).
CREATE PROCEDURE agent.start_follow_up_runs
    @now DATETIME2(6),
    @chain_limit INT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    DECLARE @followers TABLE (run_id BIGINT, job_name NVARCHAR(64), followed_run_id BIGINT, operation_id NVARCHAR(32),
                              status NVARCHAR(16), note NVARCHAR(MAX));
    DECLARE @max_chain_jobs INT = @chain_limit;
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                            max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                            finished_at, operation_id, note, steps, followed_run_id, chain)
    OUTPUT inserted.run_id, inserted.job_name, inserted.followed_run_id, inserted.operation_id, inserted.status,
           inserted.note INTO @followers
    SELECT d.job_name, N'manual', d.scheduled_for, CASE WHEN d.refusal IS NULL THEN N'pending' ELSE N'skipped' END,
           d.command, d.target_database, d.overlap, d.max_attempts,
           d.timeout_seconds, d.lease_seconds, CAST(@now AS DATETIME2(6)), CAST(@now AS DATETIME2(6)),
           CASE WHEN d.refusal IS NOT NULL THEN CAST(@now AS DATETIME2(6)) END, d.operation_id,
           CASE WHEN d.refusal IS NULL
                THEN N'after run ' + CAST(d.followed_run_id AS NVARCHAR(20)) + N' of ' + d.followed_job + N' (' + d.followed_status + N')'
                ELSE N'chain: not started after run ' + CAST(d.followed_run_id AS NVARCHAR(20)) + N' of ' + d.followed_job
                     + N': ' + d.refusal END,
           d.steps, d.followed_run_id, d.chain
    FROM (SELECT w.*,
                 CASE WHEN CHARINDEX(N'/' + w.job_name + N'/', w.chain) > 0
                      THEN N'job ' + w.job_name + N' is already in this chain of runs ('
                           + REPLACE(SUBSTRING(w.chain, CHARINDEX(N'/' + w.job_name + N'/', w.chain) + 1, LEN(w.chain)), N'/', N' -> ')
                           + w.job_name + N'); a chain of jobs that follow each other must end: check their AFTER'
                      WHEN LEN(w.chain) - LEN(REPLACE(w.chain, N'/', N'')) - 1 >= @max_chain_jobs
                      THEN N'the chain of runs already holds ' + CAST(@max_chain_jobs AS NVARCHAR(20))
                           + N' jobs, the most one chain may hold' END AS refusal
          FROM (SELECT f.job_name, f.command, f.target_database, f.overlap, f.max_attempts, f.timeout_seconds,
                       f.lease_seconds, f.steps, r.run_id AS followed_run_id, r.job_name AS followed_job,
                       r.status AS followed_status, r.operation_id,
                       CAST(COALESCE(r.chain, N'/') + r.job_name + N'/' AS NVARCHAR(MAX)) AS chain,
                       DATEADD(MILLISECOND, CAST(ROW_NUMBER() OVER (PARTITION BY f.job_name ORDER BY r.run_id) - 1 AS INT),
                               CAST(@now AS DATETIME2(6))) AS scheduled_for
                FROM agent.runs AS r
                JOIN agent.jobs AS f ON f.after_job = r.job_name AND f.enabled = 1 AND f.valid = 1 AND f.configured = 1
                WHERE r.finished_at = CAST(@now AS DATETIME2(6)) AND r.kind <> N'target'
                  AND NOT EXISTS (SELECT 1 FROM agent.job_pauses AS p
                                  WHERE p.job_name = f.job_name
                                    AND (p.paused_until IS NULL OR p.paused_until > CAST(@now AS DATETIME2(6))))
                  AND ((f.after_outcome = N'succeeded' AND r.status = N'succeeded')
                       OR (f.after_outcome = N'failed' AND r.status IN (N'failed', N'poisoned'))
                       OR (f.after_outcome = N'completed' AND r.status IN (N'succeeded', N'failed', N'poisoned')))) AS w) AS d
    WHERE NOT EXISTS (SELECT 1 FROM agent.runs AS x WITH (UPDLOCK, HOLDLOCK)
                      WHERE x.followed_run_id = d.followed_run_id AND x.job_name = d.job_name)
      AND NOT EXISTS (SELECT 1 FROM agent.runs AS x WITH (UPDLOCK, HOLDLOCK)
                      WHERE x.job_name = d.job_name AND x.scheduled_for = d.scheduled_for);
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    SELECT DISTINCT t.job_name, CAST(@now AS DATETIME2(6)), N'follow_up_refused', t.detail
    FROM (SELECT k.job_name, N'not started after job ' + r.job_name + N': '
                     + SUBSTRING(k.note, LEN(N'chain: not started after run ' + CAST(r.run_id AS NVARCHAR(20)) + N' of ' + r.job_name + N': ') + 1, LEN(k.note)) AS detail
          FROM @followers AS k JOIN agent.runs AS r ON r.run_id = k.followed_run_id
          WHERE k.status = N'skipped') AS t
    JOIN agent.jobs AS j ON j.job_name = t.job_name
    WHERE NOT EXISTS (SELECT 1 FROM agent.job_events AS e
                      WHERE e.job_name = t.job_name AND e.kind = N'follow_up_refused' AND e.event_at >= j.updated_at
                        AND e.detail = t.detail);
    SELECT run_id, job_name, followed_run_id, operation_id, status, note FROM @followers;
    COMMIT TRANSACTION;
END
GO
-- finish_run (the fenced completion, in the job's transaction): the named query of 0022, raising (50003)
-- when the token moved on, as PostgreSQL's agent.finish_run raises AG001: the completion's batch ends
-- with its COMMIT, which a raise stops (XACT_ABORT ON rolls the job's work back).
CREATE PROCEDURE agent.finish_run
    @run_id BIGINT,
    @token BIGINT,
    @now DATETIME2(6)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @done TABLE (run_id BIGINT, token BIGINT);
    UPDATE agent.runs SET status = N'succeeded', finished_at = CAST(@now AS DATETIME2(6)),
        lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
    OUTPUT inserted.run_id, inserted.token INTO @done
    WHERE run_id = @run_id AND token = @token AND status = N'running';
    UPDATE a SET outcome = N'succeeded', finished_at = CAST(@now AS DATETIME2(6))
    FROM agent.attempts AS a
    JOIN @done AS d ON a.run_id = d.run_id AND a.token = d.token
    WHERE a.outcome = N'running';
    IF NOT EXISTS (SELECT 1 FROM @done) THROW 50003, N'fenced: the run is no longer running with this token (its lease was taken over, or it was cancelled)', 1;
    SELECT run_id FROM @done;
END
GO
-- check_work_transaction (first in a completion after a job ran in the agent's transaction): the named
-- query of 0022 (XACT_STATE decides; @work_transaction is PostgreSQL's).
CREATE PROCEDURE agent.check_work_transaction
    @work_transaction BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    IF XACT_STATE() <> 1 THROW 50001, N'the job''s transaction is no longer active (its SQL committed, rolled back or doomed it): it is not recorded as succeeded', 1;
    SELECT 1 AS active WHERE 1 = 0 AND CAST(@work_transaction AS BIGINT) IS NULL;
END
GO
-- lock_starts (queue mode, first in a completion that ends with the hand-on dispatch): the start lock,
-- held to the end of the caller's transaction.
CREATE PROCEDURE agent.lock_starts

AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
END
GO
-- run_job (a job's SQL in the agent's transaction, for a job that runs as the agent's own user and
-- without parameters: the path of most runs): the batch of shared/control/store.py's
-- mssql_job_batch(None), as a procedure, so that 0.7 KB of nesting does not travel with every run.
-- One more nested transaction around the job's SQL, so that a COMMIT in it only decrements
-- @@TRANCOUNT and commits nothing (SQL Server commits only the outermost), and a changed count
-- afterwards (its COMMIT or ROLLBACK) fails the attempt (50002; the engine says why in words, and
-- rolls back); the job's own lock timeout (none) for the procedure's scope (the completion's
-- reset_session sets the agent's again); the job's SQL with NOCOUNT OFF, in a scope of its own.
-- A job with an owner or AGENT_JOB_PRINCIPAL never comes here: its EXECUTE AS USER ... WITH COOKIE
-- must be in the batch that reverts it (docs/tsql.md, the owner boundary).
CREATE PROCEDURE agent.run_job
    @agent_job NVARCHAR(MAX)
AS
BEGIN
    SET LOCK_TIMEOUT -1;
    DECLARE @agent_trancount INT;
    BEGIN TRANSACTION;
    SET @agent_trancount = @@TRANCOUNT;
    EXEC sp_executesql N'SET NOCOUNT OFF; EXEC sp_executesql @agent_job;', N'@agent_job NVARCHAR(MAX)', @agent_job = @agent_job;
    IF @@TRANCOUNT <> @agent_trancount THROW 50002, N'agent: transaction control', 1;
    COMMIT TRANSACTION;
END
GO
