-- 0012 chains and pauses (issue 34, items 3 to 6); see the PostgreSQL file of the same number.
--
-- Item 3: agent.add_scheduled_job checks @after against every job defined now, removed ones that
-- this call defines again included, a self-reference refused before the name is looked up, the
-- walk up the chain a loop (no recursion limit) visiting each job once. A redefinition lets the
-- next tick sync the settings again.
-- Item 4: agent.runs.chain, the jobs of the runs that led to a follow-up run.
-- Items 5 and 6: slots a pause recorded skipped ahead come back when it no longer holds them
-- (agent.settle_paused_runs, called by pause_job and resume_job and their named queries).

SET XACT_ABORT ON;
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
GO

-- agent.add_scheduled_job (0010) redefined: the cycle check of issue 34 item 3, the paused slots
-- ahead of a redefined job, the settings synced again. ALTER PROCEDURE keeps the grants.
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
    -- @after: no cycle, checked first (a job that follows itself need not exist yet); then a job
    -- that exists now (from the settings or from here), by its name as written; then the chain of
    -- jobs it follows, walked up from it one job at a time through every job defined now (either
    -- source, enabled or not), never reaches a job that follows this one's name, whether or not a
    -- job of that name exists now (it was removed, and this call defines it again). The default
    -- collation compares names case-insensitively; the walk visits each job once at most, with no
    -- recursion limit (a recursive CTE stops at 100 levels by default).
    DECLARE @leader NVARCHAR(64);
    DECLARE @cycle NVARCHAR(MAX);
    IF @after IS NOT NULL AND @after = @name
    BEGIN
        SET @message = @p + N'@after = ''' + @after
            + N''': expected a chain that ends; this one is a cycle of jobs that follow each other ('
            + @name + N' -> ' + @name + N': a run of each would start the next, forever)';
        THROW 51401, @message, 1;
    END;
    IF @after IS NOT NULL
    BEGIN
        SELECT @leader = j.job_name FROM agent.jobs AS j WHERE j.job_name = @after AND j.configured = 1;
        IF @leader IS NULL
        BEGIN
            SET @message = @p + N'@after = ''' + @after
                + N''': expected the name of a job defined in the app settings or with agent.add_scheduled_job (no job has this name)';
            THROW 51401, @message, 1;
        END;
        DECLARE @walk TABLE (ord INT PRIMARY KEY, job_name NVARCHAR(64));
        DECLARE @current NVARCHAR(64) = @leader;
        DECLARE @found NVARCHAR(64);
        DECLARE @up NVARCHAR(64);
        DECLARE @steps INT = 0;
        DECLARE @closed INT = 0;
        WHILE @current IS NOT NULL AND @closed = 0
        BEGIN
            SET @found = NULL;
            SET @up = NULL;
            SELECT @found = j.job_name, @up = j.after_job FROM agent.jobs AS j
            WHERE j.job_name = @current AND j.configured = 1;
            IF @found IS NULL
                BREAK;
            SET @steps = @steps + 1;
            INSERT INTO @walk (ord, job_name) VALUES (@steps, @found);
            IF @up = @name
                SET @closed = 1;
            ELSE IF @up IS NULL OR EXISTS (SELECT 1 FROM @walk AS w WHERE w.job_name = @up)
                SET @current = NULL;
            ELSE
                SET @current = @up;
        END;
        IF @closed = 1
        BEGIN
            -- In the order runs start each other (the walk reversed); a long cycle shows its first
            -- and last four jobs and how many between (shared/jobs/chains.py, show_chain). Put
            -- together by position (Babelfish refuses STRING_AGG ... WITHIN GROUP): the last
            -- four walked, then the first four (for 8 jobs or fewer, the ones below them).
            DECLARE @long INT = CASE WHEN @steps > 8 THEN 1 ELSE 0 END;
            SELECT @cycle = CONCAT(
                       MAX(CASE WHEN w.ord = @steps THEN w.job_name END),
                       MAX(CASE WHEN w.ord = @steps - 1 THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = @steps - 2 THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = @steps - 3 THEN N' -> ' + w.job_name END),
                       CASE WHEN @long = 1 THEN N' -> ... (' + CONVERT(NVARCHAR(20), @steps - 8) + N' more)' END,
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 4 ELSE @steps - 4 END THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 3 ELSE @steps - 5 END THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 2 ELSE @steps - 6 END THEN N' -> ' + w.job_name END),
                       MAX(CASE WHEN w.ord = CASE WHEN @long = 1 THEN 1 ELSE @steps - 7 END THEN N' -> ' + w.job_name END))
            FROM @walk AS w;
            SET @message = @p + N'@after = ''' + @after
                + N''': expected a chain that ends; this one is a cycle of jobs that follow each other ('
                + @name + N' -> ' + @cycle + N' -> ' + @name + N': a run of each would start the next, forever)';
            THROW 51401, @message, 1;
        END;
    END;
    -- The slots claimed under the old definition, those a pause recorded skipped ahead included
    -- (a resume must not bring back a slot of a schedule that is gone).
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed'
    WHERE job_name = @name AND kind = N'scheduled'
      AND (status IN (N'pending', N'queued')
           OR (status = N'skipped' AND note = N'paused' AND attempt = 0 AND scheduled_for >= @now));
    -- A settings job refused because its AFTER closed a cycle through this job may be valid now:
    -- the next tick syncs the settings again.
    DELETE FROM agent.state WHERE state_key = N'job_config_hash';
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

-- Item 4: the chain of jobs a follow-up run carries (N'/a/b/': the jobs of the runs whose ends
-- led to it, the first first; NULL for a run no end started).
ALTER TABLE agent.runs ADD chain NVARCHAR(MAX) NULL;
GO

-- Items 5 and 6: what a pause decided about a job's runs, decided again whenever the pause
-- changes (pause_job, a new @until, resume_job), against the pause as it now stands: the window
-- [@pause_start, @pause_end) (@pause_end NULL: until resumed; resume_job passes its own time).
-- The runs looked at are the job's scheduled slots that never started and that a pause decided
-- or may decide: those recorded skipped 'paused' from @pause_start on, and those waiting for a
-- time to come (pending or queued, runnable from @now on). Each becomes: a slot at or after the
-- end: pending (or left queued), runnable at its slot; under misfire run-once, the last slot
-- before a known end, when every slot before the end is claimed, no slot falls at the end
-- itself, and it is within GRACE_SECONDS of the end (or of now, if later): the catch-up,
-- runnable at the end (at resume, outside the grace: skipped with the grace note); any other:
-- skipped 'paused'. Only runs whose decision changes are written (with a new token, which
-- fences a message sent before). A disabled, invalid or removed job has nothing brought back.
-- The decisions are made into a table variable first, then written by one UPDATE; the counts
-- come back in OUTPUT parameters (the settle_paused_runs named query reads them).
CREATE PROCEDURE agent.settle_paused_runs
    @job_name NVARCHAR(64),
    @now DATETIME2(6),
    @pause_start DATETIME2(6),
    @pause_end DATETIME2(6),
    @runs_skipped INT OUTPUT,
    @runs_resumed INT OUTPUT,
    @runs_caught_up INT OUTPUT
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @misfire NVARCHAR(16);
    DECLARE @grace INT;
    DECLARE @next_due DATETIME2(6);
    DECLARE @active INT = 0;
    SELECT @misfire = j.misfire, @grace = j.grace_seconds, @next_due = j.next_due_at, @active = 1
    FROM agent.jobs AS j
    WHERE j.job_name = @job_name AND j.enabled = 1 AND j.valid = 1 AND j.configured = 1;
    DECLARE @resume_at DATETIME2(6) = CASE WHEN @pause_end IS NULL THEN NULL WHEN @pause_end > @now THEN @pause_end ELSE @now END;
    DECLARE @latest DATETIME2(6) = NULL;
    IF @pause_end IS NOT NULL
        SELECT @latest = MAX(r.scheduled_for) FROM agent.runs AS r
        WHERE r.job_name = @job_name AND r.kind = N'scheduled' AND r.attempt = 0 AND @active = 1
          AND ((r.status = N'skipped' AND r.note = N'paused' AND r.scheduled_for >= @pause_start)
               OR (r.status IN (N'pending', N'queued') AND r.runnable_at >= @now))
          AND r.scheduled_for < @pause_end;
    DECLARE @catch_up INT = 0;
    IF @latest IS NOT NULL AND @misfire = N'run-once' AND (@next_due IS NULL OR @next_due > @pause_end)
       AND NOT EXISTS (SELECT 1 FROM agent.runs AS e
                       WHERE e.job_name = @job_name AND e.kind = N'scheduled' AND e.scheduled_for = @pause_end)
        SET @catch_up = CASE WHEN DATEADD(SECOND, @grace, @latest) >= @resume_at THEN 1
                             WHEN @pause_end <= @now THEN 2 ELSE 0 END;
    DECLARE @changed TABLE (run_id BIGINT PRIMARY KEY, was NVARCHAR(16), to_status NVARCHAR(16), to_note NVARCHAR(200),
                            to_runnable DATETIME2(6));
    INSERT INTO @changed (run_id, was, to_status, to_note, to_runnable)
    SELECT t.run_id, t.status, t.to_status, t.to_note, t.to_runnable
    FROM (SELECT d.run_id, d.status, d.note, d.runnable_at,
                 CASE WHEN d.decision = N'slot' THEN
                           CASE WHEN d.status = N'queued' AND d.runnable_at = d.scheduled_for THEN N'queued' ELSE N'pending' END
                      WHEN d.decision = N'catch_up' THEN
                           CASE WHEN d.status = N'queued' AND d.runnable_at = @resume_at THEN N'queued' ELSE N'pending' END
                      ELSE N'skipped' END AS to_status,
                 CASE d.decision WHEN N'slot' THEN NULL WHEN N'catch_up' THEN N'misfire: caught up late, once'
                      WHEN N'too_late' THEN N'misfire: slot older than the job''s GRACE_SECONDS; skipped'
                      ELSE N'paused' END AS to_note,
                 CASE d.decision WHEN N'slot' THEN d.scheduled_for WHEN N'catch_up' THEN @resume_at
                      ELSE d.runnable_at END AS to_runnable
          FROM (SELECT r.run_id, r.scheduled_for, r.status, r.note, r.runnable_at,
                       CASE WHEN @pause_end IS NOT NULL AND r.scheduled_for >= @pause_end THEN N'slot'
                            WHEN r.scheduled_for = @latest AND @catch_up = 1 THEN N'catch_up'
                            WHEN r.scheduled_for = @latest AND @catch_up = 2 THEN N'too_late'
                            ELSE N'held' END AS decision
                FROM agent.runs AS r
                WHERE r.job_name = @job_name AND r.kind = N'scheduled' AND r.attempt = 0 AND @active = 1
                  AND ((r.status = N'skipped' AND r.note = N'paused' AND r.scheduled_for >= @pause_start)
                       OR (r.status IN (N'pending', N'queued') AND r.runnable_at >= @now))) AS d) AS t
    WHERE t.to_status <> t.status OR t.runnable_at <> t.to_runnable
       OR (t.note IS NULL AND t.to_note IS NOT NULL) OR (t.note IS NOT NULL AND t.to_note IS NULL)
       OR t.note <> t.to_note;
    UPDATE r SET status = c.to_status, note = c.to_note, runnable_at = c.to_runnable,
        finished_at = CASE WHEN c.to_status <> N'skipped' THEN NULL WHEN c.was = N'skipped' THEN r.finished_at ELSE @now END,
        lease_expires_at = NULL, token = r.token + 1
    FROM agent.runs AS r, @changed AS c
    WHERE c.run_id = r.run_id;
    SELECT @runs_skipped = COUNT(CASE WHEN c.to_status = N'skipped' AND c.was <> N'skipped' THEN 1 END),
           @runs_resumed = COUNT(CASE WHEN c.to_status <> N'skipped' AND c.to_note IS NULL THEN 1 END),
           @runs_caught_up = COUNT(CASE WHEN c.to_status <> N'skipped' AND c.to_note IS NOT NULL THEN 1 END)
    FROM @changed AS c;
END
GO

-- agent.pause_job (0009) with the settled runs: what the new pause holds is recorded skipped
-- 'paused', what it no longer holds (a new @until before a slot a longer pause held) comes back.
ALTER PROCEDURE agent.pause_job
    @job_name NVARCHAR(4000),
    @until DATETIMEOFFSET = NULL,
    @reason NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @until_utc DATETIME2(6) = CAST(SWITCHOFFSET(@until, '+00:00') AS DATETIME2(6));
    DECLARE @by NVARCHAR(256) = USER_NAME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.pause_job: ';
    IF @job_name IS NULL
        THROW 51401, N'agent.pause_job: @job_name = NULL: expected the name of a job', 1;
    IF @until_utc IS NOT NULL AND @until_utc <= @now
    BEGIN
        SET @message = @p + N'@until = ''' + CONVERT(NVARCHAR(40), @until, 127)
            + N''': expected a time after now (the database''s clock: ' + CONVERT(NVARCHAR(40), @now, 126)
            + N' UTC), or NULL (until agent.resume_job)';
        THROW 51401, @message, 1;
    END;
    IF @reason IS NOT NULL AND LEN(@reason) > 400
    BEGIN
        SET @message = @p + N'@reason = ''' + REPLACE(LEFT(@reason, 80), N'''', N'''''')
            + N'''...: expected NULL or at most 400 characters';
        THROW 51401, @message, 1;
    END;
    BEGIN TRANSACTION;
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.pause_job: the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name AND j.configured = 1)
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
        THROW 51404, @message, 1;
    END;
    -- Update-then-insert under the lock (no MERGE: Babelfish refuses it).
    UPDATE agent.job_pauses
    SET paused_at = CASE WHEN paused_until IS NULL OR paused_until > @now THEN paused_at ELSE @now END,
        paused_until = @until_utc, paused_by = @by, reason = @reason
    WHERE job_name = @job_name;
    IF @@ROWCOUNT = 0
        INSERT INTO agent.job_pauses (job_name, paused_at, paused_until, paused_by, reason)
        VALUES (@job_name, @now, @until_utc, @by, @reason);
    DECLARE @start DATETIME2(6) = (SELECT x.paused_at FROM agent.job_pauses AS x WHERE x.job_name = @job_name);
    DECLARE @skipped INT = 0;
    DECLARE @resumed INT = 0;
    DECLARE @caught_up INT = 0;
    EXEC agent.settle_paused_runs @job_name = @job_name, @now = @now, @pause_start = @start, @pause_end = @until_utc,
         @runs_skipped = @skipped OUTPUT, @runs_resumed = @resumed OUTPUT, @runs_caught_up = @caught_up OUTPUT;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (@job_name, @now, N'paused',
            N'paused by ' + COALESCE(@by, N'?') + N' (agent.pause_job) '
            + COALESCE(N'until ' + CONVERT(NVARCHAR(19), @until_utc, 126) + N' UTC', N'until resumed')
            + COALESCE(N': ' + @reason, N'') + N'; ' + CONVERT(NVARCHAR(20), @skipped) + N' claimed slot(s) skipped');
    COMMIT TRANSACTION;
    SELECT x.paused_at, x.paused_until, x.paused_by, @skipped AS runs_skipped
    FROM agent.job_pauses AS x WHERE x.job_name = @job_name;
END
GO

-- agent.resume_job (0009) with the settled runs: the slots claimed ahead that the pause had
-- recorded skipped run at their time, and the misfire policy decides the last slot it held.
ALTER PROCEDURE agent.resume_job
    @job_name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.resume_job: ';
    IF @job_name IS NULL
        THROW 51401, N'agent.resume_job: @job_name = NULL: expected the name of a job', 1;
    BEGIN TRANSACTION;
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_pauses', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.resume_job: the pauses lock (sp_getapplock agent.job_pauses) was not granted within 30 s', 1;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs AS j WHERE j.job_name = @job_name)
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(LEFT(@job_name, 80), N'''', N'''''')
            + N''': expected the name of a job the agent knows; there is no such job';
        THROW 51404, @message, 1;
    END;
    DECLARE @paused_at DATETIME2(6);
    SELECT @paused_at = x.paused_at FROM agent.job_pauses AS x
    WHERE x.job_name = @job_name AND (x.paused_until IS NULL OR x.paused_until > @now);
    IF @paused_at IS NULL
    BEGIN
        SET @message = @p + N'@job_name = ''' + REPLACE(@job_name, N'''', N'''''') + N''': expected a paused job; it is not paused';
        THROW 51409, @message, 1;
    END;
    DELETE FROM agent.job_pauses WHERE job_name = @job_name;
    DECLARE @skipped INT = 0;
    DECLARE @resumed INT = 0;
    DECLARE @caught_up INT = 0;
    EXEC agent.settle_paused_runs @job_name = @job_name, @now = @now, @pause_start = @paused_at, @pause_end = @now,
         @runs_skipped = @skipped OUTPUT, @runs_resumed = @resumed OUTPUT, @runs_caught_up = @caught_up OUTPUT;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (@job_name, @now, N'resumed',
            N'resumed by ' + COALESCE(USER_NAME(), N'?') + N' (agent.resume_job); paused since '
            + CONVERT(NVARCHAR(19), @paused_at, 126) + N' UTC; ' + CONVERT(NVARCHAR(20), @resumed)
            + N' slot(s) claimed ahead run at their time, ' + CONVERT(NVARCHAR(20), @caught_up) + N' caught up');
    COMMIT TRANSACTION;
    SELECT @paused_at AS paused_at, @now AS resumed_at;
END
GO

-- agent.remove_scheduled_job (0005): the paused slots claimed ahead become slots of a removed
-- job too (a resume must not bring them back: a job defined later under the name may differ).
ALTER PROCEDURE agent.remove_scheduled_job
    @name NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
    DECLARE @message NVARCHAR(2048);
    DECLARE @p NVARCHAR(40) = N'agent.remove_scheduled_job: ';
    IF @name IS NULL
        THROW 51401, N'agent.remove_scheduled_job: @name = NULL: expected the name of a job defined by agent.add_scheduled_job', 1;
    BEGIN TRANSACTION;
    DECLARE @lock_result INT;
    EXEC @lock_result = sp_getapplock @Resource = N'agent.job_definitions', @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
    IF @lock_result < 0 THROW 51409, N'agent.remove_scheduled_job: the job-definitions lock (sp_getapplock agent.job_definitions) was not granted within 30 s', 1;
    DECLARE @existing_in_database SMALLINT;
    SELECT @existing_in_database = j.defined_in_database FROM agent.jobs AS j WHERE j.job_name = @name AND j.configured = 1;
    IF @existing_in_database IS NULL
    BEGIN
        SET @message = @p + N'@name = ''' + REPLACE(@name, N'''', N'''''')
            + N''': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
        THROW 51404, @message, 1;
    END;
    IF @existing_in_database = 0
    BEGIN
        SET @message = @p + N'@name = ''' + @name + N''': expected a job defined in the database; this job is defined in the app settings (JOB__'
            + @name + N'__*): remove it there';
        THROW 51409, @message, 1;
    END;
    UPDATE agent.runs SET status = N'skipped', finished_at = @now, lease_expires_at = NULL,
        note = N'skipped: the job was removed by agent.remove_scheduled_job after this slot was claimed'
    WHERE job_name = @name AND kind = N'scheduled'
      AND (status IN (N'pending', N'queued')
           OR (status = N'skipped' AND note = N'paused' AND attempt = 0 AND scheduled_for >= @now));
    DECLARE @skipped INT = @@ROWCOUNT;
    UPDATE agent.jobs SET configured = 0, next_due_at = NULL, needs_planning = 0, updated_at = @now
    WHERE job_name = @name;
    DELETE FROM agent.state WHERE state_key = N'job_config_hash';
    COMMIT TRANSACTION;
    SELECT @name AS job_name, @skipped AS skipped_runs;
END
GO
