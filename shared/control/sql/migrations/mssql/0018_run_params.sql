-- 0018 run with parameters (issue 33 item 4); see the PostgreSQL file of the same number.
-- agent.jobs.params: the parameters a job declares, as JSON {name: default, or null}; NULL: none.
-- agent.runs.params: the values a run was started with (defaults filled in), as JSON; NULL: none.
-- claim_runs and start_run are named queries in this dialect: they read both with the run.
ALTER TABLE agent.jobs ADD params NVARCHAR(MAX) NULL;
ALTER TABLE agent.runs ADD params NVARCHAR(MAX) NULL;
GO

-- agent.start_job_unaudited (0011's start_job, renamed by 0017 behind the audited agent.start_job) with @params: the run's parameters as a JSON object {"name": "value"}
-- (NULL: none given), checked against the job's declarations (names compare case-insensitively,
-- as the default collation does), the defaults filled in, recorded on the run (agent.runs.params).
-- The values are data: the job's SQL reads them as @name, bound by sp_executesql.
ALTER PROCEDURE agent.start_job_unaudited
    @job_name NVARCHAR(4000),
    @params NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.start_job: ';
    DECLARE @bad NVARCHAR(4000);
    IF @job_name IS NULL
        THROW 51401, N'agent.start_job: @job_name = NULL: expected the name of a job', 1;
    DECLARE @valid SMALLINT;
    DECLARE @config_error NVARCHAR(MAX);
    DECLARE @declared NVARCHAR(MAX);
    SELECT @valid = j.valid, @config_error = j.config_error, @declared = COALESCE(j.params, N'{}') FROM agent.jobs AS j
    WHERE j.job_name = @job_name AND j.configured = 1;
    IF @valid IS NULL
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(@job_name, N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
        THROW 51404, @message, 1;
    END;
    IF @valid = 0
    BEGIN
        SET @message = @p + N'@job_name = ''' + @job_name + N''': expected a valid job; it is invalid: ' + COALESCE(@config_error, N'?');
        THROW 51409, @message, 1;
    END;
    DECLARE @given TABLE (name NVARCHAR(4000), value NVARCHAR(MAX), kind INT);
    IF @params IS NOT NULL
    BEGIN
        IF ISJSON(@params) = 0 OR LEFT(LTRIM(@params), 1) <> N'{'
        BEGIN
            SET @message = @p + N'@params = ''' + REPLACE(LEFT(@params, 80), N'''', N'''''')
                + N''': expected a JSON object {"name": "value", ...}';
            THROW 51401, @message, 1;
        END;
        INSERT INTO @given (name, value, kind) SELECT g.[key], g.[value], g.[type] FROM OPENJSON(@params) AS g;
    END;
    SELECT TOP (1) @bad = g.name FROM @given AS g
    WHERE NOT EXISTS (SELECT 1 FROM OPENJSON(@declared) AS d WHERE d.[key] = g.name);
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''') + N''': expected a parameter job '''
            + REPLACE(@job_name, N'''', N'''''') + N''' declares ('
            + COALESCE((SELECT STRING_AGG(CAST(d.[key] AS NVARCHAR(MAX)), N', ') FROM OPENJSON(@declared) AS d), N'none') + N')';
        THROW 51401, @message, 1;
    END;
    SELECT TOP (1) @bad = g.name FROM @given AS g GROUP BY g.name HAVING COUNT(*) > 1;
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''') + N''': expected each parameter given once';
        THROW 51401, @message, 1;
    END;
    SELECT TOP (1) @bad = g.name FROM @given AS g
    WHERE g.kind <> 1 OR LEN(g.value) > 1000000
       OR CHARINDEX(NCHAR(0) COLLATE Latin1_General_BIN2, g.value COLLATE Latin1_General_BIN2) > 0;
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''')
            + N''': expected a JSON string of at most 1000000 characters, without NUL (a value is text)';
        THROW 51401, @message, 1;
    END;
    SELECT TOP (1) @bad = d.[key] FROM OPENJSON(@declared) AS d
    WHERE d.[type] = 0 AND NOT EXISTS (SELECT 1 FROM @given AS g WHERE g.name = d.[key]);
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''') + N''': expected a value: job '''
            + REPLACE(@job_name, N'''', N'''''') + N''' declares it without a default';
        THROW 51401, @message, 1;
    END;
    -- The values under the declared spelling, the defaults filled in; NULL when the job declares none.
    DECLARE @values NVARCHAR(MAX) = (
        SELECT N'{' + STRING_AGG(CAST(N'"' + STRING_ESCAPE(d.[key], 'json') + N'":"'
                                      + STRING_ESCAPE(COALESCE(g.value, d.[value]), 'json') + N'"' AS NVARCHAR(MAX)), N',')
               + N'}'
        FROM OPENJSON(@declared) AS d LEFT JOIN @given AS g ON g.name = d.[key]);
    BEGIN TRANSACTION;
    -- The start lock as every engine start takes it (0011).
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
    DECLARE @manual TABLE (run_id BIGINT, status NVARCHAR(16), note NVARCHAR(MAX));
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                            max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                            finished_at, operation_id, note, steps, params)
    OUTPUT inserted.run_id, inserted.status, inserted.note INTO @manual
    SELECT j.job_name, N'manual', @now, d.decision, j.command, j.target_database,
           j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, @now, @now,
           CASE WHEN d.decision = N'skipped' THEN @now END,
           LOWER(REPLACE(CONVERT(NVARCHAR(36), NEWID()), N'-', N'')),
           CASE WHEN d.decision = N'skipped'
                THEN N'overlap: the previous run of this job was still in flight; policy skip'
                ELSE N'run-now' END,
           j.steps, @values
    FROM agent.jobs AS j
    CROSS APPLY (
        SELECT CASE WHEN j.overlap = N'skip' AND EXISTS (
                    SELECT 1 FROM agent.runs AS a
                    WHERE a.job_name = j.job_name
                      AND (a.status = N'running'
                           OR (a.status IN (N'pending', N'queued') AND (a.runnable_at <= @now OR a.kind = N'manual'))))
               THEN N'skipped' ELSE N'pending' END AS decision) AS d
    WHERE j.job_name = @job_name AND j.valid = 1 AND j.configured = 1;
    COMMIT TRANSACTION;
    SELECT m.run_id, m.status, m.note FROM @manual AS m;
END
GO

-- agent.set_job_params: the parameters a job defined from the database declares (a settings job
-- takes JOB__<name>__PARAMS__<k>__DEFAULT / __REQUIRED): @params a JSON object {"name": "default",
-- or null: no default}; NULL or {}: none. A redefinition by agent.add_scheduled_job keeps them.
CREATE PROCEDURE agent.set_job_params_unaudited
    @job_name NVARCHAR(4000),
    @params NVARCHAR(MAX)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.set_job_params: ';
    DECLARE @bad NVARCHAR(4000);
    DECLARE @declared TABLE (name NVARCHAR(4000), value NVARCHAR(MAX), kind INT);
    IF @params IS NOT NULL
    BEGIN
        IF ISJSON(@params) = 0 OR LEFT(LTRIM(@params), 1) <> N'{'
        BEGIN
            SET @message = @p + N'@params = ''' + REPLACE(LEFT(@params, 80), N'''', N'''''')
                + N''': expected a JSON object {"name": "default", or null for none}';
            THROW 51401, @message, 1;
        END;
        INSERT INTO @declared (name, value, kind) SELECT d.[key], d.[value], d.[type] FROM OPENJSON(@params) AS d;
    END;
    SELECT TOP (1) @bad = d.name FROM @declared AS d
    WHERE d.name = N'' OR LEN(d.name) > 63 OR d.name COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9_]%'
       OR LEFT(d.name, 1) COLLATE Latin1_General_BIN2 LIKE N'[0-9]' OR d.name IN (N'stmt', N'params');
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''')
            + N''': expected a parameter name: a letter or _, then letters, digits or _, at most 63 characters, not stmt or params';
        THROW 51401, @message, 1;
    END;
    SELECT TOP (1) @bad = d.name FROM @declared AS d GROUP BY d.name HAVING COUNT(*) > 1;
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''') + N''': expected names that differ by more than letter case';
        THROW 51401, @message, 1;
    END;
    SELECT TOP (1) @bad = d.name FROM @declared AS d
    WHERE d.kind NOT IN (0, 1) OR LEN(d.value) > 1000000
       OR CHARINDEX(NCHAR(0) COLLATE Latin1_General_BIN2, d.value COLLATE Latin1_General_BIN2) > 0;
    IF @bad IS NOT NULL
    BEGIN
        SET @message = @p + N'@params ''' + REPLACE(LEFT(@bad, 80), N'''', N'''''')
            + N''': expected a JSON string (the default, at most 1000000 characters, without NUL) or null (no default)';
        THROW 51401, @message, 1;
    END;
    IF (SELECT COUNT(*) FROM @declared) > 50
        THROW 51401, N'agent.set_job_params: @params: expected at most 50 parameters', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name AND j.configured = 1 AND j.defined_in_database = 1)
    BEGIN
        SET @message = @p + N'@job_name = ' + COALESCE(N'''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes JOB__<name>__PARAMS__<k>__DEFAULT or __REQUIRED)';
        THROW 51404, @message, 1;
    END;
    DECLARE @values NVARCHAR(MAX) = (
        SELECT N'{' + STRING_AGG(CAST(N'"' + STRING_ESCAPE(d.name, 'json') + N'":'
                                      + CASE WHEN d.kind = 0 THEN N'null'
                                             ELSE N'"' + STRING_ESCAPE(d.value, 'json') + N'"' END AS NVARCHAR(MAX)), N',')
               + N'}'
        FROM @declared AS d);
    UPDATE agent.jobs SET params = @values, updated_at = @now WHERE job_name = @job_name;
    SELECT @job_name AS job, @values AS declared;
END
GO

-- The audited procedure of the name (0017's way): the call and its audit row in one transaction; a
-- refused call recorded after the rollback.
ALTER PROCEDURE agent.start_job
    @job_name NVARCHAR(4000),
    @params NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name], LEFT(@params, 2000) AS [params]
                                               FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'run-now';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.start_job_unaudited @job_name = @job_name, @params = @params;
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

-- The audited procedure of the name (0017's way): the call and its audit row in one transaction; a
-- refused call recorded after the rollback.
CREATE PROCEDURE agent.set_job_params
    @job_name NVARCHAR(4000),
    @params NVARCHAR(MAX)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@job_name, 200) AS [job_name], LEFT(@params, 2000) AS [params]
                                               FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'set-params';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.set_job_params_unaudited @job_name = @job_name, @params = @params;
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
GRANT EXECUTE ON OBJECT::agent.set_job_params TO agent_operator;
