-- Names a SQL Agent job can have that are hostile to anything that quotes or splits text.
-- Hand-written for this corpus; msdb takes each of them (a procedure of the script makes each
-- job complete: a step, the local server).
USE [msdb]
GO
CREATE PROCEDURE #job @name nvarchar(200)
AS
BEGIN
  EXEC msdb.dbo.sp_add_job @job_name = @name, @notify_level_eventlog = 0
  EXEC msdb.dbo.sp_add_jobstep @job_name = @name, @step_name = N'one', @database_name = N'sales',
    @command = N'SELECT 1'
  EXEC msdb.dbo.sp_add_jobserver @job_name = @name
END
GO
EXEC #job N'quote''s; DROP TABLE x; -- /* and */'
EXEC #job N'[brackets]]] and "double" quotes'
EXEC #job N'Sauvegarde générale — 夜間'
EXEC #job N'שלום ‮right-to-left'
EXEC #job N'combining é'
EXEC #job N'   padded   '
EXEC #job N'PADDED'
EXEC #job N'SELECT'
EXEC #job NoQuotesAtAll
EXEC #job 'not N: 夜間'
GO
DECLARE @long nvarchar(max) = REPLICATE(N'x', 200)
EXEC #job @long
GO
-- SQL Server refuses this batch: an argument cannot be an expression.
EXEC #job N'joined ' + N'name'
GO
