-- 0027 a job's runs claimed ahead follow a change of its calendars or jitter (issue 33,
-- hardening); see the PostgreSQL file of the same number. agent.jobs.replan_runs is set by
-- agent.set_job_calendars (its body, agent.set_job_calendars_unaudited since 0017) when what the
-- job asked for changed; the engine's planning then records the job's never-started runs keyed
-- from its new first slot on skipped and claims them again under the new rules. The procedure's
-- checks, the audited wrapper and the grants are unchanged.
ALTER TABLE agent.jobs ADD replan_runs SMALLINT NOT NULL CONSTRAINT jobs_replan_runs_default DEFAULT 0;
GO

ALTER PROCEDURE agent.set_job_calendars_unaudited
    @job_name NVARCHAR(4000),
    @exclude_calendars NVARCHAR(4000) = NULL,
    @only_calendars NVARCHAR(4000) = NULL,
    @on_excluded NVARCHAR(4000) = N'skip',
    @jitter_seconds INT = 0
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.set_job_calendars: ';
    DECLARE @exclude NVARCHAR(4000) = NULLIF(LOWER(REPLACE(@exclude_calendars, N' ', N'')), N'');
    DECLARE @only NVARCHAR(4000) = NULLIF(LOWER(REPLACE(@only_calendars, N' ', N'')), N'');
    DECLARE @policy NVARCHAR(8) = LOWER(LEFT(COALESCE(@on_excluded, N''), 8));
    IF @exclude COLLATE Latin1_General_BIN2 LIKE N'%[^-a-z0-9_.,]%'
    BEGIN
        SET @message = @p + N'@exclude_calendars = ''' + REPLACE(LEFT(@exclude_calendars, 80), N'''', N'''''')
            + N''': expected NULL or calendar names, comma-separated (letters, digits, ''_'', ''.'', ''-'')';
        THROW 51401, @message, 1;
    END;
    IF @only COLLATE Latin1_General_BIN2 LIKE N'%[^-a-z0-9_.,]%'
    BEGIN
        SET @message = @p + N'@only_calendars = ''' + REPLACE(LEFT(@only_calendars, 80), N'''', N'''''')
            + N''': expected NULL or calendar names, comma-separated (letters, digits, ''_'', ''.'', ''-'')';
        THROW 51401, @message, 1;
    END;
    IF @on_excluded IS NULL OR LOWER(@on_excluded) NOT IN (N'skip', N'next')
    BEGIN
        SET @message = @p + N'@on_excluded = ' + COALESCE(N'''' + REPLACE(LEFT(@on_excluded, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected skip or next';
        THROW 51401, @message, 1;
    END;
    IF @jitter_seconds IS NULL OR @jitter_seconds NOT BETWEEN 0 AND 86400
    BEGIN
        SET @message = @p + N'@jitter_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @jitter_seconds), N'NULL')
            + N': expected a whole number from 0 to 86400';
        THROW 51401, @message, 1;
    END;
    UPDATE agent.jobs SET requested_exclude = @exclude, requested_only = @only, requested_on_excluded = @policy,
           jitter_seconds = @jitter_seconds, needs_planning = 1, updated_at = @now,
           -- What the job asked for changed: its runs claimed ahead are planned again (planning.py).
           replan_runs = CASE WHEN replan_runs = 1
                                   OR jitter_seconds <> @jitter_seconds
                                   OR COALESCE(requested_exclude, N'') <> COALESCE(@exclude, N'')
                                   OR COALESCE(requested_only, N'') <> COALESCE(@only, N'')
                                   OR COALESCE(requested_on_excluded, N'skip') <> @policy
                              THEN 1 ELSE 0 END
    WHERE job_name = @job_name AND configured = 1 AND defined_in_database = 1;
    IF @@ROWCOUNT = 0
    BEGIN
        SET @message = @p + N'@job_name = ' + COALESCE(N'''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes '
            + N'JOB__<name>__EXCLUDE, ONLY, ON_EXCLUDED and JITTER_SECONDS)';
        THROW 51404, @message, 1;
    END;
    SELECT CAST(@job_name AS NVARCHAR(64)) AS job, @exclude AS exclude_names, @only AS only_names,
           @policy AS excluded_policy, @jitter_seconds AS jitter;
END
GO
