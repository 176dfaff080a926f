-- 0022 overlap policies buffer-one and cancel-previous (issue 33 item 5); see the PostgreSQL file
-- of the same number. dispatch_runs, claim_runs and start_run are named queries in this dialect
-- (shared/control/sql/mssql.sql); here agent.add_scheduled_job's @overlap (its body,
-- agent.add_scheduled_job_unaudited: 0012's procedure, renamed by 0017) accepts both names, and
-- @target_stagger_seconds.
-- agent.jobs.catchup_seconds: JOB__<name>__CATCHUP_SECONDS (0: none).
ALTER TABLE agent.jobs ADD catchup_seconds INT NOT NULL CONSTRAINT jobs_catchup_seconds_default DEFAULT 0;
GO
-- agent.jobs.requested_target_stagger_seconds: agent.add_scheduled_job's @target_stagger_seconds
-- (TARGET_STAGGER_SECONDS of a fleet job defined from T-SQL), planned into its fleet step.
ALTER TABLE agent.jobs ADD requested_target_stagger_seconds INT NULL;
GO
-- agent.runs.kind 'backfill': a run `sql-agent backfill` made for a slot of a past window.
ALTER TABLE agent.runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN (N'scheduled', N'manual', N'task', N'target', N'backfill'));
GO

ALTER PROCEDURE agent.add_scheduled_job_unaudited
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
    @after_outcome NVARCHAR(4000) = N'succeeded',
    @target_stagger_seconds INT = 0
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.add_scheduled_job: ';
    IF @name IS NULL OR @name = N'' OR LEN(@name) > 64 OR @name COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%'
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
    IF @timezone IS NULL OR @timezone = N'' OR LEN(@timezone) > 64 OR @timezone COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_+/]%'
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
    IF @overlap IS NULL OR LOWER(@overlap) NOT IN (N'skip', N'queue', N'allow', N'buffer-one', N'cancel-previous')
    BEGIN
        SET @message = @p + N'@overlap = ' + COALESCE(N'''' + REPLACE(@overlap, N'''', N'''''') + N'''', N'NULL')
            + N': expected skip, queue, allow, buffer-one or cancel-previous';
        THROW 51401, @message, 1;
    END;
    IF @database IS NOT NULL AND (@database = N'' OR LEN(@database) > 128 OR @database COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_]%')
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
    IF @target_stagger_seconds IS NULL OR @target_stagger_seconds NOT BETWEEN 0 AND 3600
    BEGIN
        SET @message = @p + N'@target_stagger_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @target_stagger_seconds), N'NULL')
            + N': expected a whole number from 0 to 3600 (execution n of a run starts (n - 1) times this many seconds after the fan-out; 0: as the window lets them in)';
        THROW 51401, @message, 1;
    END;
    IF @after IS NOT NULL AND (@after = N'' OR LEN(@after) > 64 OR @after COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%')
    BEGIN
        SET @message = @p + N'@after = ''' + REPLACE(LEFT(@after, 80), N'''', N'''''')
            + N''': expected NULL (a job that follows no job) or the name of the job whose runs start this one';
        THROW 51401, @message, 1;
    END;
    IF @after_outcome IS NULL OR LOWER(@after_outcome) NOT IN (N'succeeded', N'failed', N'completed')
    BEGIN
        SET @message = @p + N'@after_outcome = ' + COALESCE(N'''' + REPLACE(LEFT(@after_outcome, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected succeeded, failed or completed';
        THROW 51401, @message, 1;
    END;
    -- Neither @schedule nor @run_at: an on-demand job (an empty schedule, as a settings job
    -- without SCHEDULE): it claims no slot and runs when started (agent.start_job).
    DECLARE @stored_schedule NVARCHAR(400) = COALESCE(LTRIM(RTRIM(@schedule)),
        N'@once ' + STUFF(CONVERT(NVARCHAR(30), CAST(SWITCHOFFSET(@run_at, '+00:00') AS DATETIME2(6)), 126), 11, 1, N'T')
            + N'+00:00',
        N'');
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
    -- @after: no cycle, checked first (a job that follows itself need not exist yet); then a job
    -- that exists now (from the settings or from here), by its name as written; then the chain of
    -- jobs it follows, walked up from it one job at a time through every job defined now (either
    -- source, enabled or not), never reaches a job that follows this one's name, whether or not a
    -- job of that name exists now (it was removed, and this call defines it again). The default
    -- collation compares names case-insensitively; the walk visits each job once at most, with no
    -- recursion limit (a recursive CTE stops at 100 levels by default).
    DECLARE @leader NVARCHAR(64);
    DECLARE @cycle NVARCHAR(MAX);
    IF @after IS NOT NULL AND @after = @name
    BEGIN
        SET @message = @p + N'@after = ''' + @after
            + N''': expected a chain that ends; this one is a cycle of jobs that follow each other ('
            + @name + N' -> ' + @name + N': a run of each would start the next, forever)';
        THROW 51401, @message, 1;
    END;
    IF @after IS NOT NULL
    BEGIN
        SELECT @leader = j.job_name FROM agent.jobs AS j WHERE j.job_name = @after AND j.configured = 1;
        IF @leader IS NULL
        BEGIN
            SET @message = @p + N'@after = ''' + @after
                + N''': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
            THROW 51401, @message, 1;
        END;
        DECLARE @walk TABLE (ord INT PRIMARY KEY, job_name NVARCHAR(64));
        DECLARE @current NVARCHAR(64) = @leader;
        DECLARE @found NVARCHAR(64);
        DECLARE @up NVARCHAR(64);
        DECLARE @steps INT = 0;
        DECLARE @closed INT = 0;
        WHILE @current IS NOT NULL AND @closed = 0
        BEGIN
            SET @found = NULL;
            SET @up = NULL;
            SELECT @found = j.job_name, @up = j.after_job FROM agent.jobs AS j
            WHERE j.job_name = @current AND j.configured = 1;
            IF @found IS NULL
                BREAK;
            SET @steps = @steps + 1;
            INSERT INTO @walk (ord, job_name) VALUES (@steps, @found);
            IF @up = @name
                SET @closed = 1;
            ELSE IF @up IS NULL OR EXISTS (SELECT 1 FROM @walk AS w WHERE w.job_name = @up)
                SET @current = NULL;
            ELSE
                SET @current = @up;
        END;
        IF @closed = 1
        BEGIN
            -- In the order runs start each other (the walk reversed); a long cycle shows its first
            -- and last four jobs and how many between (shared/jobs/chains.py, show_chain). Put
            -- together by position (Babelfish refuses STRING_AGG ... WITHIN GROUP): the last
            -- four walked, then the first four (for 8 jobs or fewer, the ones below them).
            DECLARE @long INT = CASE WHEN @steps > 8 THEN 1 ELSE 0 END;
            SELECT @cycle = CONCAT(
                       MAX(CASE WHEN w.ord = @steps THEN w.job_name END),
                       MAX(CASE WHEN w.ord = @steps - 1 THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = @steps - 2 THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = @steps - 3 THEN N' -> ' + w.job_name END),
                       CASE WHEN @long = 1 THEN N' -> ... (' + CONVERT(NVARCHAR(20), @steps - 8) + N' more)' END,
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 4 ELSE @steps - 4 END THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 3 ELSE @steps - 5 END THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 2 ELSE @steps - 6 END THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 1 ELSE @steps - 7 END THEN N' -> ' + w.job_name END))
            FROM @walk AS w;
            SET @message = @p + N'@after = ''' + @after
                + N''': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                + @name + N' -> ' + @cycle + N' -> ' + @name + N': a run of each would start the next, forever)';
            THROW 51401, @message, 1;
        END;
    END;
    -- The slots claimed under the old definition, those a pause recorded skipped ahead included
    -- (a resume must not bring back a slot of a schedule that is gone).
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE job_name = @name AND kind = N'scheduled'
      AND (status IN (N'pending', N'queued')
           OR (status = N'skipped' AND note = N'paused' AND attempt = 0 AND scheduled_for >= @now));
    -- A settings job refused because its AFTER closed a cycle through this job may be valid now:
    -- the next tick syncs the settings again.
    DELETE FROM agent.state WHERE state_key = N'job_config_hash';
    IF @existing IS NOT NULL
        UPDATE agent.jobs SET schedule = @stored_schedule, timezone = @timezone, command = @sql,
            target_database = @database, enabled = @enabled, valid = 1, config_error = NULL,
            max_attempts = @max_attempts, timeout_seconds = @timeout_seconds, lease_seconds = @lease_seconds,
            misfire = LOWER(@misfire), grace_seconds = @grace_seconds, overlap = LOWER(@overlap),
            next_due_at = NULL, advanced_at = NULL, configured = 1, updated_at = @now,
            defined_in_database = 1, needs_planning = 1, steps = NULL,
            requested_targets = LTRIM(RTRIM(@targets)), requested_target_parallelism = @target_parallelism,
            owner = USER_NAME(), after_job = @leader,
            after_outcome = CASE WHEN @leader IS NOT NULL THEN LOWER(@after_outcome) END,
            requested_target_stagger_seconds = NULLIF(@target_stagger_seconds, 0)
        WHERE job_name = @name;
    ELSE
        INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                                config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                defined_in_database, needs_planning, steps, requested_targets,
                                requested_target_parallelism, owner, after_job, after_outcome,
                                requested_target_stagger_seconds)
        VALUES (@name, @stored_schedule, @timezone, @sql, @database, @enabled, 1, NULL, @max_attempts,
                @timeout_seconds, @lease_seconds, LOWER(@misfire), @grace_seconds, LOWER(@overlap), NULL, NULL, 1,
                @now, 1, 1, NULL, LTRIM(RTRIM(@targets)), @target_parallelism, USER_NAME(),
                @leader, CASE WHEN @leader IS NOT NULL THEN LOWER(@after_outcome) END,
                NULLIF(@target_stagger_seconds, 0));
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @action AS action;
END
GO

-- agent.remove_scheduled_job (its body, agent.remove_scheduled_job_unaudited, since 0017): the
-- job's backfill runs not yet started are skipped with its slots claimed ahead.
ALTER PROCEDURE agent.remove_scheduled_job_unaudited
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
    WHERE job_name = @name AND kind IN (N'scheduled', N'backfill')
      AND (status IN (N'pending', N'queued')
           OR (status = N'skipped' AND note = N'paused' AND attempt = 0 AND scheduled_for >= @now));
    DECLARE @skipped INT = @@ROWCOUNT;
    UPDATE agent.jobs SET configured = 0, next_due_at = NULL, needs_planning = 0, updated_at = @now
    WHERE job_name = @name;
    DELETE FROM agent.state WHERE state_key = N'job_config_hash';
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @skipped AS skipped_runs;
END
GO

-- agent.add_scheduled_job (0017's audited procedure) passes @target_stagger_seconds on.
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
    @target_parallelism INT = 8,
    @after NVARCHAR(4000) = NULL,
    @after_outcome NVARCHAR(4000) = N'succeeded',
    @target_stagger_seconds INT = 0
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @caller_transactions INT = @@TRANCOUNT;
    DECLARE @audit_arguments NVARCHAR(MAX) = (SELECT LEFT(@name, 200) AS [name], LEFT(@sql, 2000) AS [sql], LEFT(@schedule, 200) AS [schedule], @run_at AS [run_at], LEFT(@timezone, 100) AS [timezone], @enabled AS [enabled], @max_attempts AS [max_attempts], @timeout_seconds AS [timeout_seconds], LEFT(@overlap, 20) AS [overlap], LEFT(@database, 200) AS [database], LEFT(@misfire, 20) AS [misfire], @grace_seconds AS [grace_seconds], @lease_seconds AS [lease_seconds], LEFT(@targets, 400) AS [targets], @target_parallelism AS [target_parallelism], LEFT(@after, 400) AS [after], LEFT(@after_outcome, 20) AS [after_outcome], @target_stagger_seconds AS [target_stagger_seconds] FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    DECLARE @audit_action NVARCHAR(32) = N'define';
    DECLARE @audit_error NVARCHAR(2000);
    BEGIN TRY
        BEGIN TRANSACTION;
        EXEC agent.add_scheduled_job_unaudited @name = @name, @sql = @sql, @schedule = @schedule, @run_at = @run_at, @timezone = @timezone, @enabled = @enabled, @max_attempts = @max_attempts, @timeout_seconds = @timeout_seconds, @overlap = @overlap, @database = @database, @misfire = @misfire, @grace_seconds = @grace_seconds, @lease_seconds = @lease_seconds, @targets = @targets, @target_parallelism = @target_parallelism, @after = @after, @after_outcome = @after_outcome, @target_stagger_seconds = @target_stagger_seconds;
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
