-- Control flow a hand-written script may have around msdb's procedures: each block says what
-- SQL Server does with it. Hand-written for this corpus.
USE msdb
GO
-- 1. A transaction rolled back: the job it created does not exist afterwards.
BEGIN TRANSACTION
EXEC dbo.sp_add_job @job_name = N'rolled back'
ROLLBACK TRANSACTION
GO
-- 2. TRY/CATCH: the second sp_add_job fails (the name exists), CATCH rolls back both.
BEGIN TRY
  BEGIN TRAN
  EXEC dbo.sp_add_job @job_name = N'caught'
  EXEC dbo.sp_add_job @job_name = N'caught'
  COMMIT
END TRY
BEGIN CATCH
  IF @@TRANCOUNT > 0 ROLLBACK
END CATCH
GO
-- 3. A loop with a counter the script knows: three jobs.
DECLARE @i int = 1, @name sysname
WHILE @i <= 3
BEGIN
  SET @name = N'loop ' + CAST(@i AS nvarchar(10))
  EXEC dbo.sp_add_job @job_name = @name, @notify_level_eventlog = 0
  EXEC dbo.sp_add_jobstep @job_name = @name, @step_name = N'only', @database_name = N'sales',
    @command = N'SELECT 1'
  EXEC dbo.sp_add_jobserver @job_name = @name
  SET @i += 1
  IF @i = 3 CONTINUE
END
GO
-- 4. Dynamic SQL: the call is in a string; sp_executesql passes a parameter and gets the job_id back.
DECLARE @sql nvarchar(max) = N'EXEC msdb.dbo.sp_add_job @job_name = @n, @notify_level_eventlog = 0, @job_id = @id OUTPUT'
DECLARE @jobId uniqueidentifier
EXEC sp_executesql @sql, N'@n sysname, @id uniqueidentifier OUTPUT', @n = N'dynamic', @id = @jobId OUTPUT
EXEC ('EXEC msdb.dbo.sp_add_jobstep @job_name = N''dynamic'', @step_name = N''s'', @database_name = N''sales'', '
      + '@command = N''EXEC dbo.nightly;''')
EXEC msdb.dbo.sp_add_jobserver @job_id = @jobId
GO
-- 5. A procedure of the script's own that creates a job, run twice with different names.
CREATE PROCEDURE #make_job @name sysname, @command nvarchar(max), @jobId uniqueidentifier = NULL OUTPUT
AS
BEGIN
  EXEC msdb.dbo.sp_add_job @job_name = @name, @notify_level_eventlog = 0, @job_id = @jobId OUTPUT
  EXEC msdb.dbo.sp_add_jobstep @job_id = @jobId, @step_name = N'only', @database_name = N'sales',
    @command = @command
  EXEC msdb.dbo.sp_add_jobserver @job_id = @jobId
  RETURN 0
END
GO
DECLARE @made uniqueidentifier
EXEC #make_job N'made one', N'SELECT 11'
EXEC #make_job @name = N'made two', @command = N'SELECT 22', @jobId = @made OUTPUT
EXEC msdb.dbo.sp_update_job @job_id = @made, @enabled = 0
GO
-- 6. GOTO past a job: it is never created.
GOTO Done
EXEC dbo.sp_add_job @job_name = N'skipped by GOTO'
Done:
GO
-- 7. SET NOEXEC ON: SQL Server compiles what follows and runs none of it.
SET NOEXEC ON
EXEC dbo.sp_add_job @job_name = N'not executed'
SET NOEXEC OFF
GO
-- 8. A condition only the server knows, on which the jobs depend.
IF @@SERVERNAME = N'PROD01'
  EXEC dbo.sp_add_job @job_name = N'only on PROD01'
GO
-- 9. A direct change to SQL Agent's tables.
UPDATE msdb.dbo.sysjobs SET enabled = 0 WHERE name = N'loop 1'
GO
-- 10. The connection closes here: nothing after it runs.
RAISERROR (N'stop: do not run the rest', 20, 1) WITH LOG
GO
EXEC dbo.sp_add_job @job_name = N'after the disconnect'
GO
