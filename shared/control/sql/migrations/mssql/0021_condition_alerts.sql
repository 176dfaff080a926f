-- 0021 condition alerts (issue 32 item 3), as sp_add_alert; see the PostgreSQL file of the same
-- number. agent.add_alert and agent.remove_alert are audited as the procedures of 0017 are (the
-- body is agent.<name>_unaudited); the alert's owner is the caller's database user (USER_NAME()),
-- as for jobs, and its probe runs as that user (EXECUTE AS USER ... WITH COOKIE).

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

CREATE TABLE agent.alerts (
    alert_name         NVARCHAR(64) NOT NULL CONSTRAINT alerts_pk PRIMARY KEY,
    source             NVARCHAR(16) NOT NULL,
    owner              NVARCHAR(256) NULL,
    probe_query        NVARCHAR(MAX) NULL,
    schedule           NVARCHAR(400) NULL,
    timezone           NVARCHAR(64) NOT NULL CONSTRAINT alerts_timezone_default DEFAULT 'UTC',
    errors             NVARCHAR(400) NULL,
    timeout_seconds    INT NOT NULL CONSTRAINT alerts_timeout_default DEFAULT 30,
    delay_seconds      INT NOT NULL CONSTRAINT alerts_delay_default DEFAULT 300,
    notify             INT NOT NULL CONSTRAINT alerts_notify_default DEFAULT 1,
    notify_webhook_url NVARCHAR(2000) NULL,
    response_job       NVARCHAR(64) NULL,
    enabled            INT NOT NULL CONSTRAINT alerts_enabled_default DEFAULT 1,
    valid              INT NULL,
    config_error       NVARCHAR(MAX) NULL,
    next_check_at      DATETIME2(6) NULL,
    checked_until      DATETIME2(6) NULL,
    last_checked_at    DATETIME2(6) NULL,
    next_response_at   DATETIME2(6) NULL,
    last_occurred_at   DATETIME2(6) NULL,
    last_response_at   DATETIME2(6) NULL,
    occurrences        INT NOT NULL CONSTRAINT alerts_occurrences_default DEFAULT 0,
    responses          INT NOT NULL CONSTRAINT alerts_responses_default DEFAULT 0,
    last_error         NVARCHAR(MAX) NULL,
    error_since        DATETIME2(6) NULL,
    created_at         DATETIME2(6) NOT NULL,
    updated_at         DATETIME2(6) NOT NULL
);
GO
CREATE INDEX alerts_next_check ON agent.alerts (next_check_at);
GO

CREATE TABLE agent.alert_firings (
    firing_id       BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT alert_firings_pk PRIMARY KEY,
    alert_name      NVARCHAR(64) NOT NULL,
    kind            NVARCHAR(16) NOT NULL,
    raised_at       DATETIME2(6) NOT NULL,
    detail          NVARCHAR(MAX) NULL,
    response_run_id BIGINT NULL,
    response_error  NVARCHAR(MAX) NULL
);
GO
CREATE INDEX alert_firings_alert ON agent.alert_firings (alert_name, firing_id);
CREATE INDEX alert_firings_raised ON agent.alert_firings (raised_at);
CREATE INDEX alert_firings_response ON agent.alert_firings (response_run_id);
CREATE INDEX attempts_finished ON agent.attempts (finished_at);
GO

ALTER TABLE agent.audit DROP CONSTRAINT audit_source;
ALTER TABLE agent.audit ADD CONSTRAINT audit_source CHECK (source IN (N'cli', N'tsql', N'monitor', N'alert'));
GO

CREATE PROCEDURE agent.add_alert_unaudited
    @name NVARCHAR(4000),
    @query NVARCHAR(MAX) = NULL,
    @schedule NVARCHAR(4000) = NULL,
    @errors NVARCHAR(4000) = NULL,
    @delay_between_responses_seconds INT = 300,
    @notify INT = 1,
    @response_job NVARCHAR(4000) = NULL,
    @timezone NVARCHAR(4000) = N'UTC',
    @timeout_seconds INT = 30,
    @enabled INT = 1
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.add_alert: ';
    IF @name IS NULL OR @name = N'' OR LEN(@name) > 64 OR @name COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%'
    BEGIN
        SET @message = @p + N'@name = ' + COALESCE(N'''' + REPLACE(LEFT(@name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected an alert name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF (CASE WHEN NULLIF(LTRIM(RTRIM(COALESCE(@query, N''))), N'') IS NULL THEN 1 ELSE 0 END)
       = (CASE WHEN NULLIF(LTRIM(RTRIM(COALESCE(@errors, N''))), N'') IS NULL THEN 1 ELSE 0 END)
        THROW 51401, N'agent.add_alert: @query and @errors: expected exactly one of them (a probe query whose rows are the alert, with @schedule; or error numbers and severities, e.g. ''50000,1205,severity>=16'')', 1;
    IF @query IS NOT NULL AND NULLIF(LTRIM(RTRIM(COALESCE(@schedule, N''))), N'') IS NULL
        THROW 51401, N'agent.add_alert: @schedule = NULL: a probe (@query) needs a schedule, as a job''s (e.g. ''0 */5 * * * *'')', 1;
    IF LEN(@query) > 40000 OR LEN(@schedule) > 400 OR LEN(@errors) > 400
        THROW 51401, N'agent.add_alert: @query, @schedule or @errors: expected at most 40000, 400 and 400 characters', 1;
    IF @delay_between_responses_seconds IS NULL OR @delay_between_responses_seconds < 0 OR @delay_between_responses_seconds > 31536000
    BEGIN
        SET @message = @p + N'@delay_between_responses_seconds = ' + COALESCE(CAST(@delay_between_responses_seconds AS NVARCHAR(20)), N'NULL')
            + N': expected whole seconds from 0 to 31536000 (a year)';
        THROW 51401, @message, 1;
    END;
    IF @timeout_seconds IS NULL OR @timeout_seconds < 1 OR @timeout_seconds > 600
    BEGIN
        SET @message = @p + N'@timeout_seconds = ' + COALESCE(CAST(@timeout_seconds AS NVARCHAR(20)), N'NULL')
            + N': expected whole seconds from 1 to 600';
        THROW 51401, @message, 1;
    END;
    IF @notify IS NULL OR @notify NOT IN (0, 1) OR @enabled IS NULL OR @enabled NOT IN (0, 1)
        THROW 51401, N'agent.add_alert: @notify and @enabled: expected 0 or 1', 1;
    IF @notify = 0 AND @response_job IS NULL
        THROW 51401, N'agent.add_alert: @notify = 0, @response_job = NULL: expected a response (notify, a job to start, or both)', 1;
    IF LEN(@response_job) > 64 OR LEN(@timezone) > 64
        THROW 51401, N'agent.add_alert: @response_job or @timezone: expected at most 64 characters', 1;
    DECLARE @action NVARCHAR(16) = N'defined';
    BEGIN TRANSACTION;
    IF EXISTS (SELECT 1 FROM agent.alerts WITH (UPDLOCK, HOLDLOCK) WHERE alert_name = @name)
    BEGIN
        SET @action = N'redefined';
        DELETE FROM agent.alerts WHERE alert_name = @name;
    END;
    INSERT INTO agent.alerts (alert_name, source, owner, probe_query, schedule, timezone, errors, timeout_seconds,
                              delay_seconds, notify, response_job, enabled, valid, created_at, updated_at)
    VALUES (@name, N'database', USER_NAME(), NULLIF(LTRIM(RTRIM(@query)), N''), NULLIF(LTRIM(RTRIM(@schedule)), N''),
            COALESCE(NULLIF(LTRIM(RTRIM(@timezone)), N''), N'UTC'), NULLIF(LTRIM(RTRIM(@errors)), N''), @timeout_seconds,
            @delay_between_responses_seconds, @notify, NULLIF(LTRIM(RTRIM(@response_job)), N''), @enabled, NULL, @now, @now);
    COMMIT TRANSACTION;
    SELECT CAST(@name AS NVARCHAR(64)) AS alert_name, @action AS action;
END
GO

CREATE PROCEDURE agent.remove_alert_unaudited
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @message NVARCHAR(2048);
    BEGIN TRANSACTION;
    IF EXISTS (SELECT 1 FROM agent.alerts WITH (UPDLOCK, HOLDLOCK) WHERE alert_name = @name AND source = N'settings')
    BEGIN
        SET @message = N'agent.remove_alert: @name = ''' + REPLACE(LEFT(@name, 80), N'''', N'''''')
            + N''': this alert is defined in the app settings (ALERT__' + LEFT(@name, 80) + N'__*); remove it there';
        THROW 51401, @message, 1;
    END;
    DELETE FROM agent.alerts WHERE alert_name = @name AND source = N'database';
    DECLARE @removed INT = @@ROWCOUNT;
    IF @removed = 0
    BEGIN
        SET @message = N'agent.remove_alert: @name = ' + COALESCE(N'''' + REPLACE(LEFT(@name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': no alert of that name was defined with agent.add_alert';
        THROW 51402, @message, 1;
    END;
    COMMIT TRANSACTION;
    SELECT CAST(@name AS NVARCHAR(64)) AS alert_name, @removed AS removed;
END
GO
REVOKE EXECUTE ON agent.add_alert_unaudited FROM agent_operator;
REVOKE EXECUTE ON agent.remove_alert_unaudited FROM agent_operator;
GO

CREATE PROCEDURE agent.add_alert
    @name NVARCHAR(4000),
    @query NVARCHAR(MAX) = NULL,
    @schedule NVARCHAR(4000) = NULL,
    @errors NVARCHAR(4000) = NULL,
    @delay_between_responses_seconds INT = 300,
    @notify INT = 1,
    @response_job NVARCHAR(4000) = NULL,
    @timezone NVARCHAR(4000) = N'UTC',
    @timeout_seconds INT = 30,
    @enabled INT = 1
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name], LEFT(@query, 2000) AS [query],
        LEFT(@schedule, 200) AS [schedule], LEFT(@errors, 400) AS [errors],
        @delay_between_responses_seconds AS [delay_between_responses_seconds], @notify AS [notify],
        LEFT(@response_job, 200) AS [response_job], LEFT(@timezone, 100) AS [timezone],
        @timeout_seconds AS [timeout_seconds], @enabled AS [enabled] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'define-alert';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.add_alert_unaudited @name = @name, @query = @query, @schedule = @schedule, @errors = @errors,
             @delay_between_responses_seconds = @delay_between_responses_seconds, @notify = @notify,
             @response_job = @response_job, @timezone = @timezone, @timeout_seconds = @timeout_seconds,
             @enabled = @enabled;
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
GRANT EXECUTE ON OBJECT::agent.add_alert TO agent_operator;
GO

CREATE PROCEDURE agent.remove_alert
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'remove-alert';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.remove_alert_unaudited @name = @name;
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
GRANT EXECUTE ON OBJECT::agent.remove_alert TO agent_operator;
GO
