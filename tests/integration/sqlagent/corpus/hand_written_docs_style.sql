-- Written by hand the way SQL Server's documentation shows it: USE msdb, then each procedure
-- called by its one-part name, schedules created once and attached by name, arguments
-- positional where the order is short, a variable for the command.
USE msdb ;
GO

EXEC dbo.sp_add_job
    @job_name = N'Weekly Sales Data Backup',
    @notify_level_eventlog = 0 ;
GO

DECLARE @backup nvarchar(400) = N'BACKUP DATABASE Sales TO DISK = N''D:\Backup\Sales.bak'' WITH INIT'
EXEC sp_add_jobstep
    @job_name = N'Weekly Sales Data Backup',
    @step_name = N'Set database to read only',
    @subsystem = N'TSQL',
    @database_name = N'Sales',
    @command = N'ALTER DATABASE Sales SET READ_ONLY',
    @on_success_action = 3,
    @retry_attempts = 5,
    @retry_interval = 5 ;
EXEC sp_add_jobstep NULL, N'Weekly Sales Data Backup', 2, N'Back up', N'TSQL', @backup,
    @database_name = N'Sales' ;
GO

EXEC dbo.sp_add_schedule
    @schedule_name = N'RunOnce',
    @freq_type = 4,
    @freq_interval = 1,
    @active_start_time = 233000 ;
USE msdb ;
GO

EXEC sp_attach_schedule
   @job_name = N'Weekly Sales Data Backup',
   @schedule_name = N'RunOnce';
GO

EXEC dbo.sp_add_jobserver
    @job_name = N'Weekly Sales Data Backup';
GO
