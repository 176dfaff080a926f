/*
An installer in the style of DBA maintenance solutions (such as Ola Hallengren's
MaintenanceSolution.sql): settings at the top, commands built in variables with CHAR(13) +
CHAR(10), tokens written as '$' + '(...)' so that SSMS's own sqlcmd mode leaves them alone,
output files under SQL Server's log directory, and IF NOT EXISTS around each job so the
installer can run twice. Hand-written for this corpus.
*/

USE [master] -- the database the maintenance procedures live in

SET NOCOUNT ON

DECLARE @CreateJobs nvarchar(max)     = 'Y'
DECLARE @BackupDirectory nvarchar(max) = N'\\backup01\sql'
DECLARE @CleanupTime int               = 168
DECLARE @LogToTable nvarchar(max)      = 'Y'
DECLARE @DatabaseName nvarchar(max)    = N'dba'

DECLARE @TokenServer nvarchar(max)   = '$' + '(ESCAPE_SQUOTE(SRVR))'
DECLARE @TokenJobName nvarchar(max)  = '$' + '(ESCAPE_SQUOTE(JOBNAME))'
DECLARE @TokenStepID nvarchar(max)   = '$' + '(ESCAPE_SQUOTE(STEPID))'
DECLARE @TokenDate nvarchar(max)     = '$' + '(ESCAPE_SQUOTE(DATE))'
DECLARE @TokenTime nvarchar(max)     = '$' + '(ESCAPE_SQUOTE(TIME))'
DECLARE @TokenLogDirectory nvarchar(max) = '$' + '(ESCAPE_SQUOTE(SQLLOGDIR))'

DECLARE @JobDescription nvarchar(max) = 'Source: a DBA maintenance installer'
DECLARE @JobCategory nvarchar(max)    = 'Database Maintenance'
DECLARE @JobName nvarchar(max)
DECLARE @JobCommand nvarchar(max)
DECLARE @OutputFileName nvarchar(max)

IF @CreateJobs = 'Y'
BEGIN
  -- Job 1: full backups of the user databases, every night at 01:00.
  SET @JobName = 'DatabaseBackup - USER_DATABASES - FULL'
  SET @JobCommand = 'EXECUTE [dbo].[DatabaseBackup]' + CHAR(13) + CHAR(10)
                  + '@Databases = ''USER_DATABASES'',' + CHAR(13) + CHAR(10)
                  + '@Directory = ' + ISNULL('N''' + REPLACE(@BackupDirectory, '''', '''''') + '''', 'NULL') + ','
                  + CHAR(13) + CHAR(10)
                  + '@BackupType = ''FULL'',' + CHAR(13) + CHAR(10)
                  + '@CleanupTime = ' + ISNULL(CAST(@CleanupTime AS nvarchar), 'NULL') + ',' + CHAR(13) + CHAR(10)
                  + '@LogToTable = ''' + @LogToTable + ''''
  SET @OutputFileName = @TokenLogDirectory + '\' + @TokenJobName + '_' + @TokenStepID + '_' + @TokenDate + '_'
                      + @TokenTime + '.txt'

  IF NOT EXISTS (SELECT * FROM msdb.dbo.sysjobs WHERE [name] = @JobName)
  BEGIN
    EXECUTE msdb.dbo.sp_add_job @job_name = @JobName, @description = @JobDescription,
      @category_name = @JobCategory, @notify_level_eventlog = 0
    EXECUTE msdb.dbo.sp_add_jobstep @job_name = @JobName, @step_name = @JobName, @subsystem = 'TSQL',
      @command = @JobCommand, @output_file_name = @OutputFileName, @database_name = @DatabaseName
    EXECUTE msdb.dbo.sp_add_jobschedule @job_name = @JobName, @name = 'Nightly 01:00', @freq_type = 4,
      @freq_interval = 1, @active_start_time = 10000
    EXECUTE msdb.dbo.sp_add_jobserver @job_name = @JobName
  END

  -- Job 2: index maintenance, Sundays at 03:30; its command names the job through a token.
  SET @JobName = 'IndexOptimize - USER_DATABASES'
  SET @JobCommand = N'EXECUTE [dbo].[IndexOptimize] @Databases = ''USER_DATABASES'', @LogToTable = '''
                  + @LogToTable + ''';' + NCHAR(13) + NCHAR(10)
                  + N'PRINT N''' + @TokenJobName + N' done'';'

  IF NOT EXISTS (SELECT * FROM msdb.dbo.sysjobs WHERE [name] = @JobName)
  BEGIN
    EXECUTE msdb.dbo.sp_add_job @job_name = @JobName, @description = @JobDescription,
      @category_name = @JobCategory, @notify_level_eventlog = 0
    EXECUTE msdb.dbo.sp_add_jobstep @job_name = @JobName, @step_name = @JobName, @subsystem = 'TSQL',
      @command = @JobCommand, @database_name = @DatabaseName, @retry_attempts = 2, @retry_interval = 5
    EXECUTE msdb.dbo.sp_add_jobschedule @job_name = @JobName, @name = 'Sundays 03:30', @freq_type = 8,
      @freq_interval = 1, @freq_recurrence_factor = 1, @active_start_time = 33000
    EXECUTE msdb.dbo.sp_add_jobserver @job_name = @JobName
  END

  -- Job 3: the history purge runs in msdb itself; running the installer twice adds nothing.
  SET @JobName = 'sp_purge_jobhistory'
  SET @JobCommand = 'DECLARE @CleanupDate datetime' + CHAR(13) + CHAR(10)
                  + 'SET @CleanupDate = DATEADD(dd,-30,GETDATE())' + CHAR(13) + CHAR(10)
                  + 'EXECUTE dbo.sp_purge_jobhistory @oldest_date = @CleanupDate'

  IF NOT EXISTS (SELECT * FROM msdb.dbo.sysjobs WHERE [name] = @JobName)
  BEGIN
    EXECUTE msdb.dbo.sp_add_job @job_name = @JobName, @description = @JobDescription,
      @category_name = @JobCategory, @notify_level_eventlog = 0
    EXECUTE msdb.dbo.sp_add_jobstep @job_name = @JobName, @step_name = @JobName, @subsystem = 'TSQL',
      @command = @JobCommand, @database_name = 'msdb'
    EXECUTE msdb.dbo.sp_add_jobserver @job_name = @JobName
  END
  IF NOT EXISTS (SELECT * FROM msdb.dbo.sysjobs WHERE [name] = @JobName)
  BEGIN
    EXECUTE msdb.dbo.sp_add_job @job_name = @JobName
  END
END
GO
