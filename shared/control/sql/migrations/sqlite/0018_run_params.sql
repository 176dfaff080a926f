-- 0018 run with parameters (issue 33 item 4); see the PostgreSQL file of the same number.
-- agent_jobs.params: the parameters a job declares, as JSON {name: default, or null}; NULL: none.
-- agent_runs.params: the values a run was started with (defaults filled in), as JSON; NULL: none.
ALTER TABLE agent_jobs ADD COLUMN params TEXT NULL;
ALTER TABLE agent_runs ADD COLUMN params TEXT NULL;
