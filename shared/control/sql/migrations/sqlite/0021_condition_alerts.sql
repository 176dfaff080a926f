-- 0021 condition alerts (issue 32 item 3); see the PostgreSQL file of the same number. The
-- embedded database has no procedures: its alerts come from the settings (ALERT__<name>__*).
CREATE TABLE agent_alerts (
    alert_name         VARCHAR(64) NOT NULL PRIMARY KEY COLLATE NOCASE,
    source             VARCHAR(16) NOT NULL,
    owner              VARCHAR(256) NULL,
    probe_query        TEXT NULL,
    schedule           VARCHAR(400) NULL,
    timezone           VARCHAR(64) NOT NULL DEFAULT 'UTC',
    errors             VARCHAR(400) NULL,
    timeout_seconds    INTEGER NOT NULL DEFAULT 30,
    delay_seconds      INTEGER NOT NULL DEFAULT 300,
    notify             INTEGER NOT NULL DEFAULT 1,
    notify_webhook_url VARCHAR(2000) NULL,
    response_job       VARCHAR(64) NULL,
    enabled            INTEGER NOT NULL DEFAULT 1,
    valid              INTEGER NULL,
    config_error       TEXT NULL,
    next_check_at      TEXT NULL,
    checked_until      TEXT NULL,
    last_checked_at    TEXT NULL,
    next_response_at   TEXT NULL,
    last_occurred_at   TEXT NULL,
    last_response_at   TEXT NULL,
    occurrences        INTEGER NOT NULL DEFAULT 0,
    responses          INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT NULL,
    error_since        TEXT NULL,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL
);
CREATE INDEX alerts_next_check ON agent_alerts (next_check_at);

CREATE TABLE agent_alert_firings (
    firing_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    alert_name      VARCHAR(64) NOT NULL,
    kind            VARCHAR(16) NOT NULL,
    raised_at       TEXT NOT NULL,
    detail          TEXT NULL,
    response_run_id INTEGER NULL,
    response_error  TEXT NULL
);
CREATE INDEX alert_firings_alert ON agent_alert_firings (alert_name, firing_id);
CREATE INDEX alert_firings_raised ON agent_alert_firings (raised_at);
CREATE INDEX alert_firings_response ON agent_alert_firings (response_run_id);

CREATE INDEX attempts_finished ON agent_attempts (finished_at);

-- A response's run is audited as started by the alert: SQLite changes a CHECK by rebuilding the
-- table (the old one renamed aside, its rows copied, then dropped with its indexes).
ALTER TABLE agent_audit RENAME TO agent_audit_0017;
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
    CONSTRAINT audit_source CHECK (source IN ('cli', 'tsql', 'monitor', 'alert')),
    CONSTRAINT audit_outcome CHECK (outcome IN ('done', 'refused'))
);
INSERT INTO agent_audit (audit_id, acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail)
SELECT audit_id, acted_at, principal, client, source, action, job_name, run_id, arguments, outcome, detail FROM agent_audit_0017;
DROP TABLE agent_audit_0017;
CREATE INDEX audit_at ON agent_audit (acted_at);
CREATE INDEX audit_job ON agent_audit (job_name, audit_id);
