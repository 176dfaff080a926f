-- 0003 monitor indexes (issue 17): what the Job Activity Monitor's pages read that no index served.
-- The run page lists the poison messages of one run; without this index each view of a run
-- scans the whole poison table. (The history's (job_name, run_id) index is issue 12's.)
CREATE INDEX poison_messages_run ON agent_poison_messages (run_id);
