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
-- * agent.add_scheduled_job writes @run_at's '@once' schedule in ISO 8601 on every engine and
--   checks names with the hyphen first: both in its one redefinition, 0010's.
-- * The name checks of agent.exec_async (and 0010's agent.add_scheduled_job) put the hyphen first in their
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
