-- 0030 the T-SQL claim of one run, lean (issue 35 item 3). Measured on Babelfish after 0029
-- (docs/performance.md): agent.claim_runs was still 7 to 16 ms a call, held under the start lock,
-- and the first call on each new connection parsed its whole body (1.3 to 2.3 s of CPU on
-- Babelfish, whose ANTLR parse starts cold in every server process). Its table variable @pick is a
-- temporary table there, made and planned again on every call.
-- So agent.claim_runs now decides, under the start lock and at its one @now as before, whether the
-- claim is the common one: one run asked for (@batch = 1, the local runner's claim and the claim
-- that rides on a completion) and no due pending run that a skip rule (overlap skip, buffer-one,
-- misfire) or cancel-previous could act on (the probes 0029 put before those statements, the
-- necessary conditions of their WHERE). Then it picks that run into a variable (the same SELECT as
-- the pick of 0029: the same filters, order, cap and locks, TOP 1), starts it and opens its attempt
-- as before, and returns it with the same columns, and ends. Otherwise it goes on with 0029's body,
-- unchanged from its probes on. Babelfish's name bug ("<db>_<db>_agent.runs": agent.runs resolved
-- in the wrong schema) shaped it: the 0029 path as a procedure of its own called from here met it
-- (test_prompt_dispatch), and so did 0029's table variable declared after the one-run path, once
-- that path had run in the session (an attack's claims of 1 then 3 runs): it is declared first, as
-- in 0029, and made on every call, though the one-run path does not use it.
-- agent.start_run (queue mode) keeps its two table variables: without them (the run in a variable),
-- Babelfish resolved agent.runs in it as "<db>_<db>_agent.runs" once a follow-up's nested EXEC had
-- run in the session (test_after, queue mode, on Babelfish 4.3).
-- No CREATE OR ALTER, no MERGE, no UPDATE ... OUTPUT (0025); ALTER PROCEDURE keeps permissions.

ALTER PROCEDURE agent.claim_runs
    @at DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @batch INT,
    @max_concurrency INT,
    @worker NVARCHAR(200)
AS
BEGIN
    SET NOCOUNT ON;
    -- The runs the 0029 path decides on, each with its decision (a run is decided once: each phase
    -- takes runs in statuses the phases before it left none in), read back from agent.runs at the end.
    -- Declared first, as 0029 did, though the one-run path does not use it: declared after that path,
    -- Babelfish 4.3 resolved agent.runs as "<db>_<db>_agent.runs" in the 0029 path once the one-run
    -- path had run in the session (an attack's sequence of claims of 1 and 3 runs).
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY, decision NVARCHAR(20));
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    -- The claim's one time, read once the lock is held: what was committed before it is runnable by it.
    DECLARE @now DATETIME2(6) = COALESCE(@at, SYSUTCDATETIME());
    -- One run asked for, and no due pending run that a skip rule or cancel-previous could act on (the
    -- probes below, 0029's, unchanged): the one run, without a table variable.
    IF CAST(@batch AS INT) = 1
       AND NOT EXISTS (SELECT 1 FROM agent.runs AS r
                  WHERE r.status = N'pending' AND r.runnable_at <= @now AND r.job_name IS NOT NULL
                    AND (r.overlap IN (N'skip', N'buffer-one')
                         OR (r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6))
                             AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%')))
       AND NOT EXISTS (SELECT 1 FROM agent.runs AS c
                  WHERE c.status = N'pending' AND c.runnable_at <= @now AND c.overlap = N'cancel-previous'
                    AND c.job_name IS NOT NULL)
    BEGIN
        -- One run: 0029's pick with TOP 1 into a variable (the same filters, order, cap and locks).
        DECLARE @run BIGINT;
        DECLARE @free INT = CAST(@max_concurrency AS INT)
            - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'running' AND f.awaiting_targets = 0)
            - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'queued' AND f.runnable_at <= @now);
        SELECT TOP (CASE WHEN @free > 0 THEN 1 ELSE 0 END) @run = c.run_id
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
        ORDER BY c.runnable_at, c.run_id;
        -- No run picked (@run NULL): both find no row.
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
        WHERE run_id = @run;
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
        SELECT r.run_id, r.attempt, r.token, CAST(@worker AS NVARCHAR(200)), NULL, @now, N'running'
        FROM agent.runs AS r WHERE r.run_id = @run;
        -- The run started (none: no row), with the columns of the result set below.
        SELECT CAST(N'start' AS NVARCHAR(20)) AS decision, r.run_id, r.job_name, r.kind, r.command, r.target_database,
               r.attempt, r.failures, r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds,
               r.lease_seconds, r.operation_id, r.scheduled_for, r.runnable_at, r.started_at, r.note, r.step, r.steps,
               r.parent_run_id, r.parent_token, r.target_server, r.retry_interval_seconds,
               COALESCE(r.owner, j.owner, N'') AS owner, r.params, jd.params AS job_params
        FROM agent.runs AS r
        LEFT JOIN agent.runs AS p ON p.run_id = r.parent_run_id
        LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
        LEFT JOIN agent.jobs AS jd ON jd.job_name = r.job_name
        WHERE r.run_id = @run;
        COMMIT TRANSACTION;
        RETURN;
    END;
    -- Otherwise the claim as 0029 made it, unchanged.
    -- Only when a pending run one of the skip rules below could skip exists (a necessary condition of
    -- their WHERE: overlap skip or buffer-one, or a late scheduled slot not caught up): a claim of
    -- tasks and of runs in time runs none of them (0029).
    IF EXISTS (SELECT 1 FROM agent.runs AS r
               WHERE r.status = N'pending' AND r.runnable_at <= @now AND r.job_name IS NOT NULL
                 AND (r.overlap IN (N'skip', N'buffer-one')
                      OR (r.kind = N'scheduled' AND r.scheduled_for < CAST(@late_cutoff AS DATETIME2(6))
                          AND COALESCE(r.note, N'') NOT LIKE N'catch-up:%')))
    BEGIN
        INSERT INTO @pick (run_id, decision) SELECT r.run_id, N'skipped'
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
        FROM agent.runs AS r, @pick AS k WHERE r.run_id = k.run_id AND k.decision = N'skipped';
    END;
    -- Overlap cancel-previous: the runs of its job in flight before a due run are stopped, as `stop` stops them.
    -- Only when a pending run of overlap cancel-previous is due (each run it stops is stopped for one,
    -- c below): otherwise the statements find nothing (0029).
    IF EXISTS (SELECT 1 FROM agent.runs AS c
               WHERE c.status = N'pending' AND c.runnable_at <= @now AND c.overlap = N'cancel-previous'
                 AND c.job_name IS NOT NULL)
    BEGIN
        INSERT INTO @pick (run_id, decision) SELECT o.run_id, N'cancelled'
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
        FROM agent.runs AS o, @pick AS k WHERE o.run_id = k.run_id AND k.decision = N'cancelled';
    END;
    -- The runs to start: TOP and ORDER BY in the INSERT's SELECT itself (0029; before, a subselect
    -- that an outer SELECT of agent.runs filtered by IN, which PostgreSQL, under Babelfish, ran once
    -- per pending run: a claim cost in proportion to the backlog). The same rows, the same locks.
    INSERT INTO @pick (run_id, decision)
    SELECT TOP ((SELECT CASE WHEN cap.free > CAST(@batch AS INT) THEN CAST(@batch AS INT)
                             WHEN cap.free > 0 THEN cap.free ELSE 0 END
                 FROM (SELECT CAST(@max_concurrency AS INT)
                             - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'running' AND f.awaiting_targets = 0)
                             - (SELECT COUNT(*) FROM agent.runs AS f WHERE f.status = N'queued'
                                   AND f.runnable_at <= @now) AS free) AS cap))
           c.run_id, N'start'
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
    ORDER BY c.runnable_at, c.run_id;
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
    WHERE run_id IN (SELECT k.run_id FROM @pick AS k WHERE k.decision = N'start');
    INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, outcome)
    SELECT r.run_id, r.attempt, r.token, CAST(@worker AS NVARCHAR(200)), NULL, @now, N'running'
    FROM @pick AS k JOIN agent.runs AS r ON r.run_id = k.run_id WHERE k.decision = N'start';
    -- The runs as the claim left them (no statement after its phase changed a decided run).
    SELECT k.decision, r.run_id, r.job_name, r.kind, r.command, r.target_database, r.attempt, r.failures,
           r.max_attempts, r.lapses, r.transient_errors, r.token, r.timeout_seconds, r.lease_seconds, r.operation_id,
           r.scheduled_for, r.runnable_at, r.started_at, r.note, r.step, r.steps, r.parent_run_id, r.parent_token,
           r.target_server, r.retry_interval_seconds, COALESCE(r.owner, j.owner, N'') AS owner,
           r.params, jd.params AS job_params
    FROM @pick AS k JOIN agent.runs AS r ON r.run_id = k.run_id
    LEFT JOIN agent.runs AS p ON p.run_id = r.parent_run_id
    LEFT JOIN agent.jobs AS j ON j.job_name = COALESCE(r.job_name, p.job_name) AND j.defined_in_database = 1
    LEFT JOIN agent.jobs AS jd ON jd.job_name = r.job_name
    ORDER BY r.runnable_at, r.run_id;
    COMMIT TRANSACTION;
END
GO
