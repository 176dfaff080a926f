"""Jobs that follow jobs (issue 27 item 3): ``JOB__<b>__AFTER=<a>`` (``agent.add_scheduled_job
@after``) — a run of a that ends with b's ``AFTER_OUTCOME`` starts a run of b.

The follow-up run is created by one statement, ``start_follow_up_runs``, chained into every
transaction that ends runs, right after the statement that records the end (the executor's
fenced completion, failure, step transition and poison; the tick's last lapse; a fleet's last
target execution): it exists exactly when the end does, whichever process ended the run, with
no tick in between. In queue mode the same transaction's hand-on dispatch then hands it to the
queue, as a run-now is; the local runner's workers claim it straight away. A second ending of
the same run cannot happen (the ending is fenced by the run's token), and could start nothing
more if it did (runs.followed_run_id with the job's name is unique).

The follow-up run is a started run (kind ``manual``, like run-now), with the followed run's
operation id, so the whole chain is one operation in Application Insights, and its
``followed_run_id`` naming the run that started it (history, monitor, views, notifications).

The run-time guard (issue 34 item 4): each follow-up run carries its chain of jobs (runs.chain,
the jobs of the runs whose ends led to it). A follow-up of a job already in the chain, or one
past MAX_CHAIN_JOBS jobs, is recorded skipped with the reason (note ``chain: ...``) instead of
started, whatever the definitions say now (they may have changed while the chain's runs were in
flight, or a row was written by hand); the job events say it once (``follow_up_refused``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Sequence

from shared.engine.notify import enqueue_calls
from shared.jobs.chains import MAX_CHAIN_JOBS
from shared.jobs.run_model import RunStatus
from shared.settings import Settings

log = logging.getLogger(__name__)
FOLLOW_UP_QUERY = "start_follow_up_runs"


def follow_up_calls(now: datetime) -> list[tuple[str, dict[str, Any]]]:
    """The statement that starts the follow-up runs of the runs a transaction ends at ``now``.
    Always chained: jobs defined with agent.add_scheduled_job @after are not in the settings."""
    return [(FOLLOW_UP_QUERY, {"now": now, "max_chain_jobs": MAX_CHAIN_JOBS})]


def ending_calls(settings: Settings, now: datetime) -> list[tuple[str, dict[str, Any]]]:
    """What every transaction that ends runs at ``now`` chains after its ending statement: the
    notification outbox (when a webhook is configured) and the follow-up runs."""
    return enqueue_calls(settings, now) + follow_up_calls(now)


def follow_up_rows(calls: Sequence[tuple[str, Any]], results: Sequence[Any]) -> list[dict[str, Any]]:
    """The follow-up runs a chain of calls started (``results``: one Result per call)."""
    return [row for (name, _), result in zip(calls, results) if name == FOLLOW_UP_QUERY for row in result.rows]


def report_follow_ups(rows: Sequence[dict[str, Any]], telemetry: Any) -> None:
    """One FollowUpStarted event (and a log line) per follow-up run, in the chain's operation;
    one FollowUpRefused (and a warning) per follow-up the chain's guard recorded skipped."""
    for row in rows:
        if row.get("status") == RunStatus.SKIPPED:
            log.warning("run %s (%s) %s", row["run_id"], row["job_name"], row.get("note"))
            if telemetry.enabled:
                telemetry.event("FollowUpRefused", {"job": row["job_name"], "run_id": row["run_id"],
                                                    "followed_run_id": row["followed_run_id"], "outcome": "skipped",
                                                    "kind": "manual", "error_message": row.get("note")},
                                operation_id=row.get("operation_id"))
            continue
        log.info("run %s (%s) started after run %s", row["run_id"], row["job_name"], row["followed_run_id"])
        if telemetry.enabled:
            telemetry.event("FollowUpStarted", {"job": row["job_name"], "run_id": row["run_id"],
                                                "followed_run_id": row["followed_run_id"], "outcome": "pending",
                                                "kind": "manual"},
                            operation_id=row.get("operation_id"))
