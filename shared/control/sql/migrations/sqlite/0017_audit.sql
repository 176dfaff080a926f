-- 0017 the audit trail (issue 32 item 4): every operator action from the command line is one row
-- of agent_audit (shared/engine/audit.py), written in the action's own transaction; a refused
-- action is one row 'refused', written after its transaction rolled back. The embedded database
-- has no principals: the principal is the operating system's user that ran the command. Purged
-- with the history (purge_history).
CREATE TABLE agent_audit (
    audit_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    acted_at   TEXT NOT NULL,
    principal  VARCHAR(256) NOT NULL,
    client     VARCHAR(400) NULL,
    source     VARCHAR(16) NOT NULL,
    action     VARCHAR(32) NOT NULL,
    job_name   VARCHAR(200) NULL,
    run_id     INTEGER NULL,
    arguments  TEXT NULL,
    outcome    VARCHAR(8) NOT NULL,
    detail     VARCHAR(2000) NULL,
    CONSTRAINT audit_source CHECK (source IN ('cli', 'tsql', 'monitor')),
    CONSTRAINT audit_outcome CHECK (outcome IN ('done', 'refused'))
);
CREATE INDEX audit_at ON agent_audit (acted_at);
CREATE INDEX audit_job ON agent_audit (job_name, audit_id);
