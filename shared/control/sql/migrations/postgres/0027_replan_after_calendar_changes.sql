-- 0027 a job's runs claimed ahead follow a change of its calendars or jitter (issue 33, hardening).
-- A run is keyed by the jittered time of its slot (agent.runs.scheduled_for, the unique (job,
-- slot) key); agent.set_job_calendars changing @jitter_seconds left the runs claimed ahead under
-- the old jitter in place while the planning that follows claimed the same slots again at their
-- new times (two runs of one slot), and a change of calendars (set_job_calendars, or a calendar
-- redefined or removed by agent.add_calendar / remove_calendar) left a run claimed ahead, or moved
-- by ON_EXCLUDED=next, at a time the new calendars exclude.
--
-- agent.jobs.replan_runs: 1 when agent.set_job_calendars changed what the job asked for (its
-- calendars, ON_EXCLUDED or jitter); the engine's planning of the job (shared/engine/planning.py),
-- which also compares the calendars it resolves with those in force, then records skipped the
-- job's never-started scheduled runs keyed from its new first slot on (note 'skipped: the job's
-- calendars, ON_EXCLUDED or JITTER_SECONDS changed ...'), in the transaction that plans it; the
-- claim that follows plans them again under the new rules (a run keyed as before is taken back in
-- place, claim_slots). A run keyed before that slot stands for an earlier slot (a jittered run
-- stays before the schedule's next slot) and is left as it is. The procedure's checks, its audit
-- (the wrapper agent.set_job_calendars of 0017) and its grants are unchanged.
ALTER TABLE agent.jobs ADD COLUMN replan_runs SMALLINT NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION agent.set_job_calendars_unaudited(job_name varchar, exclude_calendars varchar DEFAULT NULL,
                                        only_calendars varchar DEFAULT NULL, on_excluded varchar DEFAULT 'skip',
                                        jitter_seconds int DEFAULT 0)
RETURNS TABLE (job varchar, exclude_names varchar, only_names varchar, excluded_policy varchar, jitter int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_exclude varchar := NULLIF(lower(replace(set_job_calendars_unaudited.exclude_calendars, ' ', '')), '');
    v_only varchar := NULLIF(lower(replace(set_job_calendars_unaudited.only_calendars, ' ', '')), '');
    v_policy varchar := lower(COALESCE(set_job_calendars_unaudited.on_excluded, ''));
    p text := 'agent.set_job_calendars: ';
BEGIN
    IF length(set_job_calendars_unaudited.exclude_calendars) > 4000 OR v_exclude ~ '[^a-z0-9_.,-]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@exclude_calendars = ' || quote_literal(left(set_job_calendars_unaudited.exclude_calendars, 80))
            || ': expected NULL or calendar names, comma-separated (letters, digits, ''_'', ''.'', ''-'')';
    END IF;
    IF length(set_job_calendars_unaudited.only_calendars) > 4000 OR v_only ~ '[^a-z0-9_.,-]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@only_calendars = ' || quote_literal(left(set_job_calendars_unaudited.only_calendars, 80))
            || ': expected NULL or calendar names, comma-separated (letters, digits, ''_'', ''.'', ''-'')';
    END IF;
    IF v_policy NOT IN ('skip', 'next') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@on_excluded = ' || COALESCE(quote_literal(left(set_job_calendars_unaudited.on_excluded, 80)), 'NULL')
            || ': expected skip or next';
    END IF;
    IF set_job_calendars_unaudited.jitter_seconds IS NULL OR set_job_calendars_unaudited.jitter_seconds NOT BETWEEN 0 AND 86400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@jitter_seconds = ' || COALESCE(CAST(set_job_calendars_unaudited.jitter_seconds AS text), 'NULL')
            || ': expected a whole number from 0 to 86400';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = set_job_calendars_unaudited.job_name AND j.configured = 1
                                              AND j.defined_in_database = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || COALESCE(quote_literal(left(set_job_calendars_unaudited.job_name, 80)), 'NULL')
            || ': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes '
            || 'JOB__<name>__EXCLUDE, ONLY, ON_EXCLUDED and JITTER_SECONDS)';
    END IF;
    UPDATE agent.jobs AS j SET requested_exclude = v_exclude, requested_only = v_only, requested_on_excluded = v_policy,
           jitter_seconds = set_job_calendars_unaudited.jitter_seconds, needs_planning = 1, updated_at = v_now,
           -- What the job asked for changed: its runs claimed ahead are planned again (planning.py).
           replan_runs = CASE WHEN j.replan_runs = 1
                                OR j.jitter_seconds <> set_job_calendars_unaudited.jitter_seconds
                                OR j.requested_exclude IS DISTINCT FROM v_exclude
                                OR j.requested_only IS DISTINCT FROM v_only
                                OR COALESCE(j.requested_on_excluded, 'skip') <> v_policy
                              THEN 1 ELSE 0 END
    WHERE j.job_name = set_job_calendars_unaudited.job_name;
    RETURN QUERY SELECT set_job_calendars_unaudited.job_name, v_exclude, v_only, v_policy, set_job_calendars_unaudited.jitter_seconds;
END
$$;
