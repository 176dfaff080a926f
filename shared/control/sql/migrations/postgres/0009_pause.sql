-- 0009 pause and resume (issue 27, item 2): a job paused claims no slot until it is resumed, or
-- until its pause ends by itself (@until, the database's clock); each slot that comes while it
-- is paused is recorded as a run skipped with the note 'paused', so the history shows the gap.
--
-- The pause is state of its own, not a column of agent.jobs: the settings sync rewrites every
-- job from the app settings (upsert_jobs) and never touches this table, so a pause survives any
-- sync, and a job from the settings is paused as a job defined from T-SQL is. One row per job;
-- a row whose paused_until has passed is a pause that ended (the tick and the views read it as
-- none; the next pause replaces it).
CREATE TABLE agent.job_pauses (
    job_name     VARCHAR(64) PRIMARY KEY,
    paused_at    TIMESTAMP NOT NULL,
    paused_until TIMESTAMP NULL,
    paused_by    VARCHAR(256) NULL,
    reason       VARCHAR(400) NULL,
    CONSTRAINT job_pauses_until CHECK (paused_until IS NULL OR paused_until > paused_at)
);

-- agent.pause_job: what `sql-agent pause` does (the pause_job named query), with the caller's
-- login as paused_by and the server's clock. Under the pauses lock (advisory 7428015), which a
-- tick's claim holds shared to its commit: a tick claiming meanwhile either commits first (its
-- claims inside the pause are then skipped here) or waits and sees the pause.
CREATE FUNCTION agent.pause_job(job_name varchar, until timestamptz DEFAULT NULL, reason varchar DEFAULT NULL)
RETURNS TABLE (paused_at timestamp, paused_until timestamp, paused_by varchar, runs_skipped int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_until timestamp;
    v_skipped int := 0;
    p text := 'agent.pause_job: ';
BEGIN
    IF pause_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    IF pause_job.until IS NOT NULL AND NOT (pause_job.until >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                            AND pause_job.until < TIMESTAMPTZ '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@until = '
            || quote_literal(pause_job.until::text) || ': expected a date and time from 0001-01-01 to 9999-12-31 (UTC), or NULL (until agent.resume_job)';
    END IF;
    v_until := CAST(pause_job.until AT TIME ZONE 'UTC' AS timestamp);
    IF v_until IS NOT NULL AND v_until <= v_now THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@until = '
            || quote_literal(pause_job.until::text) || ': expected a time after now (the database''s clock: '
            || to_char(v_now, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC), or NULL (until agent.resume_job)';
    END IF;
    IF pause_job.reason IS NOT NULL AND length(pause_job.reason) > 400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@reason = '
            || quote_literal(left(pause_job.reason, 80)) || '...: expected NULL or at most 400 characters';
    END IF;
    PERFORM pg_advisory_xact_lock(7428015);
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = pause_job.job_name AND j.configured = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(pause_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job (a job added to the settings is known after the agent''s next tick)';
    END IF;
    INSERT INTO agent.job_pauses AS x (job_name, paused_at, paused_until, paused_by, reason)
    VALUES (pause_job.job_name, v_now, v_until, CAST(session_user AS varchar), pause_job.reason)
    ON CONFLICT ON CONSTRAINT job_pauses_pkey DO UPDATE SET
        paused_at = CASE WHEN x.paused_until IS NULL OR x.paused_until > v_now THEN x.paused_at ELSE EXCLUDED.paused_at END,
        paused_until = EXCLUDED.paused_until, paused_by = EXCLUDED.paused_by, reason = EXCLUDED.reason;
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL, note = 'paused'
    WHERE r.job_name = pause_job.job_name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued')
      AND r.scheduled_for >= v_now AND (v_until IS NULL OR r.scheduled_for < v_until);
    GET DIAGNOSTICS v_skipped = ROW_COUNT;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (pause_job.job_name, v_now, 'paused',
            'paused by ' || CAST(session_user AS varchar) || ' (agent.pause_job) '
            || COALESCE('until ' || to_char(v_until, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC', 'until resumed')
            || COALESCE(': ' || pause_job.reason, '') || '; ' || v_skipped || ' claimed slot(s) skipped');
    RETURN QUERY SELECT x.paused_at, x.paused_until, x.paused_by, v_skipped
    FROM agent.job_pauses AS x WHERE x.job_name = pause_job.job_name;
END
$$;

-- agent.resume_job: what `sql-agent resume` does (the resume_job named query). The job's misfire
-- policy decides the slots missed: under run-once the latest slot of the pause was held back
-- (not recorded) and is caught up once if within GRACE_SECONDS; under skip none runs.
CREATE FUNCTION agent.resume_job(job_name varchar)
RETURNS TABLE (paused_at timestamp, resumed_at timestamp)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_paused_at timestamp;
    p text := 'agent.resume_job: ';
BEGIN
    IF resume_job.job_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@job_name = NULL: expected the name of a job';
    END IF;
    PERFORM pg_advisory_xact_lock(7428015);
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = resume_job.job_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || quote_literal(left(resume_job.job_name, 80))
            || ': expected the name of a job the agent knows; there is no such job';
    END IF;
    DELETE FROM agent.job_pauses AS x
    WHERE x.job_name = resume_job.job_name AND (x.paused_until IS NULL OR x.paused_until > v_now)
    RETURNING x.paused_at INTO v_paused_at;
    IF v_paused_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = p || '@job_name = ' || quote_literal(resume_job.job_name)
            || ': expected a paused job; it is not paused';
    END IF;
    INSERT INTO agent.job_events (job_name, event_at, kind, detail)
    VALUES (resume_job.job_name, v_now, 'resumed',
            'resumed by ' || CAST(session_user AS varchar) || ' (agent.resume_job); paused since '
            || to_char(v_paused_at, 'YYYY-MM-DD"T"HH24:MI:SS') || ' UTC');
    RETURN QUERY SELECT v_paused_at, v_now;
END
$$;

-- agent.job_activity (0005) redefined: state 'paused' (a pause in force at the server's clock;
-- its run in flight, if any, still shows in running_run_id) and the pause's columns.
DROP VIEW agent.job_activity;
CREATE VIEW agent.job_activity AS
SELECT j.job_name,
       CASE WHEN j.defined_in_database = 1 THEN 'database' ELSE 'settings' END AS defined_in,
       CASE WHEN j.configured = 0 THEN 'removed' WHEN j.valid = 0 THEN 'invalid'
            WHEN j.enabled = 0 THEN 'disabled' WHEN j.needs_planning = 1 THEN 'planning'
            WHEN p.job_name IS NOT NULL THEN 'paused' WHEN c.run_id IS NOT NULL THEN 'running'
            WHEN j.next_due_at IS NULL AND n.next_slot IS NULL THEN 'idle' ELSE 'scheduled' END AS state,
       j.enabled, j.schedule, j.timezone, COALESCE(n.next_slot, j.next_due_at) AS next_run_at,
       c.run_id AS running_run_id, c.started_at AS running_since, c.worker AS running_worker,
       l.run_id AS last_run_id, l.status AS last_outcome, l.finished_at AS last_finished_at,
       l.last_error AS last_error, j.config_error,
       p.paused_at, p.paused_until, p.paused_by, p.reason AS pause_reason
FROM agent.jobs AS j
LEFT JOIN agent.job_pauses AS p
       ON p.job_name = j.job_name
      AND (p.paused_until IS NULL OR p.paused_until > CAST(now() AT TIME ZONE 'UTC' AS timestamp))
LEFT JOIN LATERAL (
    SELECT r.run_id, r.started_at, r.worker FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status = 'running'
    ORDER BY r.started_at, r.run_id LIMIT 1) AS c ON TRUE
LEFT JOIN LATERAL (
    SELECT MIN(r.scheduled_for) AS next_slot FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.kind = 'scheduled' AND r.status IN ('pending', 'queued')) AS n ON TRUE
LEFT JOIN LATERAL (
    SELECT r.run_id, r.status, r.finished_at, r.last_error FROM agent.runs AS r
    WHERE r.job_name = j.job_name AND r.status IN ('succeeded', 'failed', 'poisoned', 'skipped', 'cancelled')
    ORDER BY r.scheduled_for DESC, r.run_id DESC LIMIT 1) AS l ON TRUE;

REVOKE ALL ON FUNCTION agent.pause_job(varchar, timestamptz, varchar) FROM PUBLIC;
REVOKE ALL ON FUNCTION agent.resume_job(varchar) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.pause_job(varchar, timestamptz, varchar) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.resume_job(varchar) TO agent_operator;
GRANT SELECT ON agent.job_activity TO agent_operator;
