-- 0009 is pause and resume (issue 27 item 2), built on branch i27p: this placeholder keeps the
-- numbering without gaps on branch i27a; the merge takes i27p's file in its place.
SELECT 1;
