-- 0011 Babelfish for PostgreSQL (issue 25): the same T-SQL on SQL Server, Azure SQL and Babelfish.
--
-- * agent.json_text: a JSON string read by OPENJSON / JSON_VALUE as its text. SQL Server and Azure
--   SQL return it unescaped ("OPENJSON (Transact-SQL)": the value of a string property is
--   returned as its text); Babelfish 4.2.0 returns PostgreSQL's jsonb text of it, with the
--   escapes \" \\ \n \r \t \b \f \u00XX left in, which turned a command with a quote or a new
--   line, and a fleet job's steps (JSON inside JSON), into other text. The agent's named queries
--   read every free-text property through it. It asks the engine once per call: where
--   JSON_VALUE already unescapes, the text is returned as it is, so SQL Server's semantics are
--   unchanged. EXECUTE is granted to public: it reads nothing and the app's user (DML on schema
--   agent, no EXECUTE) calls it in the agent's statements.
-- * agent.start_job (0005) takes the start lock as the engine's starts do (an UPDATE, below).
-- * agent.add_scheduled_job (0010's, with @after) writes @run_at's '@once' schedule in ISO 8601 on every engine:
--   Babelfish writes CONVERT style 126 with a space where SQL Server writes 'T'; STUFF puts the
--   'T' at position 11 (a no-op on SQL Server). The rest of the procedure is 0010's.
-- * The name checks of agent.add_scheduled_job and agent.exec_async put the hyphen first in their
--   LIKE classes ('%[^-A-Za-z0-9_.]%'): SQL Server reads a hyphen first or last in a class as
--   itself ("LIKE (Transact-SQL)", https://learn.microsoft.com/sql/t-sql/language-elements/like-transact-sql),
--   Babelfish 4.2.0 only when it comes first: with it last, 'bad name' and 'a;b' matched no
--   character outside the class and a hostile name passed the check there.

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

CREATE FUNCTION agent.json_text (@text NVARCHAR(MAX))
RETURNS NVARCHAR(MAX)
AS
BEGIN
    IF @text IS NULL OR CHARINDEX(N'\', @text) = 0 OR JSON_VALUE(N'["\n"]', N'$[0]') = NCHAR(10)
        RETURN @text;
    DECLARE @out NVARCHAR(MAX) = N'';
    DECLARE @at INT = 1;
    DECLARE @next INT = CHARINDEX(N'\', @text);
    DECLARE @escape NCHAR(1);
    DECLARE @hex NVARCHAR(4);
    WHILE @next > 0
    BEGIN
        SET @out = @out + SUBSTRING(@text, @at, @next - @at);
        SET @escape = SUBSTRING(@text, @next + 1, 1);
        IF @escape = N'u'
        BEGIN
            -- \uXXXX (jsonb writes control characters so); CONVERT(... , 2) of hex text is not
            -- Babelfish's, so the digits are summed.
            SET @hex = UPPER(SUBSTRING(@text, @next + 2, 4));
            SET @out = @out + NCHAR((CHARINDEX(SUBSTRING(@hex, 1, 1), N'0123456789ABCDEF') - 1) * 4096
                                    + (CHARINDEX(SUBSTRING(@hex, 2, 1), N'0123456789ABCDEF') - 1) * 256
                                    + (CHARINDEX(SUBSTRING(@hex, 3, 1), N'0123456789ABCDEF') - 1) * 16
                                    + (CHARINDEX(SUBSTRING(@hex, 4, 1), N'0123456789ABCDEF') - 1));
            SET @at = @next + 6;
        END
        ELSE
        BEGIN
            SET @out = @out + CASE @escape WHEN N'n' THEN NCHAR(10) WHEN N'r' THEN NCHAR(13)
                                           WHEN N't' THEN NCHAR(9) WHEN N'b' THEN NCHAR(8)
                                           WHEN N'f' THEN NCHAR(12) ELSE @escape END;
            SET @at = @next + 2;
        END;
        SET @next = CHARINDEX(N'\', @text, @at);
    END;
    RETURN @out + SUBSTRING(@text, @at, 2147483647);
END
GO

GRANT EXECUTE ON OBJECT::agent.json_text TO public;
GO

ALTER PROCEDURE agent.start_job
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
    -- The start lock as every engine start takes it (dispatch_runs, claim_runs, start_run,
    -- insert_manual_run): an UPDATE with TABLOCKX holds an exclusive table lock to the end of the
    -- transaction on SQL Server ("Table hints (Transact-SQL)", TABLOCKX: "the exclusive lock is
    -- held until the end of the transaction"), and a row lock on Babelfish, which accepts and
    -- ignores the hint, where 0005's locking SELECT locked nothing.
    UPDATE agent.start_lock WITH (TABLOCKX) SET lock_id = lock_id;
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
    @after_outcome NVARCHAR(4000) = N'succeeded'
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
    IF @overlap IS NULL OR LOWER(@overlap) NOT IN (N'skip', N'queue', N'allow')
    BEGIN
        SET @message = @p + N'@overlap = ' + COALESCE(N'''' + REPLACE(@overlap, N'''', N'''''') + N'''', N'NULL')
            + N': expected skip, queue or allow';
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
    -- @after: a job that exists now (from the settings or from here), by its name as written, and
    -- no cycle: the chain of jobs it follows, walked up from it, never comes back to this one.
    DECLARE @leader NVARCHAR(64);
    DECLARE @cycle NVARCHAR(MAX);
    IF @after IS NOT NULL
    BEGIN
        SELECT @leader = j.job_name FROM agent.jobs AS j WHERE j.job_name = @after AND j.configured = 1;
        IF @leader IS NULL
        BEGIN
            SET @message = @p + N'@after = ''' + @after
                + N''': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
            THROW 51401, @message, 1;
        END;
        -- Walked at most 99 jobs up: within the recursion limit SQL Server keeps by default (100).
        WITH chain (job_name, after_job, shown, depth) AS (
            SELECT j.job_name, j.after_job, CAST(j.job_name AS NVARCHAR(MAX)), 1
            FROM agent.jobs AS j WHERE j.job_name = @leader
            UNION ALL
            SELECT j.job_name, j.after_job, CAST(j.job_name + N' -> ' + c.shown AS NVARCHAR(MAX)), c.depth + 1
            FROM chain AS c JOIN agent.jobs AS j ON j.job_name = c.after_job AND j.configured = 1
            WHERE c.job_name <> @name AND c.depth < 99)
        SELECT @cycle = c.shown FROM chain AS c WHERE c.job_name = @name;
        IF @cycle IS NOT NULL
        BEGIN
            SET @message = @p + N'@after = ''' + @after
                + N''': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                + @cycle + N' -> ' + @name + N': a run of each would start the next, forever)';
            THROW 51401, @message, 1;
        END;
    END;
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
            owner = USER_NAME(), after_job = @leader,
            after_outcome = CASE WHEN @leader IS NOT NULL THEN LOWER(@after_outcome) END
        WHERE job_name = @name;
    ELSE
        INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                                config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                defined_in_database, needs_planning, steps, requested_targets,
                                requested_target_parallelism, owner, after_job, after_outcome)
        VALUES (@name, @stored_schedule, @timezone, @sql, @database, @enabled, 1, NULL, @max_attempts,
                @timeout_seconds, @lease_seconds, LOWER(@misfire), @grace_seconds, LOWER(@overlap), NULL, NULL, 1,
                @now, 1, 1, NULL, LTRIM(RTRIM(@targets)), @target_parallelism, USER_NAME(),
                @leader, CASE WHEN @leader IS NOT NULL THEN LOWER(@after_outcome) END);
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @action AS action;
END
GO

-- agent.exec_async (0007's) with its @database check written as Babelfish reads it too (below).
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
    IF @database IS NOT NULL AND (@database = N'' OR LEN(@database) > 128 OR @database COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_]%')
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
