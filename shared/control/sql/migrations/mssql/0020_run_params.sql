-- 0020 run with parameters (issue 33 item 4); see the PostgreSQL file of the same number.
-- agent.jobs.params: the parameters a job declares, as JSON {name: default, or null}; NULL: none.
-- agent.runs.params: the values a run was started with (defaults filled in), as JSON; NULL: none.
-- claim_runs and start_run are named queries in this dialect: they read both with the run.
ALTER TABLE agent.jobs ADD params NVARCHAR(MAX) NULL;
ALTER TABLE agent.runs ADD params NVARCHAR(MAX) NULL;
