-- 0006 fleet jobs: one step across many databases (Elastic Jobs' target groups). A run of a
-- fleet step creates one execution per target database: a run of its own (kind 'target',
-- parent_run_id), with its own token, lease, attempts and poison handling. The run waits for
-- them (awaiting_targets = 1: status running, no lease, no worker slot) and follows its flow
-- when the last one ends.
-- Each statement runs on its own, in the one transaction of the migration.
SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

-- An execution: its run and that run's token when it fanned out (a later visit of the same step
-- is a new set), its server (NULL: the agent's own) and its step's retry interval.
ALTER TABLE agent.runs ADD parent_run_id BIGINT NULL;
ALTER TABLE agent.runs ADD parent_token BIGINT NULL;
ALTER TABLE agent.runs ADD target_server NVARCHAR(256) NULL;
ALTER TABLE agent.runs ADD retry_interval_seconds INT NULL;
-- The run of a fleet step while its executions run: how many at once, where its flow goes when
-- they all succeeded / when any failed (a step number; 0 quits with success, -1 with failure),
-- and the run's target counts (every fleet step of the run, added up).
ALTER TABLE agent.runs ADD awaiting_targets SMALLINT NOT NULL CONSTRAINT runs_awaiting_targets_default DEFAULT 0;
ALTER TABLE agent.runs ADD target_parallelism INT NULL;
ALTER TABLE agent.runs ADD next_step_on_success INT NULL;
ALTER TABLE agent.runs ADD next_step_on_failure INT NULL;
ALTER TABLE agent.runs ADD targets_total INT NULL;
ALTER TABLE agent.runs ADD targets_failed INT NULL;

-- 'waiting': an execution not yet let in by its run's TARGET_PARALLELISM; 'target': an execution.
ALTER TABLE agent.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE agent.runs ADD CONSTRAINT runs_status_check CHECK (status IN (
    N'pending', N'queued', N'running', N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled', N'waiting'));
ALTER TABLE agent.runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE agent.runs ADD CONSTRAINT runs_kind_check CHECK (kind IN (N'scheduled', N'manual', N'task', N'target'));

-- A run's executions by state (the window, the end of the step); the runs waiting for theirs.
CREATE INDEX runs_parent ON agent.runs (parent_run_id, parent_token, status) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_awaiting_targets ON agent.runs (run_id) WHERE awaiting_targets = 1;
GO

-- agent.cancel_run and agent.stop_job (0005) as `cancel` and `stop` do with fleets: a run waiting
-- for its targets ends with its executions in the same transaction (not at the next tick), and
-- an execution not yet let in ('waiting') can be cancelled on its own (it counts as a failed
-- target). ALTER PROCEDURE keeps the grants of 0005. The runs are updated first, then their
-- executions: the order progress_fleets takes them in.
ALTER PROCEDURE agent.stop_job
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
    BEGIN TRANSACTION;
    UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = @now,
        lease_expires_at = NULL, note = N'cancelled by operator'
    OUTPUT inserted.run_id INTO @cancelled
    WHERE job_name = @job_name
      AND (status = N'running' OR (status IN (N'pending', N'queued') AND runnable_at <= @now));
    UPDATE c SET status = N'cancelled', token = c.token + 1, finished_at = @now, lease_expires_at = NULL,
        note = N'cancelled: its run no longer waits for its targets'
    FROM agent.runs AS c JOIN @cancelled AS d ON c.parent_run_id = d.cancelled_run_id
    WHERE c.status IN (N'waiting', N'pending', N'queued', N'running');
    UPDATE p SET awaiting_targets = 0
    FROM agent.runs AS p JOIN @cancelled AS d ON p.run_id = d.cancelled_run_id
    WHERE p.awaiting_targets = 1;
    COMMIT TRANSACTION;
    SELECT c.cancelled_run_id FROM @cancelled AS c;
END
GO

ALTER PROCEDURE agent.cancel_run
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
    BEGIN TRANSACTION;
    UPDATE agent.runs SET status = N'cancelled', token = token + 1, finished_at = @now,
        lease_expires_at = NULL, note = N'cancelled by operator'
    OUTPUT inserted.run_id INTO @cancelled
    WHERE run_id = @run_id AND status IN (N'pending', N'queued', N'running', N'waiting');
    IF NOT EXISTS (SELECT 1 FROM @cancelled)
    BEGIN
        -- THROW under XACT_ABORT rolls the transaction back.
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
    UPDATE c SET status = N'cancelled', token = c.token + 1, finished_at = @now, lease_expires_at = NULL,
        note = N'cancelled: its run no longer waits for its targets'
    FROM agent.runs AS c JOIN @cancelled AS d ON c.parent_run_id = d.cancelled_run_id
    WHERE c.status IN (N'waiting', N'pending', N'queued', N'running');
    UPDATE p SET awaiting_targets = 0
    FROM agent.runs AS p JOIN @cancelled AS d ON p.run_id = d.cancelled_run_id
    WHERE p.awaiting_targets = 1;
    COMMIT TRANSACTION;
    SELECT c.cancelled_run_id FROM @cancelled AS c;
END
GO

-- Fleet jobs from T-SQL: agent.add_scheduled_job (0005) takes @targets and @target_parallelism,
-- as JOB__<name>__TARGETS and __TARGET_PARALLELISM. The procedure keeps what it was given; the
-- engine checks the members when it plans the job (a procedure cannot parse them) and writes the
-- job's one fleet step into steps, as the settings sync does for a settings job.
ALTER TABLE agent.jobs ADD requested_targets NVARCHAR(4000) NULL;
ALTER TABLE agent.jobs ADD requested_target_parallelism INT NULL;
GO

-- agent.add_scheduled_job: define (or redefine) a job in the database. The engine checks the
-- schedule, time zone and targets and plans its first slot (needs_planning); slots of the
-- previous definition claimed ahead are recorded skipped. ALTER PROCEDURE keeps the grants of 0005.
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
            requested_targets = LTRIM(RTRIM(@targets)), requested_target_parallelism = @target_parallelism
        WHERE job_name = @name;
    ELSE
        INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                                config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                defined_in_database, needs_planning, steps, requested_targets,
                                requested_target_parallelism)
        VALUES (@name, @stored_schedule, @timezone, @sql, @database, @enabled, 1, NULL, @max_attempts,
                @timeout_seconds, @lease_seconds, LOWER(@misfire), @grace_seconds, LOWER(@overlap), NULL, NULL, 1,
                @now, 1, 1, NULL, LTRIM(RTRIM(@targets)), @target_parallelism);
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @action AS action;
END
GO
