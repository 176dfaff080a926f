-- 0015 slots after a change of a job's state (issue 34, items 4 to 6 follow-up).
--
-- A change of a job's definition (disabled, removed, redefined, its schedule changed) records
-- the slots it had claimed ahead skipped, and a skipped slot was never claimed again (the
-- unique (job_name, scheduled_for) key): a job disabled and enabled again at once, removed and
-- added back, or given a schedule whose slots fall at the same instants as the old one's, lost
-- every slot up to the next tick's horizon. Now the slots the definition in force runs are its
-- own again:
-- * at once, by agent.enable_job @enabled = 1: the slots its disable recorded skipped, when the
--   job has not changed since, that have not come (then the pause in force, if any, decides
--   them again: agent.settle_paused_runs);
-- * by the claim (the claim_slots named query), for every other change: a slot the definition
--   in force plans whose run a definition change recorded skipped, never started, is claimed
--   again in place (the run takes the definition's values and the planned decision).
-- agent.enable_job @enabled = 0 records the slots a pause had recorded skipped ahead as
-- disabled too (as the other definition changes do), so enabling gives them back and the pause
-- decides them. Both directions record a job event ('enabled', 'disabled').
--
-- agent.jobs.definition_hash: what the settings sync last wrote for a settings job (a digest of
-- every setting it writes); a sync that changes nothing leaves the row and its updated_at alone.

ALTER TABLE agent.jobs ADD COLUMN definition_hash VARCHAR(64) NULL;

-- agent.enable_job (0005) with the slots given back; the result gains resumed_runs (a new
-- result type: dropped and created again, its grants with it).
DROP FUNCTION agent.enable_job(varchar, int);
CREATE FUNCTION agent.enable_job(name varchar, enabled int DEFAULT 1)
RETURNS TABLE (job_name varchar, skipped_runs int, resumed_runs int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_existing record;
    v_pause record;
    v_settled record;
    v_skipped int := 0;
    v_resumed int := 0;
    p text := 'agent.enable_job: ';
BEGIN
    IF enable_job.name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = NULL: expected the name of a job defined by agent.add_scheduled_job';
    END IF;
    IF enable_job.enabled IS NULL OR enable_job.enabled NOT IN (0, 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@enabled = '
            || COALESCE(enable_job.enabled::text, 'NULL') || ': expected 1 (enable) or 0 (disable)';
    END IF;
    -- The job-definitions lock, then the pauses lock (the order a tick's claim takes them, shared):
    -- a claim in flight commits first, and what comes back is decided against the pause as it stands.
    PERFORM pg_advisory_xact_lock(7428014);
    PERFORM pg_advisory_xact_lock(7428015);
    SELECT j.job_name, j.defined_in_database, j.enabled, j.updated_at INTO v_existing FROM agent.jobs j
    WHERE j.job_name = enable_job.name AND j.configured = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@name = ' || quote_literal(left(enable_job.name, 80))
            || ': expected the name of a job defined by agent.add_scheduled_job; there is no such job';
    END IF;
    IF v_existing.defined_in_database = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@name = ' || quote_literal(enable_job.name)
            || ': expected a job defined in the database; this job is defined in the app settings: set JOB__'
            || enable_job.name || '__ENABLED there';
    END IF;
    IF v_existing.enabled = enable_job.enabled THEN
        RETURN QUERY SELECT CAST(enable_job.name AS varchar), 0, 0;
        RETURN;
    END IF;
    UPDATE agent.jobs AS j SET enabled = enable_job.enabled, needs_planning = enable_job.enabled,
        next_due_at = NULL, advanced_at = NULL, updated_at = v_now
    WHERE j.job_name = enable_job.name;
    IF enable_job.enabled = 0 THEN
        -- Its slots claimed ahead, and those a pause recorded skipped ahead (enabling gives them
        -- back and lets the pause decide them again).
        UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
            note = 'skipped: the job was disabled by agent.enable_job after this slot was claimed'
        WHERE r.job_name = enable_job.name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued');
        GET DIAGNOSTICS v_skipped = ROW_COUNT;
        UPDATE agent.runs AS r SET finished_at = v_now,
            note = 'skipped: the job was disabled by agent.enable_job after this slot was claimed'
        WHERE r.job_name = enable_job.name AND r.kind = 'scheduled' AND r.status = 'skipped' AND r.note = 'paused'
          AND r.attempt = 0 AND r.scheduled_for >= v_now;
        INSERT INTO agent.job_events (job_name, event_at, kind, detail)
        VALUES (enable_job.name, v_now, 'disabled',
                'disabled (agent.enable_job); ' || v_skipped || ' claimed slot(s) skipped');
    ELSE
        -- The slots the disable recorded skipped (at the instant it changed the job: nothing has
        -- changed it since) that have not come: the job's again, runnable at their time, with a
        -- new token (it fences a message sent before) and operation id. The planning that follows
        -- claims the slots after them.
        UPDATE agent.runs AS r SET status = 'pending', note = NULL, runnable_at = r.scheduled_for,
            finished_at = NULL, lease_expires_at = NULL, dispatched_at = NULL, last_error = NULL,
            last_error_number = NULL, token = r.token + 1, created_at = v_now,
            operation_id = md5(random()::text || clock_timestamp()::text || CAST(r.run_id AS text))
        WHERE r.job_name = enable_job.name AND r.kind = 'scheduled' AND r.status = 'skipped' AND r.attempt = 0
          AND r.note = 'skipped: the job was disabled by agent.enable_job after this slot was claimed'
          AND r.finished_at = v_existing.updated_at AND r.scheduled_for > v_now;
        GET DIAGNOSTICS v_resumed = ROW_COUNT;
        SELECT x.paused_at, x.paused_until INTO v_pause FROM agent.job_pauses AS x
        WHERE x.job_name = enable_job.name AND (x.paused_until IS NULL OR x.paused_until > v_now);
        IF FOUND THEN
            SELECT * INTO v_settled
            FROM agent.settle_paused_runs(enable_job.name, v_now, v_pause.paused_at, v_pause.paused_until);
            v_resumed := v_resumed - v_settled.runs_skipped;
        END IF;
        INSERT INTO agent.job_events (job_name, event_at, kind, detail)
        VALUES (enable_job.name, v_now, 'enabled',
                'enabled (agent.enable_job); ' || v_resumed || ' slot(s) claimed ahead run at their time');
    END IF;
    RETURN QUERY SELECT CAST(enable_job.name AS varchar), v_skipped, v_resumed;
END
$$;
REVOKE ALL ON FUNCTION agent.enable_job(varchar, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.enable_job(varchar, int) TO agent_operator;
