-- 0005 T-SQL interface: jobs defined in the database, the seeds' procedures, SQL Server Agent's
-- verbs and history views, and the agent_operator role (issue 14). PostgreSQL has functions of
-- the same names, parameters, defaults and results (shared/control/sql/migrations/postgres).
--
-- The procedures take time from the server clock (SYSUTCDATETIME), validate every argument
-- before they change anything (one message: the procedure, the parameter, the value, what is
-- expected) and never build dynamic SQL: the SQL they queue is stored as given and run later by
-- the engine, as the app's database user (or AGENT_JOB_PRINCIPAL), like a SQL Server Agent job
-- owned by the agent. Names are checked under a binary collation (in the database's, a range such
-- as A-Z also holds accented letters the engine refuses). THROW 51401 (bad argument), 51404 (no such job, run or poison message),
-- 51409 (the object is not in a state that allows it). Each module is a batch of its own (it
-- runs to the next GO line; shared/control/queries.py keeps it whole). agent_operator executes the
-- procedures and reads the views through ownership chaining, without any right on the tables.

SET XACT_ABORT ON;

-- Where a job is defined: 0 the app settings (JOB__<name>__*), 1 agent.add_scheduled_job.
ALTER TABLE agent.jobs ADD defined_in_database SMALLINT NOT NULL CONSTRAINT jobs_defined_in_database_default DEFAULT 0;
-- A job defined or changed in the database waits for the engine to check its schedule and time
-- zone and compute its first slot (a procedure cannot read NCRONTAB): every tick, doorbell and
-- local-runner poll looks for these with one indexed query.
ALTER TABLE agent.jobs ADD needs_planning SMALLINT NOT NULL CONSTRAINT jobs_needs_planning_default DEFAULT 0;
GO
CREATE INDEX jobs_needs_planning ON agent.jobs (needs_planning) WHERE needs_planning = 1;
GO

-- agent.exec_async: queue ad-hoc SQL exactly as `submit` does (the insert_task row); returns its
-- run id as a row and in @run_id OUTPUT (callable from inside any procedure).
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
                            created_at, operation_id, note)
    OUTPUT inserted.run_id INTO @queued
    VALUES (NULL, N'task', COALESCE(@at, @now), N'pending', @sql, @database, @execution_order, N'allow',
            @max_attempts, @timeout_seconds, 60, COALESCE(@at, @now), @now,
            LOWER(REPLACE(CONVERT(NVARCHAR(36), NEWID()), N'-', N'')), N'submitted');
    SELECT @run_id = q.run_id FROM @queued AS q;
    SELECT @run_id AS run_id;
END
GO

-- agent.add_scheduled_job: define (or redefine) a job in the database. The engine checks the
-- schedule and time zone and plans its first slot (needs_planning); slots of the previous
-- definition claimed ahead are recorded skipped.
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
    @lease_seconds INT = 60
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
            defined_in_database = 1, needs_planning = 1
        WHERE job_name = @name;
    ELSE
        INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                                config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                defined_in_database, needs_planning)
        VALUES (@name, @stored_schedule, @timezone, @sql, @database, @enabled, 1, NULL, @max_attempts,
                @timeout_seconds, @lease_seconds, LOWER(@misfire), @grace_seconds, LOWER(@overlap), NULL, NULL, 1,
                @now, 1, 1);
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @action AS action;
END
GO

-- agent.remove_scheduled_job: the job stops (its slots claimed ahead are recorded skipped); its
-- history stays. The settings hash is cleared: a settings job held off by this name syncs at the next tick.
CREATE PROCEDURE agent.remove_scheduled_job
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.remove_scheduled_job: ';
    IF @name IS NULL
        THROW 51401, N'agent.remove_scheduled_job: @name = NULL: expected the name of a job defined by agent.add_scheduled_job', 1;
    BEGIN TRANSACTION;
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.remove_scheduled_job: the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
    DECLARE @existing_in_database SMALLINT;
    SELECT @existing_in_database = j.defined_in_database FROM agent.jobs AS j WHERE j.job_name = @name AND j.configured = 1;
    IF @existing_in_database IS NULL
    BEGIN
        SET @message = @p + N'@name = ''' + REPLACE(@name, N'''', N'''''')
            + N''': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
        THROW 51404, @message, 1;
    END;
    IF @existing_in_database = 0
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a job defined in the database; this job is defined in the app settings (JOB__'
            + @name + N'__*): remove it there';
        THROW 51409, @message, 1;
    END;
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job was removed by agent.remove_scheduled_job after this slot was claimed'
    WHERE job_name = @name AND kind = N'scheduled' AND status IN (N'pending', N'queued');
    DECLARE @skipped INT = @@ROWCOUNT;
    UPDATE agent.jobs SET configured = 0, next_due_at = NULL, needs_planning = 0, updated_at = @now
    WHERE job_name = @name;
    DELETE FROM agent.state WHERE state_key = N'job_config_hash';
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @skipped AS skipped_runs;
END
GO

-- agent.enable_job: enable or disable a job defined in the database. Disabling records its slots
-- claimed ahead skipped; enabling plans it again from now.
CREATE PROCEDURE agent.enable_job
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
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.enable_job: the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
    DECLARE @existing_in_database SMALLINT;
    DECLARE @existing_enabled SMALLINT;
    SELECT @existing_in_database = j.defined_in_database, @existing_enabled = j.enabled
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
    IF @existing_enabled <> @enabled
    BEGIN
        UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
            note = N'skipped: the job was disabled by agent.enable_job after this slot was claimed'
        WHERE job_name = @name AND kind = N'scheduled' AND status IN (N'pending', N'queued');
        SET @skipped = @@ROWCOUNT;
        UPDATE agent.jobs SET enabled = @enabled, needs_planning = @enabled, next_due_at = NULL,
            advanced_at = NULL, updated_at = @now
        WHERE job_name = @name;
    END;
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @skipped AS skipped_runs;
END
GO

-- agent.start_job: the run `run-now` makes (the insert_manual_run row), under the start lock, with
-- the job's overlap policy.
CREATE PROCEDURE agent.start_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.start_job: ';
    IF @job_name IS NULL
        THROW 51401, N'agent.start_job: @job_name = NULL: expected the name of a job', 1;
    DECLARE @valid SMALLINT;
    DECLARE @config_error NVARCHAR(MAX);
    SELECT @valid = j.valid, @config_error = j.config_error FROM agent.jobs AS j
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
    BEGIN TRANSACTION;
    DECLARE @locked INT;
    SELECT @locked = COUNT(*) FROM agent.start_lock WITH (TABLOCKX, HOLDLOCK);
    DECLARE @manual TABLE (run_id BIGINT, status NVARCHAR(16), note NVARCHAR(MAX));
    INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, target_database, overlap,
                            max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at,
                            finished_at, operation_id, note, steps)
    OUTPUT inserted.run_id, inserted.status, inserted.note INTO @manual
    SELECT j.job_name, N'manual', @now, d.decision, j.command, j.target_database,
           j.overlap, j.max_attempts, j.timeout_seconds, j.lease_seconds, @now, @now,
           CASE WHEN d.decision = N'skipped' THEN @now END,
           LOWER(REPLACE(CONVERT(NVARCHAR(36), NEWID()), N'-', N'')),
           CASE WHEN d.decision = N'skipped'
                THEN N'overlap: the previous run of this job was still in flight; policy skip'
                ELSE N'run-now' END,
           j.steps
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

-- agent.stop_job: cancel the job's runs in flight (running, or due and not yet started) as
-- `cancel` does each; slots that have not come stay.
CREATE PROCEDURE agent.stop_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    IF @job_name IS NULL
        THROW 51401, N'agent.stop_job: @job_name = NULL: expected the name of a job', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name)
    BEGIN
        SET @message = N'agent.stop_job: @job_name = ''' + REPLACE(@job_name, N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job';
        THROW 51404, @message, 1;
    END;
    DECLARE @cancelled TABLE (cancelled_run_id BIGINT);
    UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = @now,
        lease_expires_at = NULL, note = N'cancelled by operator'
    OUTPUT inserted.run_id INTO @cancelled
    WHERE job_name = @job_name
      AND (status = N'running' OR (status IN (N'pending', N'queued') AND runnable_at <= @now));
    SELECT c.cancelled_run_id FROM @cancelled AS c;
END
GO

-- agent.cancel_run: what `cancel` does (the cancel_run row change).
CREATE PROCEDURE agent.cancel_run
    @run_id BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    IF @run_id IS NULL
        THROW 51401, N'agent.cancel_run: @run_id = NULL: expected the id of a run', 1;
    DECLARE @cancelled TABLE (cancelled_run_id BIGINT);
    UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = @now,
        lease_expires_at = NULL, note = N'cancelled by operator'
    OUTPUT inserted.run_id INTO @cancelled
    WHERE run_id = @run_id AND status IN (N'pending', N'queued', N'running');
    IF NOT EXISTS (SELECT 1 FROM @cancelled)
    BEGIN
        DECLARE @status NVARCHAR(16);
        SELECT @status = r.status FROM agent.runs AS r WHERE r.run_id = @run_id;
        IF @status IS NULL
        BEGIN
            SET @message = N'agent.cancel_run: @run_id = ' + CONVERT(NVARCHAR(20), @run_id)
                + N': expected the id of a run; there is no such run';
            THROW 51404, @message, 1;
        END;
        SET @message = N'agent.cancel_run: @run_id = ' + CONVERT(NVARCHAR(20), @run_id)
            + N': expected a run not yet finished; it is already ' + @status;
        THROW 51409, @message, 1;
    END;
    SELECT c.cancelled_run_id FROM @cancelled AS c;
END
GO

-- agent.requeue_poison: what `poison requeue` does (requeue_run, then mark_poison_requeued).
CREATE PROCEDURE agent.requeue_poison
    @poison_id BIGINT
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.requeue_poison: ';
    IF @poison_id IS NULL
        THROW 51401, N'agent.requeue_poison: @poison_id = NULL: expected the id of a poison message (agent.poison_list)', 1;
    DECLARE @found INT = 0;
    DECLARE @run BIGINT;
    DECLARE @reason NVARCHAR(MAX);
    SELECT @found = 1, @run = m.run_id, @reason = m.reason FROM agent.poison_messages AS m WHERE m.poison_id = @poison_id;
    IF @found = 0
    BEGIN
        SET @message = @p + N'@poison_id = ' + CONVERT(NVARCHAR(20), @poison_id)
            + N': expected the id of a poison message (agent.poison_list); there is no such message';
        THROW 51404, @message, 1;
    END;
    IF @run IS NULL
    BEGIN
        SET @message = @p + N'@poison_id = ' + CONVERT(NVARCHAR(20), @poison_id)
            + N': expected a message of a run; it belongs to no run (it was malformed: ' + @reason + N'), nothing to requeue';
        THROW 51409, @message, 1;
    END;
    BEGIN TRANSACTION;
    DECLARE @requeued TABLE (requeued_run_id BIGINT);
    UPDATE agent.runs SET status = N'pending', runnable_at = @now, finished_at = NULL,
        lease_expires_at = NULL, max_attempts = failures + 1, lapses = 0, transient_errors = 0,
        note = N'requeued by operator'
    OUTPUT inserted.run_id INTO @requeued
    WHERE run_id = @run AND status IN (N'poisoned', N'failed');
    IF NOT EXISTS (SELECT 1 FROM @requeued)
    BEGIN
        DECLARE @status NVARCHAR(16);
        SELECT @status = r.status FROM agent.runs AS r WHERE r.run_id = @run;
        SET @message = @p + N'@poison_id = ' + CONVERT(NVARCHAR(20), @poison_id)
            + N': expected a poisoned or failed run; run ' + CONVERT(NVARCHAR(20), @run) + N' is ' + COALESCE(@status, N'gone');
        THROW 51409, @message, 1;
    END;
    UPDATE agent.poison_messages SET requeued_at = @now WHERE poison_id = @poison_id;
    COMMIT TRANSACTION;
    SELECT q.requeued_run_id FROM @requeued AS q;
END
GO

-- Views (SQL Server Agent's sysjobactivity, sysjobhistory; `poison list`; `stuck`).

-- One row per job: where it is defined, its state, next slot, the run in flight and the last outcome.
CREATE VIEW agent.job_activity AS
SELECT j.job_name,
       CASE WHEN j.defined_in_database = 1 THEN N'database' ELSE N'settings' END AS defined_in,
       CASE WHEN j.configured = 0 THEN N'removed' WHEN j.valid = 0 THEN N'invalid'
            WHEN j.enabled = 0 THEN N'disabled' WHEN j.needs_planning = 1 THEN N'planning'
            WHEN c.run_id IS NOT NULL THEN N'running'
            WHEN j.next_due_at IS NULL AND n.next_slot IS NULL THEN N'idle' ELSE N'scheduled' END AS state,
       j.enabled, j.schedule, j.timezone, COALESCE(n.next_slot, j.next_due_at) AS next_run_at,
       c.run_id AS running_run_id, c.started_at AS running_since, c.worker AS running_worker,
       l.run_id AS last_run_id, l.status AS last_outcome, l.finished_at AS last_finished_at,
       l.last_error AS last_error, j.config_error
FROM agent.jobs AS j
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
    ORDER BY r.scheduled_for DESC, r.run_id DESC) AS l
GO

-- One row per attempt, plus one for each run that ended without an attempt (a skipped slot, a
-- run cancelled before it started). job_name NULL: an ad-hoc task (exec_async, submit).
CREATE VIEW agent.job_history AS
SELECT r.run_id, a.attempt, r.job_name, r.kind, r.scheduled_for, a.started_at, a.finished_at,
       DATEDIFF_BIG(MILLISECOND, a.started_at, a.finished_at) AS duration_ms,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.worker, r.note
FROM agent.attempts AS a
JOIN agent.runs AS r ON r.run_id = a.run_id
UNION ALL
SELECT r.run_id, NULL, r.job_name, r.kind, r.scheduled_for, r.started_at, r.finished_at, NULL,
       r.status, r.last_error_number, NULL, r.last_error, r.worker, r.note
FROM agent.runs AS r
WHERE r.status IN (N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled')
  AND NOT EXISTS (SELECT 1 FROM agent.attempts AS x WHERE x.run_id = r.run_id)
GO

-- Poison messages with their run (the table agent.poison_messages keeps the name; this is its view).
CREATE VIEW agent.poison_list AS
SELECT m.poison_id, m.run_id, r.job_name, r.status AS run_status, m.message_id, m.dequeue_count, m.reason,
       m.errors, m.poisoned_at, m.requeued_at
FROM agent.poison_messages AS m
LEFT JOIN agent.runs AS r ON r.run_id = m.run_id
GO

-- `stuck`'s reconciliation at the server's time: in flight past the lease, or runnable and not
-- started for more than 600 s (the command's default --older-than).
CREATE VIEW agent.stuck_runs AS
SELECT r.run_id, r.job_name, r.kind, r.status, r.scheduled_for, r.runnable_at, r.lease_expires_at, r.token, r.attempt,
       CASE WHEN r.status IN (N'queued', N'running') THEN N'lease expired' ELSE N'waiting over 600 s' END AS reason
FROM agent.runs AS r
WHERE (r.status IN (N'queued', N'running') AND r.lease_expires_at < SYSUTCDATETIME())
   OR (r.status = N'pending' AND r.runnable_at < DATEADD(SECOND, -600, SYSUTCDATETIME()))
GO

-- Least privilege: agent_operator executes the procedures and reads the views, nothing else.
IF DATABASE_PRINCIPAL_ID(N'agent_operator') IS NULL CREATE ROLE agent_operator;
GRANT EXECUTE ON OBJECT::agent.exec_async TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.add_scheduled_job TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.remove_scheduled_job TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.enable_job TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.start_job TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.stop_job TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.cancel_run TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.requeue_poison TO agent_operator;
GRANT SELECT ON agent.job_activity TO agent_operator;
GRANT SELECT ON agent.job_history TO agent_operator;
GRANT SELECT ON agent.poison_list TO agent_operator;
GRANT SELECT ON agent.stuck_runs TO agent_operator;
