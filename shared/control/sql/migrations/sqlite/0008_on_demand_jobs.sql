-- 0008 on-demand jobs from T-SQL (issue 27): agent.add_scheduled_job with neither @schedule nor
-- @run_at defines a job that runs only when started. The embedded database has no procedures:
-- nothing changes here; the number keeps the dialects in step.
SELECT 1;
