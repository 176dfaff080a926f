-- 0009 (issue 23): the T-SQL procedures of PostgreSQL and SQL Server refuse an out-of-range
-- @run_at with their one-line parameter error. SQLite has no procedures (its way in is the
-- command line, whose times are checked in Python): nothing changes here.
SELECT 1;
