-- 0014 schedules beyond every scheduler (issue 33): a job's calendars (JOB__<name>__EXCLUDE, ONLY,
-- ON_EXCLUDED), whole, as JSON (shared.jobs.calendars.CalendarRules): the claim reads them with
-- the job (select_due_jobs) and computes its slots' decisions in Python; NULL: no calendar.
ALTER TABLE agent.jobs ADD COLUMN calendars TEXT NULL;
-- JOB__<name>__JITTER_SECONDS: each slot runs up to this many seconds late, by a delay fixed by the
-- job's name and the slot (every instance computes the same: the slot is still claimed once).
ALTER TABLE agent.jobs ADD COLUMN jitter_seconds INT NOT NULL DEFAULT 0;

-- Calendars defined from T-SQL (agent.add_calendar / remove_calendar) and a database job's
-- calendars and jitter (agent.set_job_calendars): the names as given, checked and resolved by the
-- engine when it plans the job (needs_planning), into agent.jobs.calendars as for a settings job.
CREATE TABLE agent.calendars (
    name        VARCHAR(64) NOT NULL PRIMARY KEY,
    dates       TEXT NULL,
    weekly      TEXT NULL,
    defined_by  VARCHAR(128) NULL,
    updated_at  TIMESTAMP NOT NULL
);
ALTER TABLE agent.jobs ADD COLUMN requested_exclude VARCHAR(4000) NULL;
ALTER TABLE agent.jobs ADD COLUMN requested_only VARCHAR(4000) NULL;
ALTER TABLE agent.jobs ADD COLUMN requested_on_excluded VARCHAR(8) NULL;

-- The database jobs that name a calendar (in @exclude_calendars or @only_calendars, stored
-- folded, without spaces) wait for the engine to plan them again.
CREATE FUNCTION agent.replan_calendar_users(p_name varchar, p_now timestamp) RETURNS int
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH changed AS (
        UPDATE agent.jobs AS j SET needs_planning = 1, updated_at = p_now
        WHERE j.defined_in_database = 1 AND j.configured = 1
          AND (strpos(',' || COALESCE(j.requested_exclude, '') || ',', ',' || lower(p_name) || ',') > 0
               OR strpos(',' || COALESCE(j.requested_only, '') || ',', ',' || lower(p_name) || ',') > 0)
        RETURNING 1)
    SELECT CAST(COUNT(*) AS int) FROM changed;
$$;
REVOKE ALL ON FUNCTION agent.replan_calendar_users(varchar, timestamp) FROM PUBLIC;

CREATE FUNCTION agent.add_calendar(name varchar, dates text DEFAULT NULL, weekly text DEFAULT NULL)
RETURNS TABLE (calendar_name varchar, action varchar, jobs_replanned int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_action varchar := 'defined';
    p text := 'agent.add_calendar: ';
BEGIN
    IF add_calendar.name IS NULL OR add_calendar.name = '' OR length(add_calendar.name) > 64
       OR add_calendar.name ~ '[^A-Za-z0-9_.-]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@name = ' || COALESCE(quote_literal(left(add_calendar.name, 80)), 'NULL')
            || ': expected a calendar name of 1 to 64 letters, digits, ''_'', ''.'' or ''-''';
    END IF;
    IF NULLIF(btrim(COALESCE(add_calendar.dates, '')), '') IS NULL AND NULLIF(btrim(COALESCE(add_calendar.weekly, '')), '') IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@dates = NULL, @weekly = NULL: expected dates '
            || '(''2026-12-25, 2026-12-24..2026-12-26'') or weekly windows (''SAT-SUN, FRI 22:00-06:00''), or both';
    END IF;
    IF length(add_calendar.dates) > 40000 OR length(add_calendar.weekly) > 4000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@dates or @weekly: expected at most 40000 and 4000 characters';
    END IF;
    -- Names compare case-insensitively (as SQL Server's default collation does): one definer at a time.
    PERFORM pg_advisory_xact_lock(hashtext('agent.calendars'));
    IF EXISTS (SELECT 1 FROM agent.calendars c WHERE lower(c.name) = lower(add_calendar.name)) THEN
        v_action := 'redefined';
        UPDATE agent.calendars AS c SET name = add_calendar.name, dates = add_calendar.dates, weekly = add_calendar.weekly,
               defined_by = CAST(session_user AS varchar), updated_at = v_now
        WHERE lower(c.name) = lower(add_calendar.name);
    ELSE
        INSERT INTO agent.calendars (name, dates, weekly, defined_by, updated_at)
        VALUES (add_calendar.name, add_calendar.dates, add_calendar.weekly, CAST(session_user AS varchar), v_now);
    END IF;
    RETURN QUERY SELECT CAST(add_calendar.name AS varchar), v_action, agent.replan_calendar_users(add_calendar.name, v_now);
END
$$;

CREATE FUNCTION agent.remove_calendar(name varchar)
RETURNS TABLE (calendar_name varchar, jobs_replanned int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    p text := 'agent.remove_calendar: ';
BEGIN
    DELETE FROM agent.calendars AS c WHERE lower(c.name) = lower(remove_calendar.name);
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@name = ' || COALESCE(quote_literal(left(remove_calendar.name, 80)), 'NULL')
            || ': expected the name of a calendar defined by agent.add_calendar; there is no such calendar';
    END IF;
    RETURN QUERY SELECT CAST(remove_calendar.name AS varchar), agent.replan_calendar_users(remove_calendar.name, v_now);
END
$$;

CREATE FUNCTION agent.set_job_calendars(job_name varchar, exclude_calendars varchar DEFAULT NULL,
                                        only_calendars varchar DEFAULT NULL, on_excluded varchar DEFAULT 'skip',
                                        jitter_seconds int DEFAULT 0)
RETURNS TABLE (job varchar, exclude_names varchar, only_names varchar, excluded_policy varchar, jitter int)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_now timestamp := CAST(now() AT TIME ZONE 'UTC' AS timestamp);
    v_exclude varchar := NULLIF(lower(replace(set_job_calendars.exclude_calendars, ' ', '')), '');
    v_only varchar := NULLIF(lower(replace(set_job_calendars.only_calendars, ' ', '')), '');
    v_policy varchar := lower(COALESCE(set_job_calendars.on_excluded, ''));
    p text := 'agent.set_job_calendars: ';
BEGIN
    IF length(set_job_calendars.exclude_calendars) > 4000 OR v_exclude ~ '[^a-z0-9_.,-]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@exclude_calendars = ' || quote_literal(left(set_job_calendars.exclude_calendars, 80))
            || ': expected NULL or calendar names, comma-separated (letters, digits, ''_'', ''.'', ''-'')';
    END IF;
    IF length(set_job_calendars.only_calendars) > 4000 OR v_only ~ '[^a-z0-9_.,-]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@only_calendars = ' || quote_literal(left(set_job_calendars.only_calendars, 80))
            || ': expected NULL or calendar names, comma-separated (letters, digits, ''_'', ''.'', ''-'')';
    END IF;
    IF v_policy NOT IN ('skip', 'next') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@on_excluded = ' || COALESCE(quote_literal(left(set_job_calendars.on_excluded, 80)), 'NULL')
            || ': expected skip or next';
    END IF;
    IF set_job_calendars.jitter_seconds IS NULL OR set_job_calendars.jitter_seconds NOT BETWEEN 0 AND 86400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p || '@jitter_seconds = ' || COALESCE(CAST(set_job_calendars.jitter_seconds AS text), 'NULL')
            || ': expected a whole number from 0 to 86400';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent.jobs j WHERE j.job_name = set_job_calendars.job_name AND j.configured = 1
                                              AND j.defined_in_database = 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = p || '@job_name = ' || COALESCE(quote_literal(left(set_job_calendars.job_name, 80)), 'NULL')
            || ': expected the name of a job defined by agent.add_scheduled_job (a job of the settings takes '
            || 'JOB__<name>__EXCLUDE, ONLY, ON_EXCLUDED and JITTER_SECONDS)';
    END IF;
    UPDATE agent.jobs AS j SET requested_exclude = v_exclude, requested_only = v_only, requested_on_excluded = v_policy,
           jitter_seconds = set_job_calendars.jitter_seconds, needs_planning = 1, updated_at = v_now
    WHERE j.job_name = set_job_calendars.job_name;
    RETURN QUERY SELECT set_job_calendars.job_name, v_exclude, v_only, v_policy, set_job_calendars.jitter_seconds;
END
$$;

GRANT EXECUTE ON FUNCTION agent.add_calendar(varchar, text, text) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.remove_calendar(varchar) TO agent_operator;
GRANT EXECUTE ON FUNCTION agent.set_job_calendars(varchar, varchar, varchar, varchar, int) TO agent_operator;
