-- 0010 jobs that follow jobs (issue 27 item 3): JOB__<b>__AFTER=<a> (agent.add_scheduled_job
-- @after): a run of a that ends with b's AFTER_OUTCOME (succeeded, failed or completed) starts a
-- run of b, created in the very transaction that records a's end (start_follow_up_runs, run after
-- each ending statement), so it exists exactly when a's end does.
--
-- agent.jobs.after_job, after_outcome: whom the job follows, and on which end (NULL: no one).
-- agent.runs.followed_run_id: the run whose end started this one. Unique with the job's name:
-- two transactions ending the same run (a lapsed worker and the retried run's) can never both
-- create its follow-up; the fenced ending lets only one of them end it in the first place.

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

ALTER TABLE agent.jobs ADD after_job NVARCHAR(64) NULL;
ALTER TABLE agent.jobs ADD after_outcome NVARCHAR(16) NULL;
ALTER TABLE agent.runs ADD followed_run_id BIGINT NULL;
GO

ALTER TABLE agent.jobs ADD CONSTRAINT jobs_after_outcome_check CHECK (after_outcome IN (N'succeeded', N'failed', N'completed'));
CREATE INDEX jobs_after_job ON agent.jobs (after_job) WHERE after_job IS NOT NULL;
CREATE UNIQUE INDEX runs_followed ON agent.runs (followed_run_id, job_name) WHERE followed_run_id IS NOT NULL;
GO

-- The activity view (as 0009 defined it, with the pause) shows whom each job follows too
-- (after_job, after_outcome).
DROP VIEW agent.job_activity;
GO

CREATE VIEW agent.job_activity AS
SELECT j.job_name,
       CASE WHEN j.defined_in_database = 1 THEN N'database' ELSE N'settings' END AS defined_in,
       CASE WHEN j.configured = 0 THEN N'removed' WHEN j.valid = 0 THEN N'invalid'
            WHEN j.enabled = 0 THEN N'disabled' WHEN j.needs_planning = 1 THEN N'planning'
            WHEN p.job_name IS NOT NULL THEN N'paused' WHEN c.run_id IS NOT NULL THEN N'running'
            WHEN j.next_due_at IS NULL AND n.next_slot IS NULL THEN N'idle' ELSE N'scheduled' END AS state,
       j.enabled, j.schedule, j.timezone, COALESCE(n.next_slot, j.next_due_at) AS next_run_at,
       c.run_id AS running_run_id, c.started_at AS running_since, c.worker AS running_worker,
       l.run_id AS last_run_id, l.status AS last_outcome, l.finished_at AS last_finished_at,
       l.last_error AS last_error, j.config_error,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason, j.after_job, j.after_outcome
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p
       ON p.job_name = j.job_name AND (p.paused_until IS NULL OR p.paused_until > SYSUTCDATETIME())
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.started_at, r.worker FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status = N'running'
    ORDER BY r.started_at, r.run_id) AS c
OUTER APPLY (
    SELECT MIN(r.scheduled_for) AS next_slot FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.kind = N'scheduled' AND r.status IN (N'pending', N'queued')) AS n
OUTER APPLY (
    SELECT TOP (1) r.run_id, r.status, r.finished_at, r.last_error FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status IN (N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled')
    ORDER BY r.scheduled_for DESC, r.run_id DESC) AS l;
GO

GRANT SELECT ON agent.job_activity TO agent_operator;
GO

-- The history view shows which run a follow-up run followed (DROP VIEW and CREATE VIEW:
-- Babelfish has no ALTER VIEW); its grant is given again.
DROP VIEW agent.job_history;
GO

CREATE VIEW agent.job_history AS
SELECT r.run_id, a.attempt, r.job_name, r.kind, r.scheduled_for, a.started_at, a.finished_at,
       DATEDIFF_BIG(MILLISECOND, a.started_at, a.finished_at) AS duration_ms,
       a.outcome, a.error_number, a.error_sqlstate, a.error_message, a.worker, r.note, r.followed_run_id
FROM agent.attempts AS a
JOIN agent.runs AS r ON r.run_id = a.run_id
UNION ALL
SELECT r.run_id, NULL, r.job_name, r.kind, r.scheduled_for, r.started_at, r.finished_at, NULL,
       r.status, r.last_error_number, NULL, r.last_error, r.worker, r.note, r.followed_run_id
FROM agent.runs AS r
WHERE r.status IN (N'succeeded', N'failed', N'poisoned', N'skipped', N'cancelled')
  AND NOT EXISTS (SELECT 1 FROM agent.attempts AS x WHERE x.run_id = r.run_id)
GO

GRANT SELECT ON agent.job_history TO agent_operator;
GO

-- agent.add_scheduled_job (0008) redefined with @after and @after_outcome (new parameters last,
-- with defaults: every existing call means what it meant). Babelfish (issue 25): @run_at's
-- '@once' text takes ISO 8601's 'T' (STUFF at position 11: Babelfish writes style 126 with a
-- space, a no-op on SQL Server), and the name checks put the hyphen first in their LIKE classes
-- (see 0011).
ALTER PROCEDURE agent.add_scheduled_job
    @name NVARCHAR(4000),
    @sql NVARCHAR(MAX),
    @schedule NVARCHAR(4000) = NULL,
    @run_at DATETIMEOFFSET = NULL,
    @timezone NVARCHAR(4000) = N'UTC',
    @enabled INT = 1,
    @max_attempts INT = 3,
    @timeout_seconds INT = 1800,
    @overlap NVARCHAR(4000) = N'skip',
    @database NVARCHAR(4000) = NULL,
    @misfire NVARCHAR(4000) = N'run-once',
    @grace_seconds INT = 86400,
    @lease_seconds INT = 60,
    @targets NVARCHAR(4000) = NULL,
    @target_parallelism INT = 8,
    @after NVARCHAR(4000) = NULL,
    @after_outcome NVARCHAR(4000) = N'succeeded'
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.add_scheduled_job: ';
    IF @name IS NULL OR @name = N'' OR LEN(@name) > 64 OR @name COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%'
    BEGIN
        SET @message = @p + N'@name = ' + COALESCE(N'''' + REPLACE(@name, N'''', N'''''') + N'''', N'NULL')
            + N': expected a job name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF @sql IS NULL OR LTRIM(RTRIM(@sql)) = N''
    BEGIN
        SET @message = @p + N'@sql = ' + COALESCE(N'''' + REPLACE(@sql, N'''', N'''''') + N'''', N'NULL')
            + N': expected the SQL to run (non-empty)';
        THROW 51401, @message, 1;
    END;
    IF @schedule IS NOT NULL AND @run_at IS NOT NULL
    BEGIN
        SET @message = @p + N'@run_at = ' + CONVERT(NVARCHAR(40), @run_at, 127)
            + N': expected NULL when @schedule is given (one or the other)';
        THROW 51401, @message, 1;
    END;
    IF @schedule IS NOT NULL AND (LTRIM(RTRIM(@schedule)) = N'' OR LEN(@schedule) > 400)
    BEGIN
        SET @message = @p + N'@schedule = ''' + REPLACE(LEFT(@schedule, 80), N'''', N'''''')
            + N''': expected a six-field NCRONTAB expression (seconds first) of at most 400 characters';
        THROW 51401, @message, 1;
    END;
    IF @timezone IS NULL OR @timezone = N'' OR LEN(@timezone) > 64 OR @timezone COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_+/]%'
    BEGIN
        SET @message = @p + N'@timezone = ' + COALESCE(N'''' + REPLACE(@timezone, N'''', N'''''') + N'''', N'NULL')
            + N': expected an IANA time zone name such as UTC or Europe/Paris';
        THROW 51401, @message, 1;
    END;
    IF @enabled IS NULL OR @enabled NOT IN (0, 1)
    BEGIN
        SET @message = @p + N'@enabled = ' + COALESCE(CONVERT(NVARCHAR(20), @enabled), N'NULL')
            + N': expected 1 (enabled) or 0 (disabled)';
        THROW 51401, @message, 1;
    END;
    IF @max_attempts IS NULL OR @max_attempts NOT BETWEEN 1 AND 100
    BEGIN
        SET @message = @p + N'@max_attempts = ' + COALESCE(CONVERT(NVARCHAR(20), @max_attempts), N'NULL')
            + N': expected a whole number from 1 to 100';
        THROW 51401, @message, 1;
    END;
    IF @timeout_seconds IS NULL OR @timeout_seconds NOT BETWEEN 1 AND 604800
    BEGIN
        SET @message = @p + N'@timeout_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @timeout_seconds), N'NULL')
            + N': expected a whole number from 1 to 604800';
        THROW 51401, @message, 1;
    END;
    IF @overlap IS NULL OR LOWER(@overlap) NOT IN (N'skip', N'queue', N'allow')
    BEGIN
        SET @message = @p + N'@overlap = ' + COALESCE(N'''' + REPLACE(@overlap, N'''', N'''''') + N'''', N'NULL')
            + N': expected skip, queue or allow';
        THROW 51401, @message, 1;
    END;
    IF @database IS NOT NULL AND (@database = N'' OR LEN(@database) > 128 OR @database COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_]%')
    BEGIN
        SET @message = @p + N'@database = ''' + REPLACE(@database, N'''', N'''''')
            + N''': expected NULL (the control database) or a database name of 1 to 128 letters, digits, ''_'' or ''-''';
        THROW 51401, @message, 1;
    END;
    IF @misfire IS NULL OR LOWER(@misfire) NOT IN (N'run-once', N'skip')
    BEGIN
        SET @message = @p + N'@misfire = ' + COALESCE(N'''' + REPLACE(@misfire, N'''', N'''''') + N'''', N'NULL')
            + N': expected run-once or skip';
        THROW 51401, @message, 1;
    END;
    IF @grace_seconds IS NULL OR @grace_seconds NOT BETWEEN 0 AND 31622400
    BEGIN
        SET @message = @p + N'@grace_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @grace_seconds), N'NULL')
            + N': expected a whole number from 0 to 31622400';
        THROW 51401, @message, 1;
    END;
    IF @lease_seconds IS NULL OR @lease_seconds NOT BETWEEN 6 AND 3600
    BEGIN
        SET @message = @p + N'@lease_seconds = ' + COALESCE(CONVERT(NVARCHAR(20), @lease_seconds), N'NULL')
            + N': expected a whole number from 6 to 3600';
        THROW 51401, @message, 1;
    END;
    IF @targets IS NOT NULL AND (LTRIM(RTRIM(@targets)) = N'' OR LEN(@targets) > 4000)
    BEGIN
        SET @message = @p + N'@targets = ''' + REPLACE(LEFT(@targets, 80), N'''', N'''''')
            + N''': expected NULL (one database) or a comma list of at most 4000 characters of members such as db:tenant_*, server:<server> or -db:<name>';
        THROW 51401, @message, 1;
    END;
    IF @targets IS NOT NULL AND @database IS NOT NULL
    BEGIN
        SET @message = @p + N'@database = ''' + REPLACE(@database, N'''', N'''''')
            + N''': expected NULL when @targets is given (a job runs in its @targets or in one @database, not both)';
        THROW 51401, @message, 1;
    END;
    IF @target_parallelism IS NULL OR @target_parallelism NOT BETWEEN 1 AND 1000
    BEGIN
        SET @message = @p + N'@target_parallelism = ' + COALESCE(CONVERT(NVARCHAR(20), @target_parallelism), N'NULL')
            + N': expected a whole number from 1 to 1000 (how many target databases of one run at once)';
        THROW 51401, @message, 1;
    END;
    IF @after IS NOT NULL AND (@after = N'' OR LEN(@after) > 64 OR @after COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%')
    BEGIN
        SET @message = @p + N'@after = ''' + REPLACE(LEFT(@after, 80), N'''', N'''''')
            + N''': expected NULL (a job that follows no job) or the name of the job whose runs start this one';
        THROW 51401, @message, 1;
    END;
    IF @after_outcome IS NULL OR LOWER(@after_outcome) NOT IN (N'succeeded', N'failed', N'completed')
    BEGIN
        SET @message = @p + N'@after_outcome = ' + COALESCE(N'''' + REPLACE(LEFT(@after_outcome, 80), N'''', N'''''') + N'''', N'NULL')
            + N': expected succeeded, failed or completed';
        THROW 51401, @message, 1;
    END;
    -- Neither @schedule nor @run_at: an on-demand job (an empty schedule, as a settings job
    -- without SCHEDULE): it claims no slot and runs when started (agent.start_job).
    DECLARE @stored_schedule NVARCHAR(400) = COALESCE(LTRIM(RTRIM(@schedule)),
        N'@once ' + STUFF(CONVERT(NVARCHAR(30), CAST(SWITCHOFFSET(@run_at, '+00:00') AS DATETIME2(6)), 126), 11, 1, N'T')
            + N'+00:00',
        N'');
    DECLARE @action NVARCHAR(16) = N'defined';
    BEGIN TRANSACTION;
    -- The job-definitions lock: the settings sync and these procedures decide names one at a time.
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.add_scheduled_job: the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
    DECLARE @existing NVARCHAR(64);
    DECLARE @existing_in_database SMALLINT;
    DECLARE @existing_configured SMALLINT;
    -- The default collation compares names case-insensitively, as the settings do.
    SELECT @existing = j.job_name, @existing_in_database = j.defined_in_database, @existing_configured = j.configured
    FROM agent.jobs AS j WHERE j.job_name = @name;
    IF @existing IS NOT NULL AND CAST(@existing AS VARBINARY(128)) <> CAST(@name AS VARBINARY(128))
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a name no other job holds; it differs only by case from job '''
            + @existing + N''' (job names are compared case-insensitively, as Azure SQL does)';
        THROW 51409, @message, 1;
    END;
    IF @existing IS NOT NULL AND @existing_in_database = 0 AND @existing_configured = 1
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a job defined in the database; this job is defined in the app settings (JOB__'
            + @name + N'__*): change or remove it there';
        THROW 51409, @message, 1;
    END;
    IF @existing IS NOT NULL AND @existing_configured = 1
        SET @action = N'redefined';
    -- @after: a job that exists now (from the settings or from here), by its name as written, and
    -- no cycle: the chain of jobs it follows, walked up from it, never comes back to this one.
    DECLARE @leader NVARCHAR(64);
    DECLARE @cycle NVARCHAR(MAX);
    IF @after IS NOT NULL
    BEGIN
        SELECT @leader = j.job_name FROM agent.jobs AS j WHERE j.job_name = @after AND j.configured = 1;
        IF @leader IS NULL
        BEGIN
            SET @message = @p + N'@after = ''' + @after
                + N''': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
            THROW 51401, @message, 1;
        END;
        -- Walked at most 99 jobs up: within the recursion limit SQL Server keeps by default (100).
        WITH chain (job_name, after_job, shown, depth) AS (
            SELECT j.job_name, j.after_job, CAST(j.job_name AS NVARCHAR(MAX)), 1
            FROM agent.jobs AS j WHERE j.job_name = @leader
            UNION ALL
            SELECT j.job_name, j.after_job, CAST(j.job_name + N' -> ' + c.shown AS NVARCHAR(MAX)), c.depth + 1
            FROM chain AS c JOIN agent.jobs AS j ON j.job_name = c.after_job AND j.configured = 1
            WHERE c.job_name <> @name AND c.depth < 99)
        SELECT @cycle = c.shown FROM chain AS c WHERE c.job_name = @name;
        IF @cycle IS NOT NULL
        BEGIN
            SET @message = @p + N'@after = ''' + @after
                + N''': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                + @cycle + N' -> ' + @name + N': a run of each would start the next, forever)';
            THROW 51401, @message, 1;
        END;
    END;
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE job_name = @name AND kind = N'scheduled' AND status IN (N'pending', N'queued');
    IF @existing IS NOT NULL
        UPDATE agent.jobs SET schedule = @stored_schedule, timezone = @timezone, command = @sql,
            target_database = @database, enabled = @enabled, valid = 1, config_error = NULL,
            max_attempts = @max_attempts, timeout_seconds = @timeout_seconds, lease_seconds = @lease_seconds,
            misfire = LOWER(@misfire), grace_seconds = @grace_seconds, overlap = LOWER(@overlap),
            next_due_at = NULL, advanced_at = NULL, configured = 1, updated_at = @now,
            defined_in_database = 1, needs_planning = 1, steps = NULL,
            requested_targets = LTRIM(RTRIM(@targets)), requested_target_parallelism = @target_parallelism,
            owner = USER_NAME(), after_job = @leader,
            after_outcome = CASE WHEN @leader IS NOT NULL THEN LOWER(@after_outcome) END
        WHERE job_name = @name;
    ELSE
        INSERT INTO agent.jobs (job_name, schedule, timezone, command, target_database, enabled, valid,
                                config_error, max_attempts, timeout_seconds, lease_seconds, misfire,
                                grace_seconds, overlap, next_due_at, advanced_at, configured, updated_at,
                                defined_in_database, needs_planning, steps, requested_targets,
                                requested_target_parallelism, owner, after_job, after_outcome)
        VALUES (@name, @stored_schedule, @timezone, @sql, @database, @enabled, 1, NULL, @max_attempts,
                @timeout_seconds, @lease_seconds, LOWER(@misfire), @grace_seconds, LOWER(@overlap), NULL, NULL, 1,
                @now, 1, 1, NULL, LTRIM(RTRIM(@targets)), @target_parallelism, USER_NAME(),
                @leader, CASE WHEN @leader IS NOT NULL THEN LOWER(@after_outcome) END);
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @action AS action;
END
GO
