-- 0028 steps for the jobs defined in the database (issue 32 item 6; SQL Server Agent's
-- sp_add_jobstep); see the PostgreSQL file of the same number. agent.jobs.requested_steps: the
-- JSON array agent.set_job_steps was given (NULL: none), checked and written into agent.jobs.steps
-- by the engine's planning (needs_planning = 1), as the settings sync writes the same steps.
-- Steps are SQL that runs as the job's owner: only its owner (USER_NAME() as the job recorded it),
-- a member of the owner's database role, a member of db_owner or a sysadmin may set them; the
-- check is the audited procedure's (the monitor's job form calls the body in the transaction that
-- defined the job and made the signed-in principal its owner).

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

ALTER TABLE agent.jobs ADD requested_steps NVARCHAR(MAX) NULL;
GO

CREATE PROCEDURE agent.set_job_steps_unaudited
    @job_name NVARCHAR(4000),
    @steps NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.set_job_steps: ';
    DECLARE @stored NVARCHAR(MAX) = @steps;
    IF LEN(@steps) > 1000000
    BEGIN
        SET @message = @p + N'@steps = ''' + REPLACE(LEFT(@steps, 80), N'''', N'''''')
            + N'''...: expected a JSON array of steps of at most 1000000 characters';
        THROW 51401, @message, 1;
    END;
    IF REPLACE(REPLACE(REPLACE(REPLACE(REPLACE(@steps, N' ', N''), NCHAR(9), N''), NCHAR(10), N''), NCHAR(13), N''),
               NCHAR(160), N'') IN (N'', N'[]')
        SET @stored = NULL;
    UPDATE agent.jobs SET requested_steps = @stored, needs_planning = 1, next_due_at = NULL, updated_at = @now
    WHERE job_name = @job_name AND configured = 1 AND defined_in_database = 1;
    IF @@ROWCOUNT = 0
    BEGIN
        SET @message = @p + N'@job_name = ' + COALESCE(N'''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes '
            + N'JOB__<name>__STEPS__<n>__*)';
        THROW 51404, @message, 1;
    END;
    -- The slots claimed with the old steps (those a pause recorded skipped ahead included), as a
    -- redefinition records them: claimed again in place with the new steps once planned.
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job''s steps were changed by agent.set_job_steps after this slot was claimed'
    WHERE job_name = @job_name AND kind = N'scheduled'
      AND (status IN (N'pending', N'queued')
           OR (status = N'skipped' AND note = N'paused' AND attempt = 0 AND scheduled_for >= @now));
    SELECT CAST(@job_name AS NVARCHAR(64)) AS job, @stored AS requested_steps;
END
GO

-- The audited procedure of the name (0017's way): the call and its audit row in one transaction; a
-- refused call (the owner check's too) recorded after the rollback.
CREATE PROCEDURE agent.set_job_steps
    @job_name NVARCHAR(4000),
    @steps NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name], LEFT(@steps, 2000) AS [steps]
                                               FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'set-steps';
    DECLARE @audit_error NVARCHAR(2000);
    DECLARE @owner NVARCHAR(256);
    DECLARE @found INT = 0;
    DECLARE @message NVARCHAR(2048);
    BEGIN TRY
        BEGIN TRANSACTION;
        SELECT @owner = j.owner, @found = 1 FROM agent.jobs AS j WITH (UPDLOCK, HOLDLOCK)
        WHERE j.job_name = @job_name AND j.configured = 1 AND j.defined_in_database = 1;
        IF @found = 1 AND NOT (COALESCE(@owner, N'') = COALESCE(USER_NAME(), N'?') OR IS_MEMBER(N'db_owner') = 1
                               OR IS_SRVROLEMEMBER(N'sysadmin') = 1 OR (@owner IS NOT NULL AND IS_MEMBER(@owner) = 1))
        BEGIN
            SET @message = N'agent.set_job_steps: @job_name = ''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''')
                + N''': expected a job you own; this job runs as '
                + COALESCE(N'''' + REPLACE(@owner, N'''', N'''''') + N'''', N'the agent (no recorded owner)')
                + N' and its steps would run as it: only its owner, a member of its owner''s role, db_owner or a '
                + N'sysadmin may set them (agent.add_scheduled_job redefines the job as yours)';
            THROW 51403, @message, 1;
        END;
        EXEC agent.set_job_steps_unaudited @job_name = @job_name, @steps = @steps;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = N'requested';
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.set_job_steps_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.set_job_steps TO agent_operator;
GO

-- A job's steps are its owner's: when the job changes hands (agent.add_scheduled_job by another
-- principal makes the caller its owner; the monitor's form records the signed-in principal) or is
-- removed, the steps set before are dropped, by construction for every path that writes the
-- owner: another principal's steps never run as the new owner, and a job defined again under a
-- removed job's name starts without them. The job is planned again (its planned steps cleared
-- with them); a redefinition by the same owner keeps them, as documented. (The trigger's own
-- UPDATE sets neither owner nor configured: it does not fire itself again.)
CREATE TRIGGER agent.jobs_steps_stay_with_their_owner ON agent.jobs AFTER UPDATE AS
BEGIN
    SET NOCOUNT ON;
    IF NOT (UPDATE(owner) OR UPDATE(configured)) RETURN;
    UPDATE j SET requested_steps = NULL,
                 steps = CASE WHEN i.configured = 1 THEN NULL ELSE j.steps END,
                 needs_planning = CASE WHEN i.configured = 1 THEN 1 ELSE j.needs_planning END
    FROM agent.jobs AS j
    JOIN inserted AS i ON i.job_name = j.job_name
    JOIN deleted AS d ON d.job_name = i.job_name
    WHERE d.requested_steps IS NOT NULL
      AND (COALESCE(i.owner, N'') <> COALESCE(d.owner, N'') OR (d.configured = 1 AND i.configured = 0));
END
GO
