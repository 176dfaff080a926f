-- 0028 steps for the jobs defined in the database (issue 32 item 6; SQL Server Agent's
-- sp_add_jobstep): agent.set_job_steps @job_name, @steps records a database job's steps as
-- requested (agent.jobs.requested_steps: the JSON array as given, NULL: none) and sets
-- needs_planning = 1, as agent.set_job_calendars records its calendars; the engine's planning
-- (shared/engine/planning.py) validates them with the rules of JOB__<name>__STEPS__<n>__*
-- (shared/jobs/steps.py) and writes agent.jobs.steps exactly as the settings sync writes the same
-- steps, or makes that job alone invalid in words naming `agent.set_job_steps @steps`. A
-- redefinition by agent.add_scheduled_job keeps them (as it keeps calendars and parameters); NULL
-- or '[]' clears them. The slots claimed ahead with the old steps are recorded skipped, as a
-- redefinition records them, and claimed again in place with the new ones.
--
-- Steps are SQL that runs as the job's owner: only its owner, a role that is a member of the
-- owner's role, or a superuser may set them (anyone else may redefine the job with
-- agent.add_scheduled_job, which makes the caller its owner). That check is the audited
-- function's (agent.set_job_steps); the body (agent.set_job_steps_unaudited) is also what the
-- monitor's job form calls, in the transaction that defined the job and made the signed-in
-- principal its owner.
ALTER TABLE agent.jobs ADD COLUMN requested_steps TEXT NULL;

CREATE FUNCTION agent.set_job_steps_unaudited(job_name varchar, steps text DEFAULT NULL)
RETURNS TABLE (job varchar, requested_steps text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_steps text := set_job_steps_unaudited.steps;
    p text := 'agent.set_job_steps: ';
BEGIN
    IF length(v_steps) > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@steps = ' || quote_literal(left(v_steps, 80))
            || '...: expected a JSON array of steps of at most 1000000 characters';
    END IF;
    IF regexp_replace(v_steps, '\s', '', 'g') IN ('', '[]') THEN
        v_steps := NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = set_job_steps_unaudited.job_name AND j.configured = 1
                                              AND j.defined_in_database = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || COALESCE(quote_literal(left(set_job_steps_unaudited.job_name, 80)), 'NULL')
            || ': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes '
            || 'JOB__<name>__STEPS__<n>__*)';
    END IF;
    -- The slots claimed with the old steps (those a pause recorded skipped ahead included), as a
    -- redefinition by agent.add_scheduled_job records them: a claim under the steps now in force
    -- takes each back in place (the same run, the new steps) once the engine has planned them.
    UPDATE agent.runs AS r SET status = 'skipped', finished_at = v_now, lease_expires_at = NULL,
        note = 'skipped: the job''s steps were changed by agent.set_job_steps after this slot was claimed'
    WHERE r.job_name = set_job_steps_unaudited.job_name AND r.kind = 'scheduled'
      AND (r.status IN ('pending', 'queued')
           OR (r.status = 'skipped' AND r.note = 'paused' AND r.attempt = 0 AND r.scheduled_for >= v_now));
    UPDATE agent.jobs AS j SET requested_steps = v_steps, needs_planning = 1, next_due_at = NULL, updated_at = v_now
    WHERE j.job_name = set_job_steps_unaudited.job_name;
    RETURN QUERY SELECT set_job_steps_unaudited.job_name, v_steps;
END
$$;

-- The audited function of the name (0017's way: the call and its audit row in one transaction; a
-- refused call leaves no row on PostgreSQL), with the owner check.
CREATE FUNCTION agent.set_job_steps(job_name varchar, steps text DEFAULT NULL)
RETURNS TABLE (job varchar, requested_steps text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_caller varchar := agent.calling_principal();
    v_owner varchar;
BEGIN
    SELECT j.owner INTO v_owner FROM agent.jobs j
    WHERE j.job_name = $1 AND j.configured = 1 AND j.defined_in_database = 1 FOR UPDATE;
    IF FOUND AND v_owner IS DISTINCT FROM v_caller
       AND NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = v_caller AND r.rolsuper)
       AND NOT (v_owner IS NOT NULL AND EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = v_caller)
                AND EXISTS (SELECT 1 FROM pg_roles o WHERE o.rolname = v_owner)
                AND pg_has_role(v_caller, v_owner, 'MEMBER')) THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'agent.set_job_steps: @job_name = ' || quote_literal($1)
            || ': expected a job you own; this job runs as ' || COALESCE(quote_literal(v_owner), 'the agent (no recorded owner)')
            || ' and its steps would run as it: only its owner, a member of its owner''s role or a superuser may set '
            || 'them (agent.add_scheduled_job redefines the job as yours)';
    END IF;
    RETURN QUERY SELECT * FROM agent.set_job_steps_unaudited($1, $2);
    PERFORM agent.audit_procedure_call('set-steps', $1, NULL,
        jsonb_build_object('job_name', left($1, 200), 'steps', left($2, 2000)), 'requested');
END
$$;

REVOKE ALL ON FUNCTION agent.set_job_steps_unaudited(varchar, text) FROM PUBLIC, agent_operator;
REVOKE ALL ON FUNCTION agent.set_job_steps(varchar, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agent.set_job_steps(varchar, text) TO agent_operator;

-- A job's steps are its owner's: when the job changes hands (agent.add_scheduled_job by another
-- principal makes the caller its owner; the monitor's form records the signed-in principal) or is
-- removed, the steps set before are dropped, by construction for every path that writes the
-- owner: another principal's steps never run as the new owner, and a job defined again under a
-- removed job's name starts without them. The job is planned again (its planned steps cleared
-- with them); a redefinition by the same owner keeps them, as documented.
CREATE FUNCTION agent.drop_steps_of_previous_owner() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.requested_steps := NULL;
    IF NEW.configured = 1 THEN
        NEW.steps := NULL;
        NEW.needs_planning := 1;
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION agent.drop_steps_of_previous_owner() FROM PUBLIC;
CREATE TRIGGER jobs_steps_stay_with_their_owner BEFORE UPDATE OF owner, configured ON agent.jobs
FOR EACH ROW WHEN (OLD.requested_steps IS NOT NULL
                   AND (OLD.owner IS DISTINCT FROM NEW.owner OR (OLD.configured = 1 AND NEW.configured = 0)))
EXECUTE FUNCTION agent.drop_steps_of_previous_owner();
