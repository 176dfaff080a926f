-- 0007 jobs run as their owner (issue 23): who defined a job from the database side
-- (agent.exec_async, agent.add_scheduled_job: SQL Server and PostgreSQL only). The embedded
-- database has no procedures, so its owner is always NULL (jobs run as the agent); the columns
-- keep every dialect's schema the same.
ALTER TABLE agent_jobs ADD COLUMN owner VARCHAR(256) NULL;
ALTER TABLE agent_runs ADD COLUMN owner VARCHAR(256) NULL;
