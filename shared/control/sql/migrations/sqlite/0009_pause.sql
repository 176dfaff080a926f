-- 0009 pause and resume (issue 27, item 2): a job paused claims no slot until it is resumed, or
-- until its pause ends by itself (paused_until); each slot that comes while it is paused is
-- recorded as a run skipped with the note 'paused'. The pause is state of its own, never
-- touched by the settings sync. The embedded database has no procedures: `sql-agent pause` and
-- `resume` (the pause_job and resume_job named queries) are the way in.
CREATE TABLE agent_job_pauses (
    job_name     VARCHAR(64) PRIMARY KEY,
    paused_at    TEXT NOT NULL,
    paused_until TEXT NULL,
    paused_by    VARCHAR(256) NULL,
    reason       VARCHAR(400) NULL,
    CONSTRAINT job_pauses_until CHECK (paused_until IS NULL OR paused_until > paused_at)
);
