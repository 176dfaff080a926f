-- 0014 schedules beyond every scheduler (issue 33): a job's calendars (JOB__<name>__EXCLUDE, ONLY,
-- ON_EXCLUDED), whole, as JSON (shared.jobs.calendars.CalendarRules): the claim reads them with
-- the job (select_due_jobs) and computes its slots' decisions in Python; NULL: no calendar.
ALTER TABLE agent.jobs ADD calendars NVARCHAR(MAX) NULL;
-- JOB__<name>__JITTER_SECONDS: each slot runs up to this many seconds late, by a delay fixed by the
-- job's name and the slot (every instance computes the same: the slot is still claimed once).
ALTER TABLE agent.jobs ADD jitter_seconds INT NOT NULL CONSTRAINT jobs_jitter_seconds_default DEFAULT 0;

-- Calendars defined from T-SQL (agent.add_calendar / remove_calendar) and a database job's
-- calendars and jitter (agent.set_job_calendars): the names as given, checked and resolved by the
-- engine when it plans the job (needs_planning), into agent.jobs.calendars as for a settings job.
CREATE TABLE agent.calendars (
    name        NVARCHAR(64) NOT NULL CONSTRAINT calendars_pk PRIMARY KEY,
    dates       NVARCHAR(MAX) NULL,
    weekly      NVARCHAR(MAX) NULL,
    defined_by  NVARCHAR(128) NULL,
    updated_at  DATETIME2(6) NOT NULL
);
ALTER TABLE agent.jobs ADD requested_exclude NVARCHAR(4000) NULL;
ALTER TABLE agent.jobs ADD requested_only NVARCHAR(4000) NULL;
ALTER TABLE agent.jobs ADD requested_on_excluded NVARCHAR(8) NULL;
GO

-- agent.add_calendar: define (or redefine) a calendar; the database jobs that name it wait for the
-- engine to plan them again (names compare case-insensitively, as the default collation does).
CREATE PROCEDURE agent.add_calendar
    @name NVARCHAR(4000),
    @dates NVARCHAR(MAX) = NULL,
    @weekly NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.add_calendar: ';
    IF @name IS NULL OR @name = N'' OR LEN(@name) > 64 OR @name COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%'
    BEGIN
        SET @message = @p + N'@name = ' + COALESCE(N'''' + REPLACE(LEFT(@name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected a calendar name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(COALESCE(@dates, N''))), N'') IS NULL AND NULLIF(LTRIM(RTRIM(COALESCE(@weekly, N''))), N'') IS NULL
        THROW 51401, N'agent.add_calendar: @dates = NULL, @weekly = NULL: expected dates (''2026-12-25, 2026-12-24..2026-12-26'') or weekly windows (''SAT-SUN, FRI 22:00-06:00''), or both', 1;
    IF LEN(@dates) > 40000 OR LEN(@weekly) > 4000
        THROW 51401, N'agent.add_calendar: @dates or @weekly: expected at most 40000 and 4000 characters', 1;
    DECLARE @action NVARCHAR(16) = N'defined';
    BEGIN TRANSACTION;
    IF EXISTS (SELECT 1 FROM agent.calendars WITH (UPDLOCK, HOLDLOCK) WHERE name = @name)
    BEGIN
        SET @action = N'redefined';
        UPDATE agent.calendars SET name = @name, dates = @dates, weekly = @weekly, defined_by = USER_NAME(), updated_at = @now
        WHERE name = @name;
    END
    ELSE
        INSERT INTO agent.calendars (name, dates, weekly, defined_by, updated_at)
        VALUES (@name, @dates, @weekly, USER_NAME(), @now);
    UPDATE agent.jobs SET needs_planning = 1, updated_at = @now
    WHERE defined_in_database = 1 AND configured = 1
      AND (CHARINDEX(N',' + LOWER(@name) + N',', N',' + COALESCE(requested_exclude, N'') + N',') > 0
           OR CHARINDEX(N',' + LOWER(@name) + N',', N',' + COALESCE(requested_only, N'') + N',') > 0);
    DECLARE @replanned INT = @@ROWCOUNT;
    COMMIT TRANSACTION;
    SELECT CAST(@name AS NVARCHAR(64)) AS calendar_name, @action AS action, @replanned AS jobs_replanned;
END
GO

CREATE PROCEDURE agent.remove_calendar
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    BEGIN TRANSACTION;
    DELETE FROM agent.calendars WHERE name = @name;
    IF @@ROWCOUNT = 0
    BEGIN
        SET @message = N'agent.remove_calendar: @name = ' + COALESCE(N'''' + REPLACE(LEFT(@name, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected the name of a calendar defined by agent.add_calendar; there is no such calendar';
        THROW 51404, @message, 1;
    END;
    UPDATE agent.jobs SET needs_planning = 1, updated_at = @now
    WHERE defined_in_database = 1 AND configured = 1
      AND (CHARINDEX(N',' + LOWER(@name) + N',', N',' + COALESCE(requested_exclude, N'') + N',') > 0
           OR CHARINDEX(N',' + LOWER(@name) + N',', N',' + COALESCE(requested_only, N'') + N',') > 0);
    DECLARE @replanned INT = @@ROWCOUNT;
    COMMIT TRANSACTION;
    SELECT CAST(@name AS NVARCHAR(64)) AS calendar_name, @replanned AS jobs_replanned;
END
GO

-- agent.set_job_calendars: a database job's calendars (JOB__<name>__EXCLUDE, ONLY, ON_EXCLUDED of a
-- settings job) and jitter (JITTER_SECONDS); the engine checks the names when it plans the job.
CREATE PROCEDURE agent.set_job_calendars
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
           jitter_seconds = @jitter_seconds, needs_planning = 1, updated_at = @now
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

GRANT EXECUTE ON OBJECT::agent.add_calendar TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.remove_calendar TO agent_operator;
GRANT EXECUTE ON OBJECT::agent.set_job_calendars TO agent_operator;
