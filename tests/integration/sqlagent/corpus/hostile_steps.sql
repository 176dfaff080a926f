-- Step commands with what SQL Server Agent does before running them: tokens replaced, GO
-- splitting the command into batches. Hand-written for this corpus.
USE msdb
GO
CREATE PROCEDURE #job @name sysname, @command nvarchar(max), @retries int = 0
AS
BEGIN
  EXEC dbo.sp_add_job @job_name = @name, @notify_level_eventlog = 0
  EXEC dbo.sp_add_jobstep @job_name = @name, @step_name = N'first', @database_name = N'sales', @command = @command,
    @retry_attempts = @retries, @on_success_action = 3
  EXEC dbo.sp_add_jobstep @job_name = @name, @step_name = N'second', @database_name = N'sales',
    @command = N'EXEC dbo.after;', @on_fail_action = 4, @on_fail_step_id = 1
  EXEC dbo.sp_add_jobserver @job_name = @name
END
GO
-- GO splits the first step in three; a USE batch moves the ones after it to another database.
EXEC #job N'batches', N'EXEC dbo.one;
GO
USE [archive]
GO
EXEC dbo.two;
go  -- lower case, with a comment
EXEC dbo.three;
GO
'
-- GO in a string or a comment inside the command is not a separator.
EXEC #job N'not separators', N'PRINT ''
GO
'';
/*
GO
*/
SELECT 1;'
-- Batches that share the session: a temporary table, a SET option, a transaction.
EXEC #job N'temp table', N'CREATE TABLE #work (id int);
GO
INSERT #work VALUES (1);'
EXEC #job N'set option', N'SET XACT_ABORT ON;
GO
EXEC dbo.one;'
EXEC #job N'transaction', N'BEGIN TRAN;
GO
COMMIT;'
EXEC #job N'go twice', N'EXEC dbo.one;
GO 2'
EXEC #job N'retried batches', N'EXEC dbo.one;
GO
EXEC dbo.two;', 3
-- Tokens.
EXEC #job N'token ok', N'PRINT N''$(ESCAPE_SQUOTE(JOBNAME)) / $(ESCAPE_SQUOTE(STEPNAME)) / $(ESCAPE_NONE(STEPID))'';'
EXEC #job N'token date', N'BACKUP LOG x TO DISK = N''x_$(ESCAPE_SQUOTE(DATE))_$(ESCAPE_SQUOTE(TIME)).trn'';'
EXEC #job N'token no macro', N'PRINT N''$(JOBNAME)'';'
EXEC #job N'token case', N'PRINT N''$(ESCAPE_SQUOTE(jobname))'';'
EXEC #job N'token wmi', N'PRINT N''$(ESCAPE_SQUOTE(WMI(DatabaseName)))'';'
EXEC #job N'sqlcmd variable', N'PRINT N''$(MyVariable)'';'
EXEC #job N'old syntax', N'PRINT N''[STRTDT] stays as written'';'
EXEC #job N'chain', N'EXEC msdb.dbo.sp_start_job @job_name = N''batches'';'
GO
