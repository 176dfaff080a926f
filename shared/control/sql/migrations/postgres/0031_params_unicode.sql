-- 0031 @params whose \u escapes are not valid Unicode get the procedures' own error: a lone
-- surrogate escape ("\ud800", "\udc00") is valid JSON syntax, so 0018's cast to json took it, and
-- decoding the value (json_each) then failed with PostgreSQL's raw 22P02 ("Unicode low surrogate
-- must follow a high surrogate"), naming no procedure, parameter or expected value (an attack).
-- agent.start_job and agent.set_job_params (the audited functions every caller reaches) now check
-- first that the document decodes (jsonb decodes every escape as it reads it) and raise 22023
-- naming the procedure, @params, the value and what is expected; a document that is no JSON, or
-- holds \u0000, still gets the message 0018 gives it.
CREATE FUNCTION agent.check_params_unicode(p_procedure text, p_params text)
RETURNS void LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_detail text;
BEGIN
    IF p_params IS NULL OR agent.json_has_nul(p_params) THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM CAST(p_params AS json);
    EXCEPTION WHEN others THEN
        RETURN;                    -- no JSON at all: the procedure's own message says so
    END;
    BEGIN
        PERFORM CAST(p_params AS jsonb);
    EXCEPTION WHEN others THEN
        GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p_procedure || ': @params = ' || quote_literal(left(p_params, 80))
            || ': expected JSON text whose \u escapes are Unicode characters (a \uD800-\uDFFF escape is half of a '
            || 'surrogate pair, high then low): ' || COALESCE(NULLIF(v_detail, ''), SQLERRM);
    END;
END
$$;
REVOKE ALL ON FUNCTION agent.check_params_unicode(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION agent.start_job(job_name varchar, params text DEFAULT NULL)
RETURNS TABLE (run_id bigint, status varchar, note text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run bigint;
    v_status varchar;
    v_note text;
BEGIN
    PERFORM agent.check_params_unicode('agent.start_job', $2);
    FOR v_run, v_status, v_note IN SELECT r.run_id, r.status, r.note FROM agent.start_job_unaudited($1, $2) AS r LOOP
        RETURN QUERY SELECT v_run, v_status, v_note;
    END LOOP;
    PERFORM agent.audit_procedure_call('run-now', $1, v_run,
        jsonb_build_object('job_name', left($1, 200), 'params', left($2, 2000)), v_status || COALESCE(': ' || v_note, ''));
    RETURN;
END
$$;

CREATE OR REPLACE FUNCTION agent.set_job_params(job_name varchar, params text)
RETURNS TABLE (job varchar, declared text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM agent.check_params_unicode('agent.set_job_params', $2);
    RETURN QUERY SELECT * FROM agent.set_job_params_unaudited($1, $2);
    PERFORM agent.audit_procedure_call('set-params', $1, NULL,
        jsonb_build_object('job_name', left($1, 200), 'params', left($2, 2000)), 'declared');
END
$$;
