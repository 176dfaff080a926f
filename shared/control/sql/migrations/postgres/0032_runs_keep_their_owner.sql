-- 0032 a run keeps the owner of the SQL it carries (an attack): a run copies its job's SQL and
-- steps when it is queued (agent.start_job, a follow-up, a slot claimed ahead, a backfill, a fleet
-- step's executions), but took its owner from the job when it EXECUTED (0007). Operator B's job,
-- started and failing as B with retries to come, redefined by operator A (add_scheduled_job, which
-- makes A the owner; or removed by B and defined again by A), ran B's SQL as A at its next retry.
-- Now every run of a job defined in the database records, as it is inserted, the owner of the job
-- whose SQL it copied (a fleet execution its run's), and the claims use the run's own
-- (COALESCE(run owner, job owner), unchanged). A run of a job of the settings records none, as
-- before: it runs as the agent. The runs waiting now take their job's current owner, the one they
-- would have run as.
CREATE FUNCTION agent.run_owner_at_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.job_name IS NOT NULL THEN
        NEW.owner := (SELECT j.owner FROM agent.jobs j WHERE j.job_name = NEW.job_name AND j.defined_in_database = 1);
    ELSIF NEW.parent_run_id IS NOT NULL THEN
        NEW.owner := (SELECT COALESCE(p.owner, j.owner) FROM agent.runs p
                      LEFT JOIN agent.jobs j ON j.job_name = p.job_name AND j.defined_in_database = 1
                      WHERE p.run_id = NEW.parent_run_id);
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION agent.run_owner_at_insert() FROM PUBLIC;
CREATE TRIGGER runs_keep_their_owner BEFORE INSERT ON agent.runs
FOR EACH ROW WHEN (NEW.owner IS NULL AND (NEW.job_name IS NOT NULL OR NEW.parent_run_id IS NOT NULL))
EXECUTE FUNCTION agent.run_owner_at_insert();

UPDATE agent.runs AS r SET owner = j.owner
FROM agent.jobs AS j
WHERE r.owner IS NULL AND r.status IN ('waiting', 'pending', 'queued', 'running')
  AND j.job_name = r.job_name AND j.defined_in_database = 1 AND j.owner IS NOT NULL;
UPDATE agent.runs AS t SET owner = p.owner
FROM agent.runs AS p
WHERE t.owner IS NULL AND t.job_name IS NULL AND t.parent_run_id = p.run_id AND p.owner IS NOT NULL
  AND t.status IN ('waiting', 'pending', 'queued', 'running');
