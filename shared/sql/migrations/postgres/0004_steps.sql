-- 0004 steps: a job is a list of steps with on-success / on-failure flow (SQL Agent's job
-- steps); each step attempt is its own history row with its output; operators are notified.
-- steps: the job's steps as JSON (NULL: a one-step job, its COMMAND), copied onto each run
-- when its slot is claimed, so that a redefinition never changes a run in flight.
ALTER TABLE agent.jobs ADD COLUMN steps TEXT NULL;
ALTER TABLE agent.jobs ADD COLUMN notify VARCHAR(16) NULL;
ALTER TABLE agent.jobs ADD COLUMN notify_webhook_url VARCHAR(2000) NULL;
-- step: the step the run is at (1-based); failed_step: the step whose failure ended the run.
ALTER TABLE agent.runs ADD COLUMN steps TEXT NULL;
ALTER TABLE agent.runs ADD COLUMN step INT NOT NULL DEFAULT 1;
ALTER TABLE agent.runs ADD COLUMN failed_step INT NULL;
-- Each attempt of a step: its step (NULL for a one-step job), its database and its output.
ALTER TABLE agent.attempts ADD COLUMN step INT NULL;
ALTER TABLE agent.attempts ADD COLUMN target_database VARCHAR(128) NULL;
ALTER TABLE agent.attempts ADD COLUMN output TEXT NULL;
