-- 0012 chains and pauses (issue 34, items 3 to 6); see the PostgreSQL file of the same number.

-- Item 4: the chain of jobs a follow-up run carries ('/a/b/': the jobs of the runs whose ends
-- led to it, the first first; NULL for a run no end started).
ALTER TABLE agent_runs ADD COLUMN chain TEXT NULL;
