-- 0015 slots after a change of a job's state (issue 34, items 4 to 6 follow-up); see the
-- PostgreSQL file of the same number.
--
-- agent.enable_job @enabled = 1 gives back at once the slots its disable recorded skipped, when
-- the job has not changed since, that have not come (the pause in force, if any, decides them
-- again: agent.settle_paused_runs); @enabled = 0 records the slots a pause had recorded skipped
-- ahead as disabled too; both record a job event. The claim (claim_slots) claims again, in
-- place, a slot the definition in force plans whose run a definition change recorded skipped.
-- agent.jobs.definition_hash: what the settings sync last wrote for a settings job.

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

ALTER TABLE agent.jobs ADD definition_hash NVARCHAR(64) NULL;
GO

-- agent.enable_job (0005) with the slots given back; the result gains resumed_runs. ALTER
-- PROCEDURE keeps the grants.
ALTER PROCEDURE agent.enable_job
    @name NVARCHAR(4000),
    @enabled INT = 1
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.enable_job: ';
    IF @name IS NULL
        THROW 51401, N'agent.enable_job: @name = NULL: expected the name of a job defined by agent.add_scheduled_job', 1;
    IF @enabled IS NULL OR @enabled NOT IN (0, 1)
    BEGIN
        SET @message = @p + N'@enabled = ' + COALESCE(CONVERT(NVARCHAR(20), @enabled), N'NULL')
            + N': expected 1 (enable) or 0 (disable)';
        THROW 51401, @message, 1;
    END;
    BEGIN TRANSACTION;
    -- The job-definitions lock, then the pauses lock (the order a tick's claim takes them, shared):
    -- a claim in flight commits first, and what comes back is decided against the pause as it stands.
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.enable_job: the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.enable_job: the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
    DECLARE @existing_in_database SMALLINT;
    DECLARE @existing_enabled SMALLINT;
    DECLARE @existing_updated DATETIME2(6);
    SELECT @existing_in_database = j.defined_in_database, @existing_enabled = j.enabled,
           @existing_updated = j.updated_at
    FROM agent.jobs AS j WHERE j.job_name = @name AND j.configured = 1;
    IF @existing_in_database IS NULL
    BEGIN
        SET @message = @p + N'@name = ''' + REPLACE(@name, N'''', N'''''')
            + N''': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
        THROW 51404, @message, 1;
    END;
    IF @existing_in_database = 0
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a job defined in the database; this job is defined in the app settings: set JOB__'
            + @name + N'__ENABLED there';
        THROW 51409, @message, 1;
    END;
    DECLARE @skipped INT = 0;
    DECLARE @resumed INT = 0;
    IF @existing_enabled <> @enabled
    BEGIN
        UPDATE agent.jobs SET enabled = @enabled, needs_planning = @enabled, next_due_at = NULL,
            advanced_at = NULL, updated_at = @now
        WHERE job_name = @name;
        IF @enabled = 0
        BEGIN
            -- Its slots claimed ahead, and those a pause recorded skipped ahead (enabling gives
            -- them back and lets the pause decide them again).
            UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
                note = N'skipped: the job was disabled by agent.enable_job after this slot was claimed'
            WHERE job_name = @name AND kind = N'scheduled' AND status IN (N'pending', N'queued');
            SET @skipped = @@ROWCOUNT;
            UPDATE agent.runs SET finished_at = @now,
                note = N'skipped: the job was disabled by agent.enable_job after this slot was claimed'
            WHERE job_name = @name AND kind = N'scheduled' AND status = N'skipped' AND note = N'paused'
              AND attempt = 0 AND scheduled_for >= @now;
            INSERT INTO agent.job_events (job_name, event_at, kind, detail)
            VALUES (@name, @now, N'disabled',
                    N'disabled (agent.enable_job); ' + CONVERT(NVARCHAR(20), @skipped) + N' claimed slot(s) skipped');
        END
        ELSE
        BEGIN
            -- The slots the disable recorded skipped (at the instant it changed the job: nothing
            -- has changed it since) that have not come: the job's again, runnable at their time,
            -- with a new token (it fences a message sent before) and operation id. The planning
            -- that follows claims the slots after them.
            UPDATE agent.runs SET status = N'pending', note = NULL, runnable_at = scheduled_for,
                finished_at = NULL, lease_expires_at = NULL, dispatched_at = NULL, last_error = NULL,
                last_error_number = NULL, token = token + 1, created_at = @now,
                operation_id = LOWER(REPLACE(CONVERT(VARCHAR(36), NEWID()), '-', ''))
            WHERE job_name = @name AND kind = N'scheduled' AND status = N'skipped' AND attempt = 0
              AND note = N'skipped: the job was disabled by agent.enable_job after this slot was claimed'
              AND finished_at = @existing_updated AND scheduled_for > @now;
            SET @resumed = @@ROWCOUNT;
            DECLARE @paused_at DATETIME2(6);
            DECLARE @paused_until DATETIME2(6);
            DECLARE @paused INT = 0;
            SELECT @paused_at = x.paused_at, @paused_until = x.paused_until, @paused = 1
            FROM agent.job_pauses AS x
            WHERE x.job_name = @name AND (x.paused_until IS NULL OR x.paused_until > @now);
            IF @paused = 1
            BEGIN
                DECLARE @held INT = 0;
                DECLARE @back INT = 0;
                DECLARE @caught_up INT = 0;
                EXEC agent.settle_paused_runs @job_name = @name, @now = @now, @pause_start = @paused_at,
                     @pause_end = @paused_until, @runs_skipped = @held OUTPUT, @runs_resumed = @back OUTPUT,
                     @runs_caught_up = @caught_up OUTPUT;
                SET @resumed = @resumed - @held;
            END;
            INSERT INTO agent.job_events (job_name, event_at, kind, detail)
            VALUES (@name, @now, N'enabled',
                    N'enabled (agent.enable_job); ' + CONVERT(NVARCHAR(20), @resumed) + N' slot(s) claimed ahead run at their time');
        END;
    END;
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @skipped AS skipped_runs, @resumed AS resumed_runs;
END
GO
