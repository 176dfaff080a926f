-- 0009 pause and resume (issue 27, item 2): a job paused claims no slot until it is resumed, or
-- until its pause ends by itself (@until, the database's clock); each slot that comes while it
-- is paused is recorded as a run skipped with the note 'paused', so the history shows the gap.
--
-- The pause is state of its own, not a column of agent.jobs: the settings sync rewrites every
-- job from the app settings and never touches this table, so a pause survives any sync, and a
-- job from the settings is paused as a job defined from T-SQL is. One row per job; a row whose
-- paused_until has passed is a pause that ended (the tick and the views read it as none; the
-- next pause replaces it). THROW 51401 (bad argument), 51404 (no such job), 51409 (not paused).

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

CREATE TABLE agent.job_pauses (
    job_name     NVARCHAR(64) NOT NULL CONSTRAINT job_pauses_pk PRIMARY KEY,
    paused_at    DATETIME2(6) NOT NULL,
    paused_until DATETIME2(6) NULL,
    paused_by    NVARCHAR(256) NULL,
    reason       NVARCHAR(400) NULL,
    CONSTRAINT job_pauses_until CHECK (paused_until IS NULL OR paused_until > paused_at)
);
GO

-- agent.pause_job: what `sql-agent pause` does (the pause_job named query), with the caller's
-- USER_NAME() as paused_by and the server's clock. Under the pauses applock, which a tick's claim
-- holds shared to its commit: a tick claiming meanwhile either commits first (its claims inside
-- the pause are then skipped here) or waits and sees the pause.
CREATE PROCEDURE agent.pause_job
    @job_name NVARCHAR(4000),
    @until DATETIMEOFFSET = NULL,
    @reason NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @until_utc DATETIME2(6) = CAST(SWITCHOFFSET(@until, '+00:00') AS DATETIME2(6));
    DECLARE @by NVARCHAR(256) = USER_NAME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.pause_job: ';
    IF @job_name IS NULL
        THROW 51401, N'agent.pause_job: @job_name = NULL: expected the name of a job', 1;
    IF @until_utc IS NOT NULL AND @until_utc <= @now
    BEGIN
        SET @message = @p + N'@until = ''' + CONVERT(NVARCHAR(40), @until, 127)
            + N''': expected a time after now (the database''s clock: ' + CONVERT(NVARCHAR(40), @now, 126)
            + N' UTC), or NULL (until agent.resume_job)';
        THROW 51401, @message, 1;
    END;
    IF @reason IS NOT NULL AND LEN(@reason) > 400
    BEGIN
        SET @message = @p + N'@reason = ''' + REPLACE(LEFT(@reason, 80), N'''', N'''''')
            + N'''...: expected NULL or at most 400 characters';
        THROW 51401, @message, 1;
    END;
    BEGIN TRANSACTION;
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.pause_job: the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name AND j.configured = 1)
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
        THROW 51404, @message, 1;
    END;
    -- Update-then-insert under the lock (no MERGE: Babelfish refuses it).
    UPDATE agent.job_pauses
    SET paused_at = CASE WHEN paused_until IS NULL OR paused_until > @now THEN paused_at ELSE @now END,
        paused_until = @until_utc, paused_by = @by, reason = @reason
    WHERE job_name = @job_name;
    IF @@ROWCOUNT = 0
        INSERT INTO agent.job_pauses (job_name, paused_at, paused_until, paused_by, reason)
        VALUES (@job_name, @now, @until_utc, @by, @reason);
    DECLARE @skipped INT = 0;
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL, note = N'paused'
    WHERE job_name = @job_name AND kind = N'scheduled' AND status IN (N'pending', N'queued')
      AND scheduled_for >= @now AND (@until_utc IS NULL OR scheduled_for < @until_utc);
    SET @skipped = @@ROWCOUNT;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (@job_name, @now, N'paused',
            N'paused by ' + COALESCE(@by, N'?') + N' (agent.pause_job) '
            + COALESCE(N'until ' + CONVERT(NVARCHAR(19), @until_utc, 126) + N' UTC', N'until resumed')
            + COALESCE(N': ' + @reason, N'') + N'; ' + CONVERT(NVARCHAR(20), @skipped) + N' claimed slot(s) skipped');
    COMMIT TRANSACTION;
    SELECT x.paused_at, x.paused_until, x.paused_by, @skipped AS runs_skipped
    FROM agent.job_pauses AS x WHERE x.job_name = @job_name;
END
GO

-- agent.resume_job: what `sql-agent resume` does (the resume_job named query). The job's misfire
-- policy decides the slots missed: under run-once the latest slot of the pause was held back
-- (not recorded) and is caught up once if within GRACE_SECONDS; under skip none runs.
CREATE PROCEDURE agent.resume_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.resume_job: ';
    IF @job_name IS NULL
        THROW 51401, N'agent.resume_job: @job_name = NULL: expected the name of a job', 1;
    BEGIN TRANSACTION;
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.resume_job: the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name)
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job';
        THROW 51404, @message, 1;
    END;
    DECLARE @paused_at DATETIME2(6);
    SELECT @paused_at = x.paused_at FROM agent.job_pauses AS x
    WHERE x.job_name = @job_name AND (x.paused_until IS NULL OR x.paused_until > @now);
    IF @paused_at IS NULL
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(@job_name, N'''', N'''''') + N''': expected a paused job; it is not paused';
        THROW 51409, @message, 1;
    END;
    DELETE FROM agent.job_pauses WHERE job_name = @job_name;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (@job_name, @now, N'resumed',
            N'resumed by ' + COALESCE(USER_NAME(), N'?') + N' (agent.resume_job); paused since '
            + CONVERT(NVARCHAR(19), @paused_at, 126) + N' UTC');
    COMMIT TRANSACTION;
    SELECT @paused_at AS paused_at, @now AS resumed_at;
END
GO

-- agent.job_activity (0005) redefined: state 'paused' (a pause in force at the server's clock;
-- its run in flight, if any, still shows in running_run_id) and the pause's columns. DROP VIEW
-- and CREATE VIEW (Babelfish refuses ALTER VIEW).
DROP VIEW agent.job_activity;
GO
CREATE VIEW agent.job_activity AS
SELECT j.job_name,
       CASE WHEN j.defined_in_database = 1 THEN N'database' ELSE N'settings' END AS defined_in,
       CASE WHEN j.configured = 0 THEN N'removed' WHEN j.valid = 0 THEN N'invalid'
            WHEN j.enabled = 0 THEN N'disabled' WHEN j.needs_planning = 1 THEN N'planning'
            WHEN p.job_name IS NOT NULL THEN N'paused' WHEN c.run_id IS NOT NULL THEN N'running'
            WHEN j.next_due_at IS NULL AND n.next_slot IS NULL THEN N'idle' ELSE N'scheduled' END AS state,
       j.enabled, j.schedule, j.timezone, COALESCE(n.next_slot, j.next_due_at) AS next_run_at,
       c.run_id AS running_run_id, c.started_at AS running_since, c.worker AS running_worker,
       l.run_id AS last_run_id, l.status AS last_outcome, l.finished_at AS last_finished_at,
       l.last_error AS last_error, j.config_error,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p
       ON p.job_name = j.job_name AND (p.paused_until IS NULL OR p.paused_until > SYSUTCDATETIME())
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.started_at, r.worker FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status = N'running'
    ORDER BY r.started_at, r.run_id) AS c
OUTER APPLY (
    SELECT MIN(r.scheduled_for) AS next_slot FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.kind = N'scheduled' AND r.status IN (N'pending', N'queued')) AS n
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.status, r.finished_at, r.last_error FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status IN (N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled')
    ORDER BY r.scheduled_for DESC, r.run_id DESC) AS l;
GO

GRANT EXECUTE ON OBJECT::agent.pause_job TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.resume_job TO agent_operator;
GRANT SELECT ON agent.job_activity TO agent_operator;
