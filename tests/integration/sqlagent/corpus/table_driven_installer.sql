/*
An installer whose jobs come from a table variable, walked with WHILE EXISTS ... SELECT TOP 1
(the shape of recent maintenance-solution installers): which jobs it creates, and with which
names, are rows of a table, known only when it runs. The importer cannot carry them: it says
so, at the line of each call. Hand-written for this corpus.
*/
USE [master]
GO
IF OBJECT_ID('tempdb..#Config') IS NOT NULL DROP TABLE #Config
CREATE TABLE #Config ([Name] nvarchar(max), [Value] nvarchar(max))
INSERT INTO #Config ([Name], [Value]) VALUES('CreateJobs', 'Y')
GO
IF (SELECT [Value] FROM #Config WHERE Name = 'CreateJobs') = 'Y'
BEGIN
  DECLARE @Jobs TABLE (JobID int IDENTITY, [Name] nvarchar(max), CommandTSQL nvarchar(max),
                       Selected bit DEFAULT 0, Completed bit DEFAULT 0)
  DECLARE @CurrentJobID int, @CurrentJobName nvarchar(max), @CurrentCommand nvarchar(max)

  INSERT INTO @Jobs ([Name], CommandTSQL)
  VALUES ('CommandLog Cleanup', 'DELETE FROM [dbo].[CommandLog]' + CHAR(13) + CHAR(10)
          + 'WHERE StartTime < DATEADD(dd,-30,GETDATE())')
  INSERT INTO @Jobs ([Name], CommandTSQL)
  VALUES ('IndexOptimize - USER_DATABASES', 'EXECUTE [dbo].[IndexOptimize] @Databases = ''USER_DATABASES''')

  UPDATE @Jobs SET Selected = 1

  WHILE EXISTS (SELECT * FROM @Jobs WHERE Completed = 0 AND Selected = 1)
  BEGIN
    SELECT TOP 1 @CurrentJobID = JobID, @CurrentJobName = [Name], @CurrentCommand = CommandTSQL
    FROM @Jobs
    WHERE Completed = 0 AND Selected = 1
    ORDER BY JobID ASC

    IF NOT EXISTS (SELECT * FROM msdb.dbo.sysjobs WHERE [name] = @CurrentJobName)
    BEGIN
      EXECUTE msdb.dbo.sp_add_job @job_name = @CurrentJobName
      EXECUTE msdb.dbo.sp_add_jobstep @job_name = @CurrentJobName, @step_name = @CurrentJobName,
        @command = @CurrentCommand, @database_name = N'dba'
      EXECUTE msdb.dbo.sp_add_jobserver @job_name = @CurrentJobName
    END

    UPDATE Jobs SET Completed = 1 FROM @Jobs Jobs WHERE JobID = @CurrentJobID
  END
END
GO
