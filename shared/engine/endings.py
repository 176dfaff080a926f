"""How a run's attempt ends: the transaction that records it (succeeded, failed and retried,
stepped on, fenced off, poisoned), the follow-ups and hand-on dispatch committed with it, and the
telemetry each ending emits.

The executor (shared/engine/executor.py) decides what to run and runs it; every way out of an
attempt goes through :class:`RunEndings`, which owns no state of a run: it writes the ending
under the run's token (a fenced-off worker changes nothing) and says what happened.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from shared.control.sqlerrors import describe
from shared.control.store import AfterCommitFailed, Result, Store
from shared.engine.dispatch import dispatch, dispatch_params, send_dispatched
from shared.engine.fleet import report_moved_runs
from shared.engine.follow import ending_calls, follow_up_rows, report_follow_ups
from shared.errors import LeaseLost, QueueError, TransientJobError
from shared.jobs.model import StepDefinition
from shared.jobs.run_model import AttemptError, Outcome, RunStatus
from shared.jobs.steps import QUIT_FAILURE, QUIT_SUCCESS, cap_output, target_step
from shared.messaging.messages import RunMessage
from shared.settings import Settings

log = logging.getLogger(__name__)
UTC = timezone.utc
MAX_BACKOFF_SECONDS = 3600
# A step's output as a telemetry property (Application Insights keeps 8 KiB of a value).
TELEMETRY_OUTPUT_MAX_BYTES = 8192




@dataclass(frozen=True)
class ExecutionResult:
    outcome: Outcome
    run_id: int | None = None
    detail: str = ""
    output: str = ""     # a one-step run's output, capped for telemetry


@dataclass
class Attempt:
    """One attempt of a run, or of the step the run is at, as the executor hands it to its
    endings: the run's row (updated in place when the run goes on to another step), the step and
    the run's steps (None for a one-step job), what every event of the attempt carries, and the
    queue message it came from (queue mode; None in direct mode)."""

    run: dict[str, Any]
    step: StepDefinition | None
    steps: list[StepDefinition] | None
    properties: dict[str, Any]
    operation_id: str
    body: str | None = None
    dequeue_count: int | None = None
    message_id: str | None = None


class RunEndings:

    def __init__(self, *, settings: Settings, store: Callable[[], Store], telemetry: Any, queue: Any,
                 clock: Callable[[], datetime], worker: str, transient_delay_seconds: float, notifier: Any) -> None:
        self.settings = settings
        self._store = store
        self.telemetry = telemetry
        self.queue = queue
        self.clock = clock
        self.worker = worker
        self.transient_delay_seconds = transient_delay_seconds
        self.notifier = notifier

    def report_fleet_progress(self, calls: list[tuple[str, dict[str, Any]]], results: list[Result]) -> None:
        for (name, _), result in zip(calls, results):
            if name == "progress_fleets":
                self.fleet_moved(result.rows)

    def fleet_moved(self, rows: list[dict[str, Any]]) -> None:
        """Runs whose target executions all ended, as progress_fleets moved them on."""

        if report_moved_runs(rows, self.telemetry) and self.notifier is not None:
            self.notifier.wake()

    def after_transition(self, attempt: Attempt, moved: dict[str, Any], *,
                         error_message: str | None) -> ExecutionResult | None:
        """Where a step transition left the run: on to another step (None: the caller runs it),
        a retry of the step later, or the end the flow reports."""
        run, properties, operation_id = attempt.run, attempt.properties, attempt.operation_id
        run_id = run["run_id"]
        if moved["status"] == RunStatus.RUNNING:
            log.info("run %s (%s): on to step %s", run_id, properties["job"], moved["step"])
            run.update(step=moved["step"], attempt=moved["attempt"], failures=moved["failures"])
            return None
        if moved["status"] == RunStatus.PENDING:
            return ExecutionResult(Outcome.RETRY_SCHEDULED, run_id, error_message or "")
        if moved["status"] == RunStatus.SUCCEEDED:
            return ExecutionResult(Outcome.SUCCEEDED, run_id)
        detail = error_message or f"step {properties.get('step')} reported failure (its flow quits with failure)"
        log.error("run %s (%s) failed at step %s: %s", run_id, properties["job"], properties.get("step"), detail)
        self.telemetry.event("RunFailed", {**properties, "outcome": "failed", "error_message": detail},
                             operation_id=operation_id)
        return ExecutionResult(Outcome.FAILED, run_id, detail)

    def step_event(self, name: str, properties: dict[str, Any], outcome: str, output: list[str],
                    operation_id: str, **extra: Any) -> None:
        if self.telemetry.enabled:
            self.telemetry.event(name, {**properties, "outcome": outcome, **extra,
                                        "output": cap_output(output, TELEMETRY_OUTPUT_MAX_BYTES) or ""},
                                 operation_id=operation_id)

    def output_text(self, output: list[str]) -> str | None:
        return cap_output(output, self.settings.agent.step_output_max_bytes)

    def transition(self, attempt: Attempt, now: datetime, *, outcome: str, action: str | None,
                   retry_at: datetime | None, failures: int, output: list[str],
                   error: AttemptError | None) -> dict[str, Any]:
        """The parameters of step_transition: ``retry_at`` (the same step again, later) or
        ``action`` (a resolved flow action: goto:<n>, quit_success, quit_failure)."""
        run, step, steps = attempt.run, attempt.step, attempt.steps or []
        assert step is not None, "a step transition needs the step"
        params = {"run_id": run["run_id"], "token": run["token"], "now": now, "attempt": run["attempt"],
                  "step": step.step, "outcome": outcome, "error_number": error.number if error else None,
                  "error_sqlstate": error.sqlstate if error else None,
                  "error_message": error.message if error else None, "step_output": self.output_text(output),
                  "worker": self.worker,
                  "lease_until": now + timedelta(seconds=run["lease_seconds"]), "runnable_at": now,
                  "next_database": None, "failed_step": None, "failures": failures, "next_step": step.step}
        if retry_at is not None:
            params.update(run_status=RunStatus.PENDING, runnable_at=retry_at)
            return params
        if outcome != "succeeded":
            params["failed_step"] = step.step   # the last step whose failure the flow followed
        target = target_step(action or QUIT_FAILURE)
        if target is not None:
            params.update(run_status=RunStatus.RUNNING, next_step=target, failures=0, next_database=steps[target - 1].database)
        elif action == QUIT_SUCCESS:
            params.update(run_status=RunStatus.SUCCEEDED)
        else:
            params.update(run_status=RunStatus.FAILED)
        return params

    def finish(self, store: Store, attempt: Attempt, output: list[str], *, reset: bool,
               ahead: tuple[dict[str, Any], list[dict[str, Any]]] | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Inside the open transaction: (reset the session the job used,) complete the run — or,
        for a step, follow its ON_SUCCESS — fenced by its token, keep the attempt's output, and
        in queue mode dispatch what its end made runnable — one round trip on PostgreSQL, which
        for a run's completion also commits (commit_with: finish_run raises when fenced, so a
        zombie's batch stops before its COMMIT). Raises LeaseLost (the caller rolls back) when
        the token moved on. Returns the hand-on rows and, for a step, where the run went.

        ``ahead`` (direct mode on PostgreSQL, a run's completion: Executor._claim_ahead):
        (claim_runs' parameters, a list): the same batch, after its COMMIT, claims the worker's
        next run (Store.commit_with's ``then``) and the rows it claimed are appended to the list
        (the worker runs them next: two round trips a task, not three). A claim that failed after
        the COMMIT claims nothing here (the run did complete; the worker's next claim, a round trip
        of its own, meets the error again or not)."""
        run, step = attempt.run, attempt.step
        now = self.clock()
        calls: list[tuple[str, dict[str, Any]]] = []
        if reset:
            calls.append(("reset_session", {}))
            # The job worked in this transaction: it must still be active (on SQL Server its SQL can
            # commit, roll back or doom it; on PostgreSQL it must be the transaction the job ran
            # in). Not after work in another database: the completion then opens the control
            # database's transaction itself.
            calls.append(("check_work_transaction", {"work_transaction": store.work_transaction}))
        position = len(calls)
        if step is None:
            calls.append(("finish_run", {"run_id": run["run_id"], "token": run["token"], "now": now}))
            text = self.output_text(output)
            if text is not None:
                calls.append(("record_attempt_output", {"run_id": run["run_id"], "token": run["token"],
                                                        "attempt": run["attempt"], "step_output": text}))
            calls += fleet_progress_calls(run, now)
            ends = True
            calls += ending_calls(self.settings, now)
        else:
            params = self.transition(attempt, now, outcome="succeeded", action=step.on_success, retry_at=None,
                                     failures=run["failures"], output=output, error=None)
            calls.append(("step_transition", params))
            ends = params["run_status"] != RunStatus.RUNNING
            if ends:
                calls += ending_calls(self.settings, now)
        if step is None:
            then = [("claim_runs", ahead[0])] if ahead is not None and store.can_run_after_commit() else []
            try:
                results = self.chain_with_hand_on(store, calls, now, commit=True, then=then)
            except AfterCommitFailed as exc:
                # Committed: the run succeeded. What the batch answered is lost with the error
                # (psqlODBC), so its follow-ups' telemetry events are not sent (the runs exist).
                log.warning("run %s completed; claiming the next run in the same batch failed (the next claim "
                            "tries again; events for any follow-up it started are not sent): %s",
                            run["run_id"], describe(exc.cause))
                return [], None
            if then:
                ahead[1].extend(results[-1].rows)
                results = results[:-1]
        else:
            results = self.chain_with_hand_on(store, calls, now) if ends else store.chain(*calls)
        row = results[position].one()
        if row is None:
            raise LeaseLost()
        self.report_fleet_progress(calls, results)
        report_follow_ups(follow_up_rows(calls, results), self.telemetry)
        handed_on = results[-1].rows if self.queue is not None and ends else []
        return handed_on, (row if step is not None else None)

    def finish_alone(self, attempt: Attempt, output: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """finish() in a transaction of its own (the job's work committed in another database)."""
        store = self._store()
        with store.transaction():
            return self.finish(store, attempt, output, reset=False)

    def chain_with_hand_on(self, store: Store, calls: list[tuple[str, dict[str, Any]]], now: datetime, *,
                           commit: bool = False, then: list[tuple[str, dict[str, Any]]] | None = None
                           ) -> list[Result]:
        """The calls, then (queue mode) the hand-on dispatch — with the start lock taken before
        the calls touch any row of agent.runs: the dispatch needs it, and a start holds it while
        it waits for a run's row (a fleet's last executions lock their run), so taking it last
        could deadlock. ``commit``: and commit the open transaction with them (Store.commit_with),
        then run ``then`` after the COMMIT (direct mode only: their results come last)."""
        if then:
            if self.queue is not None or not commit:
                raise ValueError("calls after the commit: direct mode, with commit=True only")
            return store.commit_with(*calls, then=then)
        run = store.commit_with if commit else store.chain
        if self.queue is None:
            return run(*calls)
        # After the session reset (the job may have run as AGENT_JOB_PRINCIPAL), before the rest.
        at = next((i for i, (name, _) in enumerate(calls) if name not in ("reset_session", "check_work_transaction")),
                  len(calls))
        results = run(*calls[:at], ("lock_starts", {}), *calls[at:],
                      ("dispatch_runs", dispatch_params(self.settings, now)))
        return results[:at] + results[at + 1:]

    def send_handed_on(self, rows: list[dict[str, Any]]) -> None:
        """After the commit: the messages of the runs the finished one handed on."""
        if not rows or self.queue is None:
            return
        try:
            send_dispatched(rows, self._store(), self.queue, self.clock(), self.telemetry)
        except QueueError as exc:  # the runs are back to pending, or their dispatch lease covers them
            log.error("hand-on dispatch: %s", describe(exc))

    def fenced(self, attempt: Attempt, why: str, same_database: bool) -> ExecutionResult:
        """The run's token moved on (another worker has it, or it was cancelled): this attempt's
        work rolled back; its end is recorded in the history only."""
        run, properties, operation_id = attempt.run, attempt.properties, attempt.operation_id
        store = self._store()
        handed_on: list[dict[str, Any]] = []
        try:
            calls = [("reset_session", {})] if same_database else []
            calls.append(("close_fenced_attempt", {"run_id": run["run_id"], "token": run["token"],
                                                   "now": self.clock(), "error_message": why}))
            with store.transaction():
                results = self.chain_with_hand_on(store, calls, self.clock())
            handed_on = results[-1].rows if self.queue is not None else []
        except Exception as exc:  # history only; the run itself is already someone else's
            log.warning("run %s: could not record the fenced attempt: %s", run["run_id"], describe(exc))
        self.send_handed_on(handed_on)
        log.warning("run %s attempt %s (token %s): %s; its work was rolled back", run["run_id"], run["attempt"],
                    run["token"], why)
        self.telemetry.event("RunFailed", {**properties, "outcome": "lease_lost", "error_message": why},
                             operation_id=operation_id)
        return ExecutionResult(Outcome.LEASE_LOST, run["run_id"], why)

    def failed(self, attempt: Attempt, error: AttemptError, same_database: bool, *,
               output: list[str] | None = None) -> ExecutionResult | None:
        """A failed attempt. Returns the result, or None when a step's ON_FAILURE took the run on
        to another step (``attempt.run`` is updated to it)."""
        run, properties, operation_id = attempt.run, attempt.properties, attempt.operation_id
        body, dequeue_count, message_id = attempt.body, attempt.dequeue_count, attempt.message_id
        number, sqlstate, message = error.number, error.sqlstate, error.message
        output = output or []
        text = self.output_text(output)
        record = ([("record_attempt_output", {"run_id": run["run_id"], "token": run["token"],
                                              "attempt": run["attempt"], "step_output": text})]
                  if text is not None else [])
        store = self._store()
        run_id, token, attempt_number = run["run_id"], run["token"], run["attempt"]
        now = self.clock()
        failure = {**properties, "error_number": number, "error_message": message}
        if output:
            failure["output"] = cap_output(output, TELEMETRY_OUTPUT_MAX_BYTES)
        max_dequeue = self.settings.agent.max_dequeue_count
        reset = [("reset_session", {})] if same_database else []
        errors = {"error_number": number, "error_sqlstate": sqlstate, "error_message": message}
        if error.transient:
            deliveries = dequeue_count if dequeue_count is not None else run["transient_errors"] + 1
            if deliveries >= max_dequeue:
                where = "delivery" if dequeue_count is not None else "transient error"
                return self.poison(run_id=run_id, token=token, dequeue_count=deliveries, message_id=message_id,
                                    body=body or RunMessage(run_id, token, operation_id).to_json(),
                                    operation_id=operation_id, attempt_error=error, job=properties["job"],
                                    parent_run_id=run.get("parent_run_id"),
                                    reason=f"transient error on {where} {deliveries} of "
                                           f"AGENT_MAX_DEQUEUE_COUNT={max_dequeue}: {message}")
            if dequeue_count is not None:
                lease_until = now + timedelta(seconds=self.settings.agent.dispatch_lease_seconds)
                call = ("requeue_transient", {"run_id": run_id, "token": token, "now": now,
                                              "lease_until": lease_until, **errors})
            else:
                retry_at = now + timedelta(seconds=self.transient_delay_seconds)
                call = ("retry_transient", {"run_id": run_id, "token": token, "now": now, "retry_at": retry_at,
                                            **errors})
            with store.transaction():
                results = self.chain_with_hand_on(store, reset + [call] + record, now)
            if not results[len(reset)].rows:
                return self.fenced(attempt, f"transient error after the lease moved on: {message}", same_database)
            self.send_handed_on(results[-1].rows if self.queue is not None else [])
            log.warning("run %s attempt %s: transient error (no attempt spent), %s: %s", run_id, attempt_number,
                        "the queue will redeliver" if dequeue_count is not None else "retried later", message)
            self.telemetry.event("RunRetried", {**failure, "outcome": "redeliver"}, operation_id=operation_id)
            if dequeue_count is not None:
                raise TransientJobError(run_id, message)
            return ExecutionResult(Outcome.TRANSIENT, run_id, message)
        outcome = error.attempt_outcome
        if attempt.step is not None:
            return self.step_failed(attempt, now, outcome, error, output, reset)
        interval = run.get("retry_interval_seconds")
        retry_at = now + timedelta(seconds=interval if interval is not None else self.backoff_seconds(run["failures"] + 1))
        calls = (reset + [("fail_run", {"run_id": run_id, "token": token, "now": now, "retry_at": retry_at,
                                        "outcome": outcome, **errors})]
                 + record + fleet_progress_calls(run, now) + ending_calls(self.settings, now))
        with store.transaction():
            results = self.chain_with_hand_on(store, calls, now)
        row = results[len(reset)].one()
        if row is None:
            return self.fenced(attempt, f"failed after the lease moved on: {message}", same_database)
        self.report_fleet_progress(calls, results)
        report_follow_ups(follow_up_rows(calls, results), self.telemetry)
        self.send_handed_on(results[-1].rows if self.queue is not None else [])
        if row["status"] == RunStatus.PENDING:
            log.warning("run %s attempt %s failed (%s of MAX_ATTEMPTS=%s spent): %s; retry at %s", run_id, attempt_number,
                        row["failures"], row["max_attempts"], message, retry_at.isoformat())
            self.telemetry.event("RunRetried", {**failure, "outcome": "retry_scheduled",
                                                "retry_at": retry_at}, operation_id=operation_id)
            return ExecutionResult(Outcome.RETRY_SCHEDULED, run_id, message)
        log.error("run %s failed after %s attempt(s): %s", run_id, row["failures"], message)
        self.telemetry.event("RunFailed", {**failure, "outcome": "failed"}, operation_id=operation_id)
        return ExecutionResult(Outcome.FAILED, run_id, message)

    def step_failed(self, attempt: Attempt, now: datetime, outcome: str, error: AttemptError, output: list[str],
                    reset: list[tuple[str, dict[str, Any]]]) -> ExecutionResult | None:
        """An error in a step's SQL (or its timeout) spends one of the step's MAX_ATTEMPTS: the
        step again after its RETRY_INTERVAL_SECONDS (default: the backoff) while attempts remain,
        else the step's ON_FAILURE — all fenced, in one transaction."""
        run, step, properties, operation_id = attempt.run, attempt.step, attempt.properties, attempt.operation_id
        assert step is not None, "a step's failure needs the step"
        number, message = error.number, error.message
        failures = run["failures"] + 1
        retry_at = None
        if failures < step.max_attempts:
            interval = (step.retry_interval_seconds if step.retry_interval_seconds is not None
                        else self.backoff_seconds(failures))
            retry_at = now + timedelta(seconds=interval)
        params = self.transition(attempt, now, outcome=outcome, action=step.on_failure, retry_at=retry_at,
                                 failures=failures, output=output, error=error)
        store = self._store()
        ends = params["run_status"] != RunStatus.RUNNING
        calls = reset + [("step_transition", params)] + (ending_calls(self.settings, now) if ends else [])
        with store.transaction():
            results = self.chain_with_hand_on(store, calls, now) if ends else store.chain(*calls)
        moved = results[len(reset)].one()
        if moved is None:
            return self.fenced(attempt, f"failed after the lease moved on: {message}", bool(reset))
        report_follow_ups(follow_up_rows(calls, results), self.telemetry)
        self.send_handed_on(results[-1].rows if self.queue is not None and ends else [])
        failure = {**properties, "error_number": number, "error_message": message}
        self.step_event("StepFailed", failure, outcome, output, operation_id)
        if moved["status"] == RunStatus.PENDING:
            log.warning("run %s step %s attempt %s failed (%s of the step's MAX_ATTEMPTS=%s spent): %s; retry at %s",
                        run["run_id"], step.step, run["attempt"], failures, step.max_attempts, message,
                        retry_at.isoformat())
            self.telemetry.event("RunRetried", {**failure, "outcome": "retry_scheduled", "retry_at": retry_at},
                                 operation_id=operation_id)
        else:
            log.warning("run %s step %s failed after %s attempt(s): %s; ON_FAILURE %s", run["run_id"], step.step,
                        failures, message, step.on_failure)
        return self.after_transition(attempt, moved, error_message=f"step {step.step}: {message}")

    def backoff_seconds(self, failures: int) -> float:
        base = self.settings.agent.retry_backoff_seconds
        return float(min(MAX_BACKOFF_SECONDS, base * (2 ** max(0, failures - 1))))

    # ------------------------------------------------------------ poison

    def poison(self, *, run_id: int | None, token: int | None, body: str, dequeue_count: int,
                message_id: str | None, reason: str, operation_id: str | None,
                attempt_error: AttemptError | None = None,
                job: str | None = None, parent_run_id: int | None = None) -> ExecutionResult:
        """Take the message (or, in direct mode, the run) out of circulation: keep the body and
        every error, mark the run (only when this message holds its current token) and return
        normally, so the host deletes the message instead of retrying it."""
        store = self._store()
        now = self.clock()
        number, sqlstate, message = ((attempt_error.number, attempt_error.sqlstate, attempt_error.message)
                                     if attempt_error else (None, None, None))
        followed: list[dict[str, Any]] = []
        with store.transaction():
            marked = False
            if token is not None and run_id is not None:
                # The run first (and its open attempt, closed with the last error), then the record.
                marked = bool(store.execute("poison_run", run_id=run_id, token=token, now=now, reason=reason,
                                            error_number=number, error_sqlstate=sqlstate,
                                            error_message=message).rows)
                if marked:
                    # A poisoned execution ends its part of the fleet (when its message was poisoned
                    # unread, the tick moves the fleet on).
                    for name, params in fleet_progress_calls({"parent_run_id": parent_run_id, "run_id": run_id,
                                                              "token": token}, now):
                        self.fleet_moved(store.execute(name, **params).rows)
                    for name, params in ending_calls(self.settings, now):
                        followed += follow_up_rows([(name, params)], [store.execute(name, **params)])
            errors: list[dict[str, Any]] = []
            if run_id is not None:
                for row in store.execute("list_run_errors", run_id=run_id).rows:
                    errors.append({key: (value.isoformat() if isinstance(value, datetime) else value)
                                   for key, value in row.items()})
            errors.append({"outcome": "poisoned", "error_message": reason, "at": now.isoformat()})
            poison_id = store.execute("insert_poison", run_id=run_id, message_id=message_id, body=body,
                                      dequeue_count=dequeue_count, reason=reason,
                                      errors=json.dumps(errors, default=str), now=now).scalar()
        log.error("message %s poisoned (poison id %s, run %s): %s", message_id or "-", poison_id, run_id, reason)
        if marked and self.notifier is not None:
            self.notifier.wake()
        report_follow_ups(followed, self.telemetry)
        if followed and self.queue is not None:
            # The poisoned run's end started its followers: dispatched now, not at the next doorbell.
            try:
                dispatch(self._store(), self.queue, self.settings, self.clock(), self.telemetry)
            except Exception as exc:  # noqa: BLE001 - they wait for the next doorbell or tick instead
                log.warning("dispatching the follow-up runs of run %s failed: %s", run_id, describe(exc))
        self.telemetry.event("RunPoisoned", {"job": job, "run_id": run_id, "token": token,
                                             "dequeue_count": dequeue_count,
                                             "outcome": "poisoned" if marked else "message_poisoned",
                                             "error_message": reason, "poison_id": poison_id},
                             operation_id=operation_id)
        return ExecutionResult(Outcome.POISONED, run_id, reason)


def target_properties(run: dict[str, Any]) -> dict[str, Any]:
    """What every event of a fleet target execution carries: its database and its run."""
    if run.get("parent_run_id") is None:
        return {}
    return {"target_database": run.get("target_database"), "target_server": run.get("target_server") or "",
            "parent_run_id": run["parent_run_id"]}


def fleet_progress_calls(run: dict[str, Any], now: datetime) -> list[tuple[str, dict[str, Any]]]:
    """In the transaction that ends a fleet target execution: move its fleet on (let the next
    execution in, or move the run on when this was the last). Nothing for any other run."""
    if run.get("parent_run_id") is None:
        return []
    return [("progress_fleets", {"parent_run_id": run["parent_run_id"], "run_id": run.get("run_id"),
                                 "token": run.get("token"), "now": now})]
