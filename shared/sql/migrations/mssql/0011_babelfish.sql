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
