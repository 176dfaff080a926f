-- The same job in every encoding a script arrives in (generated from this file, UTF-8; see
-- make_encodings.py): SSMS's UTF-16 LE with a byte order mark, UTF-8 with and without one,
-- UTF-16/UTF-32 without one, Windows-1252, CRLF line ends.
USE [msdb]
GO
DECLARE @jobId uniqueidentifier
EXEC msdb.dbo.sp_add_job @job_name = N'Sauvegarde générale', @notify_level_eventlog = 0, @job_id = @jobId OUTPUT
EXEC msdb.dbo.sp_add_jobstep @job_id = @jobId, @step_name = N'étape 1', @database_name = N'ventes',
    @command = N'PRINT N''déjà vu — « ok »'';
-- a comment in the command'
EXEC msdb.dbo.sp_add_jobschedule @job_id = @jobId, @name = N'Nuit', @freq_type = 4, @freq_interval = 1,
    @active_start_time = 23000
EXEC msdb.dbo.sp_add_jobserver @job_id = @jobId
GO
