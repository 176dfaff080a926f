-- 0017 the audit trail (issue 32 item 4): every operator action — from the command line
-- (shared/engine/audit.py writes the row in the action's own transaction) and from the agent's
-- procedures below — is one row of agent.audit: who (the login, ORIGINAL_LOGIN(): the Entra or
-- SQL principal), from where (HOST_NAME(), APP_NAME()), when (the server's clock), what, its
-- arguments (JSON, each bounded), and whether it was done or refused. Purged with the history
-- (purge_history). The hot path (claims, starts and ends of runs) writes none.

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

CREATE TABLE agent.audit (
    audit_id   BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT audit_pk PRIMARY KEY,
    acted_at   DATETIME2(6) NOT NULL,
    principal  NVARCHAR(256) NOT NULL,
    client     NVARCHAR(400) NULL,
    source     NVARCHAR(16) NOT NULL,
    action     NVARCHAR(32) NOT NULL,
    job_name   NVARCHAR(200) NULL,
    run_id     BIGINT NULL,
    arguments  NVARCHAR(MAX) NULL,
    outcome    NVARCHAR(8) NOT NULL,
    detail     NVARCHAR(2000) NULL,
    CONSTRAINT audit_source CHECK (source IN (N'cli', N'tsql', N'monitor')),
    CONSTRAINT audit_outcome CHECK (outcome IN (N'done', N'refused'))
);
GO
CREATE INDEX audit_at ON agent.audit (acted_at);
CREATE INDEX audit_job ON agent.audit (job_name, audit_id);
GO

-- One row for a call of one of the agent's procedures.
CREATE PROCEDURE agent.audit_procedure_call
    @action NVARCHAR(32),
    @job_name NVARCHAR(4000),
    @run_id BIGINT,
    @arguments NVARCHAR(MAX),
    @outcome NVARCHAR(8),
    @detail NVARCHAR(2000)
AS
BEGIN
    SET NOCOUNT ON;
    INSERT INTO agent.audit (acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail)
    VALUES (SYSUTCDATETIME(), LEFT(COALESCE(ORIGINAL_LOGIN(), USER_NAME(), N'?'), 256),
            LEFT(COALESCE(NULLIF(APP_NAME(), N''), N'(no application name)') + N' from '
                 + COALESCE(NULLIF(HOST_NAME(), N''), N'(no host name)') + N', database user '
                 + COALESCE(USER_NAME(), N'?'), 400),
            N'tsql', @action, LEFT(@job_name, 200), @run_id, @arguments, @outcome, @detail);
END
GO

-- Each operator procedure becomes <name>_unaudited (sp_rename: its body, checks, results and
-- grants unchanged; agent_operator's EXECUTE on it revoked, ownership chaining still lets the
-- new one call it), and a procedure of the old name and parameters calls it and writes the audit
-- row in one transaction. A refused call (it threw) made outside a transaction is rolled back
-- and then recorded 'refused' with its message, before the error goes to the caller; inside the
-- caller's transaction (doomed under XACT_ABORT) nothing can be recorded. A later migration that
-- changes what one of them does alters the <name>_unaudited one.
-- sp_rename names its @objtype, N'OBJECT' (SQL Server's meaning when it is left out; Babelfish
-- refuses the call without it: "Please provide @objtype that is supported in Babelfish").
EXEC sp_rename N'agent.exec_async', N'exec_async_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.exec_async
    @sql NVARCHAR(MAX),
    @execution_order INT = 0,
    @database NVARCHAR(4000) = NULL,
    @run_at DATETIMEOFFSET = NULL,
    @max_attempts INT = 1,
    @timeout_seconds INT = 1800,
    @run_id BIGINT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@sql, 2000) AS [sql], @execution_order AS [execution_order], LEFT(@database, 200) AS [database], @run_at AS [run_at], @max_attempts AS [max_attempts], @timeout_seconds AS [timeout_seconds] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'submit';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.exec_async_unaudited @sql = @sql, @execution_order = @execution_order, @database = @database, @run_at = @run_at, @max_attempts = @max_attempts, @timeout_seconds = @timeout_seconds, @run_id = @run_id OUTPUT;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = @run_id,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = @run_id,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.exec_async_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.exec_async TO agent_operator;
GO

EXEC sp_rename N'agent.add_scheduled_job', N'add_scheduled_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.add_scheduled_job
    @name NVARCHAR(4000),
    @sql NVARCHAR(MAX),
    @schedule NVARCHAR(4000) = NULL,
    @run_at DATETIMEOFFSET = NULL,
    @timezone NVARCHAR(4000) = N'UTC',
    @enabled INT = 1,
    @max_attempts INT = 3,
    @timeout_seconds INT = 1800,
    @overlap NVARCHAR(4000) = N'skip',
    @database NVARCHAR(4000) = NULL,
    @misfire NVARCHAR(4000) = N'run-once',
    @grace_seconds INT = 86400,
    @lease_seconds INT = 60,
    @targets NVARCHAR(4000) = NULL,
    @target_parallelism INT = 8,
    @after NVARCHAR(4000) = NULL,
    @after_outcome NVARCHAR(4000) = N'succeeded'
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name], LEFT(@sql, 2000) AS [sql], LEFT(@schedule, 200) AS [schedule], @run_at AS [run_at], LEFT(@timezone, 100) AS [timezone], @enabled AS [enabled], @max_attempts AS [max_attempts], @timeout_seconds AS [timeout_seconds], LEFT(@overlap, 20) AS [overlap], LEFT(@database, 200) AS [database], LEFT(@misfire, 20) AS [misfire], @grace_seconds AS [grace_seconds], @lease_seconds AS [lease_seconds], LEFT(@targets, 400) AS [targets], @target_parallelism AS [target_parallelism], LEFT(@after, 400) AS [after], LEFT(@after_outcome, 20) AS [after_outcome] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'define';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.add_scheduled_job_unaudited @name = @name, @sql = @sql, @schedule = @schedule, @run_at = @run_at, @timezone = @timezone, @enabled = @enabled, @max_attempts = @max_attempts, @timeout_seconds = @timeout_seconds, @overlap = @overlap, @database = @database, @misfire = @misfire, @grace_seconds = @grace_seconds, @lease_seconds = @lease_seconds, @targets = @targets, @target_parallelism = @target_parallelism, @after = @after, @after_outcome = @after_outcome;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @name, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.add_scheduled_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.add_scheduled_job TO agent_operator;
GO

EXEC sp_rename N'agent.remove_scheduled_job', N'remove_scheduled_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.remove_scheduled_job
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'remove';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.remove_scheduled_job_unaudited @name = @name;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @name, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.remove_scheduled_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.remove_scheduled_job TO agent_operator;
GO

EXEC sp_rename N'agent.enable_job', N'enable_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.enable_job
    @name NVARCHAR(4000),
    @enabled INT = 1
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name], @enabled AS [enabled] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = CASE WHEN @enabled = 0 THEN N'disable' ELSE N'enable' END;
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.enable_job_unaudited @name = @name, @enabled = @enabled;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @name, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.enable_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.enable_job TO agent_operator;
GO

EXEC sp_rename N'agent.start_job', N'start_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.start_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'run-now';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.start_job_unaudited @job_name = @job_name;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
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
REVOKE EXECUTE ON agent.start_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.start_job TO agent_operator;
GO

EXEC sp_rename N'agent.stop_job', N'stop_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.stop_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'stop';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.stop_job_unaudited @job_name = @job_name;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
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
REVOKE EXECUTE ON agent.stop_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.stop_job TO agent_operator;
GO

EXEC sp_rename N'agent.cancel_run', N'cancel_run_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.cancel_run
    @run_id BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT @run_id AS [run_id] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'cancel';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.cancel_run_unaudited @run_id = @run_id;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = @run_id,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = @run_id,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.cancel_run_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.cancel_run TO agent_operator;
GO

EXEC sp_rename N'agent.requeue_poison', N'requeue_poison_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.requeue_poison
    @poison_id BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT @poison_id AS [poison_id] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'requeue';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.requeue_poison_unaudited @poison_id = @poison_id;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.requeue_poison_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.requeue_poison TO agent_operator;
GO

EXEC sp_rename N'agent.pause_job', N'pause_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.pause_job
    @job_name NVARCHAR(4000),
    @until DATETIMEOFFSET = NULL,
    @reason NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name], @until AS [until], LEFT(@reason, 400) AS [reason] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'pause';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.pause_job_unaudited @job_name = @job_name, @until = @until, @reason = @reason;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
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
REVOKE EXECUTE ON agent.pause_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.pause_job TO agent_operator;
GO

EXEC sp_rename N'agent.resume_job', N'resume_job_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.resume_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'resume';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.resume_job_unaudited @job_name = @job_name;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
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
REVOKE EXECUTE ON agent.resume_job_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.resume_job TO agent_operator;
GO

EXEC sp_rename N'agent.add_calendar', N'add_calendar_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.add_calendar
    @name NVARCHAR(4000),
    @dates NVARCHAR(MAX) = NULL,
    @weekly NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name], LEFT(@dates, 1000) AS [dates], LEFT(@weekly, 400) AS [weekly] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'define-calendar';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.add_calendar_unaudited @name = @name, @dates = @dates, @weekly = @weekly;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.add_calendar_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.add_calendar TO agent_operator;
GO

EXEC sp_rename N'agent.remove_calendar', N'remove_calendar_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.remove_calendar
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'remove-calendar';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.remove_calendar_unaudited @name = @name;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @audit_error = LEFT(ERROR_MESSAGE(), 2000);
        IF @caller_transactions = 0
        BEGIN
            IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
            EXEC agent.audit_procedure_call @action = @audit_action, @job_name = NULL, @run_id = NULL,
                 @arguments = @audit_arguments, @outcome = N'refused', @detail = @audit_error;
        END;
        THROW;
    END CATCH;
END
GO
REVOKE EXECUTE ON agent.remove_calendar_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.remove_calendar TO agent_operator;
GO

EXEC sp_rename N'agent.set_job_calendars', N'set_job_calendars_unaudited', N'OBJECT';
GO
CREATE PROCEDURE agent.set_job_calendars
    @job_name NVARCHAR(4000),
    @exclude_calendars NVARCHAR(4000) = NULL,
    @only_calendars NVARCHAR(4000) = NULL,
    @on_excluded NVARCHAR(4000) = N'skip',
    @jitter_seconds INT = 0
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name], LEFT(@exclude_calendars, 400) AS [exclude_calendars], LEFT(@only_calendars, 400) AS [only_calendars], LEFT(@on_excluded, 20) AS [on_excluded], @jitter_seconds AS [jitter_seconds] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'set-calendars';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.set_job_calendars_unaudited @job_name = @job_name, @exclude_calendars = @exclude_calendars, @only_calendars = @only_calendars, @on_excluded = @on_excluded, @jitter_seconds = @jitter_seconds;
        EXEC agent.audit_procedure_call @action = @audit_action, @job_name = @job_name, @run_id = NULL,
             @arguments = @audit_arguments, @outcome = N'done', @detail = NULL;
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
REVOKE EXECUTE ON agent.set_job_calendars_unaudited FROM agent_operator;
GRANT EXECUTE ON OBJECT::agent.set_job_calendars TO agent_operator;
GO

