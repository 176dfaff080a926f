-- Schedules SQL Server refuses, and ones it takes that this agent cannot run as SQL Agent
-- would. Each job has one step and the local server; only its schedule differs.
-- Hand-written for this corpus.
USE msdb
GO
CREATE PROCEDURE #job @name sysname
AS
BEGIN
  EXEC dbo.sp_add_job @job_name = @name, @notify_level_eventlog = 0
  EXEC dbo.sp_add_jobstep @job_name = @name, @step_name = N'one', @database_name = N'sales', @command = N'SELECT 1'
  EXEC dbo.sp_add_jobserver @job_name = @name
END
GO
-- Refused by sp_verify_schedule: nothing is created.
EXEC #job N'hour 25'
EXEC dbo.sp_add_jobschedule @job_name = N'hour 25', @name = N's', @freq_type = 4, @freq_interval = 1,
  @active_start_time = 250000
EXEC #job N'minute 60'
EXEC dbo.sp_add_jobschedule @job_name = N'minute 60', @name = N's', @freq_type = 4, @freq_interval = 1,
  @active_start_time = 6000
EXEC #job N'every 5 seconds'
EXEC dbo.sp_add_jobschedule @job_name = N'every 5 seconds', @name = N's', @freq_type = 4, @freq_interval = 1,
  @freq_subday_type = 2, @freq_subday_interval = 5
EXEC #job N'weekly without a factor'
EXEC dbo.sp_add_jobschedule @job_name = N'weekly without a factor', @name = N's', @freq_type = 8, @freq_interval = 2
EXEC #job N'February 30'
EXEC dbo.sp_add_jobschedule @job_name = N'February 30', @name = N's', @freq_type = 4, @freq_interval = 1,
  @active_start_date = 20270230
EXEC #job N'no freq_type'
EXEC dbo.sp_add_schedule @schedule_name = N'no freq_type'
EXEC #job N'on demand (2)'
EXEC dbo.sp_add_jobschedule @job_name = N'on demand (2)', @name = N's', @freq_type = 2
GO
-- Taken by SQL Server, not by this agent: listed.
EXEC #job N'once, in the past'
EXEC dbo.sp_add_jobschedule @job_name = N'once, in the past', @name = N's', @freq_type = 1,
  @active_start_date = 20200101, @active_start_time = 120000
EXEC #job N'once, no date'
EXEC dbo.sp_add_jobschedule @job_name = N'once, no date', @name = N's', @active_start_time = 0
EXEC #job N'every 3 days'
EXEC dbo.sp_add_jobschedule @job_name = N'every 3 days', @name = N's', @freq_type = 4, @freq_interval = 3
EXEC #job N'across midnight'
EXEC dbo.sp_add_jobschedule @job_name = N'across midnight', @name = N's', @freq_type = 4, @freq_interval = 1,
  @freq_subday_type = 4, @freq_subday_interval = 30, @active_start_time = 220000, @active_end_time = 20000
EXEC #job N'at agent start'
EXEC dbo.sp_add_jobschedule @job_name = N'at agent start', @name = N's', @freq_type = 64
GO
-- Taken by both: carried.
EXEC #job N'every 15 minutes in business hours'
EXEC dbo.sp_add_jobschedule @job_name = N'every 15 minutes in business hours', @name = N's', @freq_type = 8,
  @freq_interval = 62, @freq_recurrence_factor = 1, @freq_subday_type = 4, @freq_subday_interval = 15,
  @active_start_time = 80000, @active_end_time = 175959
EXEC #job N'end time 0 is 23:59:59'
EXEC dbo.sp_add_jobschedule @job_name = N'end time 0 is 23:59:59', @name = N's', @freq_type = 4, @freq_interval = 1,
  @freq_subday_type = 8, @freq_subday_interval = 6, @active_end_time = 0
GO
