-- A job created, then changed the ways msdb lets a script change it, in script order.
-- Hand-written for this corpus.
USE msdb
GO
DECLARE @jobId uniqueidentifier, @scheduleId int
EXEC dbo.sp_add_job @job_name = N'nightly', @notify_level_eventlog = 0, @job_id = @jobId OUTPUT
EXEC dbo.sp_add_jobstep @job_id = @jobId, @step_name = N'extract', @database_name = N'sales',
  @command = N'EXEC etl.extract;', @on_success_action = 3
EXEC dbo.sp_add_jobstep @job_id = @jobId, @step_name = N'transform', @database_name = N'sales',
  @command = N'EXEC etl.transform;', @on_success_action = 3
EXEC dbo.sp_add_jobstep @job_id = @jobId, @step_name = N'load', @database_name = N'sales',
  @command = N'EXEC etl.load;', @on_fail_action = 4, @on_fail_step_id = 4
EXEC dbo.sp_add_jobstep @job_id = @jobId, @step_name = N'alert', @database_name = N'sales',
  @command = N'EXEC etl.alert;', @on_success_action = 2
-- A step inserted at 2: transform, load and alert move up one, and so do the gotos to them.
EXEC dbo.sp_add_jobstep @job_id = @jobId, @step_id = 2, @step_name = N'validate', @database_name = N'sales',
  @command = N'EXEC etl.validate;', @on_success_action = 3
-- Then transform (now 3) is deleted: load and alert move down one.
EXEC dbo.sp_delete_jobstep @job_id = @jobId, @step_id = 3
EXEC dbo.sp_update_jobstep @job_id = @jobId, @step_id = 1, @command = N'   EXEC etl.extract @full = 1;   ',
  @retry_attempts = 2
EXEC dbo.sp_add_schedule @schedule_name = N'nightly 01:00', @freq_type = 4, @freq_interval = 1,
  @active_start_time = 10000, @schedule_id = @scheduleId OUTPUT
EXEC dbo.sp_attach_schedule @job_id = @jobId, @schedule_id = @scheduleId
EXEC dbo.sp_add_jobschedule @job_id = @jobId, @name = N'hourly', @freq_type = 4, @freq_interval = 1,
  @freq_subday_type = 8, @freq_subday_interval = 1
EXEC dbo.sp_update_schedule @schedule_id = @scheduleId, @active_start_time = 13000
EXEC dbo.sp_detach_schedule @job_id = @jobId, @schedule_name = N'hourly', @delete_unused_schedule = 1
EXEC dbo.sp_add_jobserver @job_id = @jobId
GO
-- A second job, disabled after creation, its schedule disabled too.
EXEC dbo.sp_add_job @job_name = N'weekly report', @notify_level_eventlog = 0
EXEC dbo.sp_add_jobstep @job_name = N'weekly report', @step_name = N'report', @database_name = N'sales',
  @command = N'EXEC reports.weekly;'
EXEC dbo.sp_add_jobschedule @job_name = N'weekly report', @name = N'Mondays', @freq_type = 8, @freq_interval = 2,
  @freq_recurrence_factor = 1, @active_start_time = 70000
EXEC dbo.sp_add_jobserver @job_name = N'weekly report'
EXEC dbo.sp_update_job @job_name = N'weekly report', @enabled = 0
EXEC dbo.sp_update_jobschedule @job_name = N'weekly report', @name = N'Mondays', @enabled = 0
GO
-- A third job, created then deleted: it is not imported; its schedule goes with it.
EXEC dbo.sp_add_job @job_name = N'temporary', @notify_level_eventlog = 0
EXEC dbo.sp_add_jobschedule @job_name = N'temporary', @name = N'tmp', @freq_type = 4, @freq_interval = 1
EXEC dbo.sp_delete_job @job_name = N'temporary'
EXEC dbo.sp_delete_schedule @schedule_name = N'tmp'
GO
-- A fourth one renamed, and its old name reused by a new job.
EXEC dbo.sp_add_job @job_name = N'old name', @notify_level_eventlog = 0
EXEC dbo.sp_add_jobstep @job_name = N'old name', @step_name = N's', @database_name = N'sales', @command = N'SELECT 1'
EXEC dbo.sp_add_jobserver @job_name = N'old name'
EXEC dbo.sp_update_job @job_name = N'old name', @new_name = N'new name'
EXEC dbo.sp_add_job @job_name = N'old name', @notify_level_eventlog = 0
EXEC dbo.sp_add_jobstep @job_name = N'old name', @step_name = N's', @database_name = N'sales', @command = N'SELECT 2'
EXEC dbo.sp_add_jobserver @job_name = N'old name'
GO
