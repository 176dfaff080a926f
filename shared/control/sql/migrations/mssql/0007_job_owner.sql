-- 0007 jobs run as their owner (issue 23): a job defined from the database side records who
-- defined it, and the engine runs its SQL as that database user and no more, as SQL Server Agent
-- runs a job of a non-sysadmin owner (docs/guarantees-and-limits.md, "Jobs run as their owner").
--
-- owner: USER_NAME() of the caller of agent.exec_async / agent.add_scheduled_job, the database
-- user the caller is in this database (the procedures run as their caller: ownership chaining,
-- no EXECUTE AS). Not ORIGINAL_LOGIN(): the engine runs the job with EXECUTE AS USER, which needs
-- a database user, and a contained Entra ID user of Azure SQL Database has no server login; and a
-- caller inside EXECUTE AS USER holds that user's rights already, so recording it gives nothing
-- more. NULL for jobs and tasks from the app settings and the command line (the deployer's: they
-- run as the app's user or AGENT_JOB_PRINCIPAL). A run of a job takes its job's owner when it
-- executes; a task keeps its own.

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

ALTER TABLE agent.jobs ADD owner NVARCHAR(256) NULL;
ALTER TABLE agent.runs ADD owner NVARCHAR(256) NULL;
GO

-- agent.exec_async (0005) and agent.add_scheduled_job (0006), redefined: the same parameters,
-- checks and results, and the caller recorded as the owner (a redefinition takes the new caller).
ALTER PROCEDURE agent.exec_async
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
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @at DATETIME2(6) = CAST(SWITCHOFFSET(@run_at, '+00:00') AS DATETIME2(6));
    DECLARE @message NVARCHAR(2048);
    IF @sql IS NULL OR LTRIM(RTRIM(@sql)) = N''
    BEGIN
        SET @message = N'agent.exec_async: @sql = ' + COALESCE(N'''' + REPLACE(@sql, N'''', N'''''') + N'''', N'NULL')
            + N': expected the SQL to run (non-empty)';
        THROW 51401, @message, 1;
    END;
    IF @execution_order < 0
    BEGIN
        SET @message = N'agent.exec_async: @execution_order = ' + CONVERT(NVARCHAR(20), @execution_order)
            + N': expected NULL (no order) or a whole number from 0 (it starts once every task of a lower order has finished)';
        THROW 51401, @message, 1;
    END;
    IF @database IS NOT NULL AND (@database = N'' OR LEN(@database) > 128 OR @database COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9_-]%')
    BEGIN
        SET @message = N'agent.exec_async: @database = ''' + REPLACE(@database, N'''', N'''''')
            + N''': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF @max_attempts IS NULL OR @max_attempts NOT BETWEEN 1 AND 100
    BEGIN
        SET @message = N'agent.exec_async: @max_attempts = ' + COALESCE(CONVERT(NVARCHAR(20), @max_attempts), N'NULL')
            + N': expected a whole number from 1 to 100';
        THROW 51401, @message, 1;
    END;
    IF @timeout_seconds IS NULL OR @timeout_seconds NOT BETWEEN 1 AND 604800
    BEGIN
        SET @message = N'agent.exec_async: @timeout_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @timeout_seconds), N'NULL')
            + N': expected a whole number from 1 to 604800';
        THROW 51401, @message, 1;
    END;
    DECLARE @queued TABLE (run_id BIGINT);
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, task_order,
                            overlap, max_attempts, timeout_seconds, lease_seconds, runnable_at,
                            created_at, operation_id, note, owner)
    OUTPUT inserted.run_id INTO @queued
    VALUES (NULL, N'task', COALESCE(@at, @now), N'pending', @sql, @database, @execution_order, N'allow',
            @max_attempts, @timeout_seconds, 60, COALESCE(@at, @now), @now,
            LOWER(REPLACE(CONVERT(NVARCHAR(36), NEWID()), N'-', N'')), N'submitted', USER_NAME());
    SELECT @run_id = q.run_id FROM @queued AS q;
    SELECT @run_id AS run_id;
END
GO

ALTER PROCEDURE agent.add_scheduled_job
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
    @target_parallelism INT = 8
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.add_scheduled_job: ';
    IF @name IS NULL OR @name = N'' OR LEN(@name) > 64 OR @name COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9_.-]%'
    BEGIN
        SET @message = @p + N'@name = ' + COALESCE(N'''' + REPLACE(@name, N'''', N'''''') + N'''', N'NULL')
            + N': expected a job name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF @sql IS NULL OR LTRIM(RTRIM(@sql)) = N''
    BEGIN
        SET @message = @p + N'@sql = ' + COALESCE(N'''' + REPLACE(@sql, N'''', N'''''') + N'''', N'NULL')
            + N': expected the SQL to run (non-empty)';
        THROW 51401, @message, 1;
    END;
    IF @schedule IS NULL AND @run_at IS NULL
        THROW 51401, N'agent.add_scheduled_job: @schedule = NULL: expected a six-field NCRONTAB expression (seconds first), or @run_at for a one-time job', 1;
    IF @schedule IS NOT NULL AND @run_at IS NOT NULL
    BEGIN
        SET @message = @p + N'@run_at = ' + CONVERT(NVARCHAR(40), @run_at, 127)
            + N': expected NULL when @schedule is given (one or the other)';
        THROW 51401, @message, 1;
    END;
    IF @schedule IS NOT NULL AND (LTRIM(RTRIM(@schedule)) = N'' OR LEN(@schedule) > 400)
    BEGIN
        SET @message = @p + N'@schedule = ''' + REPLACE(LEFT(@schedule, 80), N'''', N'''''')
            + N''': expected a six-field NCRONTAB expression (seconds first) of at most 400 characters';
        THROW 51401, @message, 1;
    END;
    IF @timezone IS NULL OR @timezone = N'' OR LEN(@timezone) > 64 OR @timezone COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9_+/-]%'
    BEGIN
        SET @message = @p + N'@timezone = ' + COALESCE(N'''' + REPLACE(@timezone, N'''', N'''''') + N'''', N'NULL')
            + N': expected an IANA time zone name such as UTC or Europe/Paris';
        THROW 51401, @message, 1;
    END;
    IF @enabled IS NULL OR @enabled NOT IN (0, 1)
    BEGIN
        SET @message = @p + N'@enabled = ' + COALESCE(CONVERT(NVARCHAR(20), @enabled), N'NULL')
            + N': expected 1 (enabled) or 0 (disabled)';
        THROW 51401, @message, 1;
    END;
    IF @max_attempts IS NULL OR @max_attempts NOT BETWEEN 1 AND 100
    BEGIN
        SET @message = @p + N'@max_attempts = ' + COALESCE(CONVERT(NVARCHAR(20), @max_attempts), N'NULL')
            + N': expected a whole number from 1 to 100';
        THROW 51401, @message, 1;
    END;
    IF @timeout_seconds IS NULL OR @timeout_seconds NOT BETWEEN 1 AND 604800
    BEGIN
        SET @message = @p + N'@timeout_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @timeout_seconds), N'NULL')
            + N': expected a whole number from 1 to 604800';
        THROW 51401, @message, 1;
    END;
    IF @overlap IS NULL OR LOWER(@overlap) NOT IN (N'skip', N'queue', N'allow')
    BEGIN
        SET @message = @p + N'@overlap = ' + COALESCE(N'''' + REPLACE(@overlap, N'''', N'''''') + N'''', N'NULL')
            + N': expected skip, queue or allow';
        THROW 51401, @message, 1;
    END;
    IF @database IS NOT NULL AND (@database = N'' OR LEN(@database) > 128 OR @database COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9_-]%')
    BEGIN
        SET @message = @p + N'@database = ''' + REPLACE(@database, N'''', N'''''')
            + N''': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF @misfire IS NULL OR LOWER(@misfire) NOT IN (N'run-once', N'skip')
    BEGIN
        SET @message = @p + N'@misfire = ' + COALESCE(N'''' + REPLACE(@misfire, N'''', N'''''') + N'''', N'NULL')
            + N': expected run-once or skip';
        THROW 51401, @message, 1;
    END;
    IF @grace_seconds IS NULL OR @grace_seconds NOT BETWEEN 0 AND 31622400
    BEGIN
        SET @message = @p + N'@grace_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @grace_seconds), N'NULL')
            + N': expected a whole number from 0 to 31622400';
        THROW 51401, @message, 1;
    END;
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 6 AND 3600
    BEGIN
        SET @message = @p + N'@lease_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @lease_seconds), N'NULL')
            + N': expected a whole number from 6 to 3600';
        THROW 51401, @message, 1;
    END;
    IF @targets IS NOT NULL AND (LTRIM(RTRIM(@targets)) = N'' OR LEN(@targets) > 4000)
    BEGIN
        SET @message = @p + N'@targets = ''' + REPLACE(LEFT(@targets, 80), N'''', N'''''')
            + N''': expected NULL (one database) or a comma list of at most 4000 characters of members such as db:tenant_*, server:<server> or -db:<name>';
        THROW 51401, @message, 1;
    END;
    IF @targets IS NOT NULL AND @database IS NOT NULL
    BEGIN
        SET @message = @p + N'@database = ''' + REPLACE(@database, N'''', N'''''')
            + N''': expected NULL when @targets is given (a job runs in its @targets or in one @database, not both)';
        THROW 51401, @message, 1;
    END;
    IF @target_parallelism IS NULL OR @target_parallelism NOT BETWEEN 1 AND 1000
    BEGIN
        SET @message = @p + N'@target_parallelism = ' + COALESCE(CONVERT(NVARCHAR(20), @target_parallelism), N'NULL')
            + N': expected a whole number from 1 to 1000 (how many target databases of one run at once)';
        THROW 51401, @message, 1;
    END;
    DECLARE @stored_schedule NVARCHAR(400) = COALESCE(LTRIM(RTRIM(@schedule)),
        N'@once ' + CONVERT(NVARCHAR(30), CAST(SWITCHOFFSET(@run_at, '+00:00') AS DATETIME2(6)), 126) + N'+00:00');
    DECLARE @action NVARCHAR(16) = N'defined';
    BEGIN TRANSACTION;
    -- The job-definitions lock: the settings sync and these procedures decide names one at a time.
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.add_scheduled_job: the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
    DECLARE @existing NVARCHAR(64);
    DECLARE @existing_in_database SMALLINT;
    DECLARE @existing_configured SMALLINT;
    -- The default collation compares names case-insensitively, as the settings do.
    SELECT @existing = j.job_name, @existing_in_database = j.defined_in_database, @existing_configured = j.configured
    FROM agent.jobs AS j WHERE j.job_name = @name;
    IF @existing IS NOT NULL AND CAST(@existing AS VARBINARY(128)) <> CAST(@name AS VARBINARY(128))
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a name no other job holds; it differs only by case from job '''
            + @existing + N''' (job names are compared case-insensitively, as Azure SQL does)';
        THROW 51409, @message, 1;
    END;
    IF @existing IS NOT NULL AND @existing_in_database = 0 AND @existing_configured = 1
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a job defined in the database; this job is defined in the app settings (JOB__'
            + @name + N'__*): change or remove it there';
        THROW 51409, @message, 1;
    END;
    IF @existing IS NOT NULL AND @existing_configured = 1
        SET @action = N'redefined';
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE job_name = @name AND kind = N'scheduled' AND status IN (N'pending', N'queued');
    IF @existing IS NOT NULL
        UPDATE agent.jobs SET schedule = @stored_schedule, timezone = @timezone, command = @sql,
            target_database = @database, enabled = @enabled, valid = 1, config_error = NULL,
            max_attempts = @max_attempts, timeout_seconds = @timeout_seconds, lease_seconds = @lease_seconds,
            misfire = LOWER(@misfire), grace_seconds = @grace_seconds, overlap = LOWER(@overlap),
            next_due_at = NULL, advanced_at = NULL, configured = 1, updated_at = @now,
            defined_in_database = 1, needs_planning = 1, steps = NULL,
            requested_targets = LTRIM(RTRIM(@targets)), requested_target_parallelism = @target_parallelism,
            owner = USER_NAME()
        WHERE job_name = @name;
    ELSE
        INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                                config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                defined_in_database, needs_planning, steps, requested_targets,
                                requested_target_parallelism, owner)
        VALUES (@name, @stored_schedule, @timezone, @sql, @database, @enabled, 1, NULL, @max_attempts,
                @timeout_seconds, @lease_seconds, LOWER(@misfire), @grace_seconds, LOWER(@overlap), NULL, NULL, 1,
                @now, 1, 1, NULL, LTRIM(RTRIM(@targets)), @target_parallelism, USER_NAME());
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @action AS action;
END
GO
