-- 0029 the T-SQL hot path's cost on Babelfish (issue 35 item 3). Measured there (Babelfish 4.3,
-- docs/performance.md): the no-op rate was set by two costs that SQL Server does not have.
-- * Babelfish parses a procedure's T-SQL with ANTLR in each session, on its first call, and ANTLR's
--   prediction cache starts empty in each new server process: agent.start_follow_up_runs, one
--   large INSERT ... SELECT, took 3 to 6 s of CPU to parse on a new connection, agent.claim_runs 1.3
--   to 2.3 s; each worker of the local runner paid both on its first task.
-- * Each statement that reads or writes a table variable is planned again on every call (Babelfish
--   makes a temporary table of it per call), about 1 to 3 ms each.
-- So, with the same statements deciding the same things, under the same start lock, in the same
-- transaction, each procedure keeping its signature and its one result set:
-- * agent.start_follow_up_runs (called in every completion) becomes a guard: when no job follows
--   the job of a run ended at @now (the necessary condition of its INSERT's join), it returns the
--   empty result set of its columns without calling anything; otherwise it calls its former body,
--   now agent.start_follow_up_runs_found (unchanged). A procedure called from a branch not taken is
--   never parsed: a session whose runs have no follower never pays for that body.
-- * agent.claim_runs runs its skip statements (overlap skip and buffer-one, misfire) only when a
--   due pending run one of them could skip exists, and its cancel-previous statements only when a
--   due pending run of that policy exists (each IF the necessary condition of the WHERE it guards,
--   as 0026 did on PostgreSQL); the runs to start are picked by the INSERT's own SELECT TOP ...
--   ORDER BY, not by an outer SELECT of agent.runs filtered by IN on that subselect (the same rows
--   and locks; PostgreSQL ran the subselect once per pending run, in proportion to the backlog);
--   the second table variable, @claimed (21 columns, a copy of each decided run), goes: @pick keeps
--   each run's decision and the result is read from agent.runs at the end (a run decided in one
--   phase is in a status no later statement of the claim changes, so it reads what @claimed held).
-- * agent.finish_run keeps the run it completes in a variable instead of two table variables (one
--   run, named by its key): the same reads and writes, in the same order.
-- No CREATE OR ALTER, no MERGE, no UPDATE ... OUTPUT (0025); ALTER PROCEDURE keeps permissions.

-- start_follow_up_runs' body of 0023, unchanged but for its name (called by the guard below).
CREATE PROCEDURE agent.start_follow_up_runs_found
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
ALTER PROCEDURE agent.start_follow_up_runs
    @now DATETIME2(6),
    @chain_limit INT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    -- The join of agent.start_follow_up_runs_found's INSERT (a run ended at @now, a job following its
    -- job): without a row of it, that procedure inserts nothing and returns no row.
    IF EXISTS (SELECT 1 FROM agent.runs AS r
               JOIN agent.jobs AS f ON f.after_job = r.job_name AND f.enabled = 1 AND f.valid = 1 AND f.configured = 1
               WHERE r.finished_at = CAST(@now AS DATETIME2(6)) AND r.kind <> N'target')
        EXEC agent.start_follow_up_runs_found @now, @chain_limit;
    ELSE
        SELECT CAST(NULL AS BIGINT) AS run_id, CAST(NULL AS NVARCHAR(64)) AS job_name,
               CAST(NULL AS BIGINT) AS followed_run_id, CAST(NULL AS NVARCHAR(32)) AS operation_id,
               CAST(NULL AS NVARCHAR(16)) AS status, CAST(NULL AS NVARCHAR(MAX)) AS note
        WHERE 1 = 0;
END
GO
-- claim_runs: 0025's body, its rare-policy statements guarded, its start pick without the outer IN,
-- its decisions kept in @pick (no @claimed).
ALTER PROCEDURE agent.claim_runs
    @at DATETIME2(6),
    @late_cutoff DATETIME2(6),
    @batch INT,
    @max_concurrency INT,
    @worker NVARCHAR(200)
AS
BEGIN
    SET NOCOUNT ON;
    -- The runs the claim decided on, each with its decision (a run is decided once: each phase takes
    -- runs in statuses the phases before it left none in), read back from agent.runs at the end.
    DECLARE @pick TABLE (run_id BIGINT PRIMARY KEY, decision NVARCHAR(20));
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The start lock: an exclusive table lock to the end of the transaction on SQL Server (TABLOCKX),
    -- a row lock on Babelfish, which ignores the hint (an UPDATE, not a locking SELECT, for that).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    -- The claim's one time, read once the lock is held: what was committed before it is runnable by it.
    DECLARE @now DATETIME2(6) = COALESCE(@at, SYSUTCDATETIME());
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
ALTER PROCEDURE agent.finish_run
    @run_id BIGINT,
    @token BIGINT,
    @now DATETIME2(6)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    -- The run, when it is still running with this token (NULL otherwise): 0025's @pick and @done held
    -- this one row (the token does not change here, so @done's token is @token).
    DECLARE @done BIGINT;
    SELECT @done = run_id FROM agent.runs
    WHERE run_id = @run_id AND token = @token AND status = N'running';
    UPDATE agent.runs SET status = N'succeeded', finished_at = CAST(@now AS DATETIME2(6)),
        lease_expires_at = NULL, last_error = NULL, last_error_number = NULL
    WHERE run_id = @done;
    UPDATE agent.attempts SET outcome = N'succeeded', finished_at = CAST(@now AS DATETIME2(6))
    WHERE run_id = @done AND token = @token AND outcome = N'running';
    IF @done IS NULL THROW 50003, N'fenced: the run is no longer running with this token (its lease was taken over, or it was cancelled)', 1;
    SELECT @done AS run_id;
END
GO
