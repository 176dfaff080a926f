"""The executor: one run in, one fenced attempt out.

Two ways in, one way through:

* **queue mode** (the Functions queue trigger, or the local runner on a storage queue):
  ``handle(body, dequeue_count)`` validates the message (malformed, unknown run, forged token →
  poison at once; a doorbell → dispatch only), then starts the run it names under the start lock
  only if the message's token is still current: a message early for its slot is re-sent for the
  rest of the wait; a run that may not start yet is held (back to pending; a completion hands it
  on) or skipped (overlap skip, misfire);
* **direct mode** (the local runner without a storage queue): ``work_once()`` claims runnable
  runs straight from agent.runs, the same rules deciding, in one statement.

Then: the process's supervisor renews the lease and enforces the timeout; the job's SQL runs
in a transaction; completion is conditional on the token and, for work in the control database,
commits in the same transaction as the work (a fenced-off worker's work rolls back), together
with the hand-on dispatch of what became runnable (queue mode). Failures are classified:
transient errors and lapses spend no attempt (queue mode: the queue redelivers, poison at the
dequeue-count threshold; direct mode: the run waits and retries, poison at the same threshold);
errors in the job's SQL and timeouts spend one of MAX_ATTEMPTS, retried after a backoff.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from shared.control.sqlerrors import classify, describe, retry_transient
from shared.control.store import Store
from shared.engine.dispatch import delay_until, dispatch
from shared.engine.endings import Attempt, ExecutionResult, RunEndings, target_properties
from shared.engine.fleet import resolve_step_targets, targets_json
from shared.engine.notify import notifications_enabled
from shared.engine.scheduler import Scheduler
from shared.errors import ConnectError, LeaseLost, MessageError
from shared.jobs.model import StepDefinition
from shared.jobs.run_model import RUN_ENDING_OUTCOMES, AttemptError, Outcome, RunStatus
from shared.jobs.params import ParamError, values_for_run
from shared.jobs.tokens import TokenError, has_tokens, run_time_values, substitute_at_run
from shared.jobs.steps import QUIT_SUCCESS, cap_output, run_steps, target_step
from shared.jobs.targets import member_servers, parse_targets
from shared.messaging.messages import DoorbellMessage, RunMessage, decode_body, parse_message
from shared.settings import Settings

log = logging.getLogger(__name__)
UTC = timezone.utc
MAX_BACKOFF_SECONDS = 3600
# A step's output as a telemetry property (Application Insights keeps 8 KiB of a value).
TELEMETRY_OUTPUT_MAX_BYTES = 8192


class Executor:
    def __init__(self, *, settings: Settings, store: Callable[[], Store], target_store: Callable[[str], Store],
                 telemetry: Any, supervisor: Any, queue: Any = None,
                 clock: Callable[[], datetime] | None = None, transient_delay_seconds: float = 30.0,
                 notifier: Any = None, database_decides_now: bool = False) -> None:
        """``queue`` is the queue port in queue mode (re-sends, hand-on dispatch), None in
        direct mode. ``transient_delay_seconds``: how long a direct-mode run waits after a
        transient error (the queue's redelivery delay, host.json visibilityTimeout).
        ``database_decides_now``: ``clock`` is the database's (shared.control.clock), so a claim
        asks the database's own clock whether a run is runnable instead of ``clock``'s reading,
        which lags it by a round trip: a run made at the server's now (agent.start_job,
        agent.exec_async, another process's run-now) is runnable at once, not a few
        milliseconds later (when `work --until-idle` had already found nothing and ended)."""
        self.settings = settings
        self._store = store
        self._target_store = target_store
        self.telemetry = telemetry
        self.supervisor = supervisor
        self.queue = queue
        self.clock = clock or (lambda: datetime.now(UTC))
        self.database_decides_now = database_decides_now
        self.worker = settings.agent.worker_id
        self.transient_delay_seconds = transient_delay_seconds
        # Delivers the notification outbox off this worker's path (None: no webhook configured).
        self.notifier = notifier if notifications_enabled(settings) else None
        # Every way out of an attempt (shared/engine/endings.py).
        self.endings = RunEndings(settings=settings, store=store, telemetry=telemetry, queue=queue, clock=self.clock,
                                  worker=self.worker, transient_delay_seconds=transient_delay_seconds,
                                  notifier=self.notifier)
        # Direct mode: called in a worker's thread as a run completes, True when the worker will
        # go on claiming (the local runner's loops): then, on PostgreSQL, the completion's batch
        # claims the worker's next run after its COMMIT (_claim_ahead). None: never.
        self.claim_ahead: Callable[[], bool] | None = None
        # Per worker thread: runs the last completion claimed, not yet executed.
        self._ahead = threading.local()

    # ------------------------------------------------------------ queue mode

    def handle(self, body: str | bytes, dequeue_count: int, message_id: str | None = None) -> ExecutionResult:
        """Process one delivery. Returns normally when the message should be deleted;
        raises TransientJobError when the queue should deliver it again."""
        max_dequeue = self.settings.agent.max_dequeue_count
        try:
            text = decode_body(body)
            message = parse_message(text)
        except MessageError as exc:
            shown = body if isinstance(body, str) else body.decode("utf-8", errors="replace")
            return self.endings.poison(run_id=None, token=None, body=shown, dequeue_count=dequeue_count,
                                message_id=message_id, reason=f"malformed message: {exc}", operation_id=None)
        if isinstance(message, DoorbellMessage):
            return self._doorbell()
        if dequeue_count > max_dequeue:
            # Deliveries that never reached a verdict (e.g. a worker crash loop) end here; not a
            # delivery of a run a live worker holds (its lease renewed): that worker's verdict is
            # to come, and a worker that stops renewing loses the run to the tick, not to this.
            held = self._held_by_a_live_worker(message)
            if held is not None:
                return held
            return self.endings.poison(run_id=message.run_id, token=message.token, body=text, dequeue_count=dequeue_count,
                                message_id=message_id, operation_id=message.operation_id,
                                reason=f"dequeue count {dequeue_count} is above AGENT_MAX_DEQUEUE_COUNT={max_dequeue}")
        store = self._store()
        now = self.clock()
        rows = store.execute("start_run", run_id=message.run_id, token=message.token, now=now, worker=self.worker,
                             dequeue_count=dequeue_count, max_concurrency=self.settings.agent.max_concurrency,
                             late_cutoff=self._late_cutoff(now)).rows
        if not rows:
            return self._not_started(message, text, dequeue_count, message_id)
        run = rows[0]
        decision = run["decision"]
        if decision == "early":
            return self._resend_early(run, text, now)
        if decision.startswith("skip-"):
            self._skipped_event(run)
            return ExecutionResult(Outcome.SKIPPED, run["run_id"], run["note"] or "")
        if decision.startswith("held-"):
            log.info("run %s held: %s", run["run_id"], run["note"])
            return ExecutionResult(Outcome.HELD, run["run_id"], run["note"] or "")
        return self._execute(run, body=text, dequeue_count=dequeue_count, message_id=message_id)

    def _doorbell(self) -> ExecutionResult:
        """A doorbell plans the jobs the T-SQL procedures defined (claiming their slots) and
        dispatches; it never fails (the tick is the safety net) and is never poisoned."""

        now = self.clock()
        try:
            # Jobs the T-SQL procedures defined since the last look get their slots first.
            Scheduler(self._store(), self.queue, self.settings, self.telemetry, clock=self.clock).poll(now)
        except Exception as exc:  # noqa: BLE001 - the dispatch below still runs; the tick plans too
            log.warning("doorbell: planning the jobs defined in the database failed: %s", describe(exc))
        try:
            outcome = dispatch(self._store(), self.queue, self.settings, now, self.telemetry)
            return ExecutionResult(Outcome.DOORBELL, None, f"{len(outcome.queued)} run(s) dispatched")
        except Exception as exc:  # noqa: BLE001
            log.warning("doorbell: dispatch failed (the next doorbell or tick tries again): %s", describe(exc))
            return ExecutionResult(Outcome.DOORBELL, None, "dispatch failed")

    def _resend_early(self, run: dict[str, Any], text: str, now: datetime) -> ExecutionResult:
        """The message came before the run's slot: send it again for the rest of the wait (a
        new message, so this early delivery is not counted) and acknowledge this one."""
        delay = max(1, delay_until(run["runnable_at"], now))
        self.queue.send_many([text], delays=[delay])
        detail = f"run {run['run_id']}: message arrived {delay} s before its slot; re-sent delayed"
        log.info(detail)
        return ExecutionResult(Outcome.EARLY, run["run_id"], detail)

    def _held_by_a_live_worker(self, message: RunMessage) -> ExecutionResult | None:
        """A delivery of the token a worker is running now, its lease not lapsed: acknowledged as
        a duplicate (the run stays that worker's), else None."""
        run = self._store().execute("get_run", run_id=message.run_id).one()
        if run is None or run["status"] != RunStatus.RUNNING or run["token"] != message.token \
                or run["lease_expires_at"] is None:
            return None
        lease = run["lease_expires_at"]
        lease = lease.replace(tzinfo=UTC) if lease.tzinfo is None else lease
        if lease <= self.clock():
            return None
        return self._acknowledged(message, run)

    def _not_started(self, message: RunMessage, text: str, dequeue_count: int,
                     message_id: str | None) -> ExecutionResult:
        run = self._store().execute("get_run", run_id=message.run_id).one()
        # A message naming no run, or a token never issued, is malformed: its poison record names
        # no run (requeue would start the run that id names, or one created under it later).
        if run is None:
            return self.endings.poison(run_id=None, token=None, body=text, dequeue_count=dequeue_count,
                                message_id=message_id, operation_id=message.operation_id,
                                reason=f"unknown run {message.run_id}")
        if message.token > run["token"]:
            return self.endings.poison(run_id=None, token=None, body=text, dequeue_count=dequeue_count,
                                message_id=message_id, operation_id=message.operation_id, job=run["job_name"],
                                reason=f"token {message.token} was never issued (run {message.run_id} is at token {run['token']})")
        return self._acknowledged(message, run)

    def _acknowledged(self, message: RunMessage, run: dict[str, Any]) -> ExecutionResult:
        kind = Outcome.STALE if message.token < run["token"] else Outcome.DUPLICATE
        detail = (f"run {message.run_id}: message token {message.token}, run token {run['token']}, "
                  f"status {run['status']}: acknowledged without running ({kind})")
        log.info(detail)
        self.telemetry.event("StaleMessage", {"job": run["job_name"] or "(task)", "run_id": message.run_id,
                                              "token": message.token, "outcome": kind,
                                              "scheduled_for": run["scheduled_for"]},
                             operation_id=message.operation_id or run["operation_id"])
        return ExecutionResult(kind, message.run_id, detail)

    # ------------------------------------------------------------ direct mode

    def work_once(self, batch: int = 1) -> list[ExecutionResult]:
        """Claim up to ``batch`` runnable runs from agent.runs and execute them; an empty list
        means nothing may start now, on the database's clock (``database_decides_now``). Runs
        this thread's last completion claimed already (``claim_ahead``) are executed first,
        instead of a claim."""
        rows = self.take_claimed_ahead()
        if not rows:
            store = self._store()
            rows = store.execute("claim_runs", **self._claim_params(batch)).rows
        return self._run_claimed(rows)

    def take_claimed_ahead(self) -> list[dict[str, Any]]:
        """The runs this thread's last completion claimed (and forgets them): a worker that stops
        runs them first (shared/engine/runner.py), as it would any run it had claimed."""
        rows = getattr(self._ahead, "rows", None) or []
        self._ahead.rows = []
        return rows

    def _run_claimed(self, rows: list[dict[str, Any]]) -> list[ExecutionResult]:
        results = []
        for run in rows:
            if run["decision"] == "skipped":
                self._skipped_event(run)
                results.append(ExecutionResult(Outcome.SKIPPED, run["run_id"], run["note"] or ""))
        for run in rows:
            if run["decision"] == "start":
                results.append(self._execute(run, body=None, dequeue_count=None, message_id=None))
        return results

    def _claim_params(self, batch: int) -> dict[str, Any]:
        now = self.clock()
        return {"now": None if self.database_decides_now else now, "late_cutoff": self._late_cutoff(now),
                "worker": self.worker, "max_concurrency": self.settings.agent.max_concurrency, "batch": batch}

    def _claim_ahead(self, store: Store, owner: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """Whether this completion also claims the worker's next run, in its batch after the
        COMMIT (RunEndings.finish's ``ahead``): direct mode on PostgreSQL, a worker that goes on
        claiming (``claim_ahead``), a run that worked in the agent's own transaction with the
        agent's rights (Store.can_run_after_commit: not an owned run, whose session is closed).

        The semantics are the claim's own, a moment earlier: the claim runs after the COMMIT, in
        a transaction of its own, exactly as the claim the worker would have sent next on the same
        connection. It sees this run's end (the place it freed under AGENT_MAX_CONCURRENCY, the
        next task of an order it made runnable, the follow-ups it started), decides on the
        database's clock under the start lock, and commits before the batch returns. It runs
        only if the COMMIT ran: the fence (agent.finish_run) and the transaction check
        (agent.check_work_transaction) raise in SQL and stop the batch before both. The run it
        claims is this worker's as a claimed run always is (its token, its lease from now),
        executed next; a worker that stops first runs it before it ends (LocalRunner). Claimed
        with the completion's reading of the clock, which is the next claim's less one round trip."""
        if self.queue is not None or self.claim_ahead is None or owner or store.dialect != "postgres":
            return None
        if getattr(self._ahead, "rows", None) or not self.claim_ahead():
            return None               # one run ahead at most (work_once with a batch of several)
        return self._claim_params(1), []

    # ------------------------------------------------------------ the attempt

    def _execute(self, run: dict[str, Any], *, body: str | None, dequeue_count: int | None,
                 message_id: str | None) -> ExecutionResult:
        store = self._store()
        run = dict(run)
        if "step" in run and run["step"] is None:
            # PostgreSQL: the run's row was not yet visible to the start statement's snapshot
            # (inserted while it waited for the start lock); read its steps now.
            current = store.execute("get_run", run_id=run["run_id"]).one() or {}
            run["step"], run["steps"] = current.get("step") or 1, current.get("steps")
        steps = run_steps(run)
        run_id, token, attempt = run["run_id"], run["token"], run["attempt"]
        operation_id = run["operation_id"]
        properties = {"job": run["job_name"] or "(task)", "run_id": run_id, "attempt": attempt, "token": token,
                      "scheduled_for": run["scheduled_for"], "kind": run["kind"], **target_properties(run)}
        if self.telemetry.enabled:
            lag = (run["started_at"] - run["scheduled_for"]).total_seconds()
            self.telemetry.event("RunStarted", {**properties, "outcome": "running"}, operation_id=operation_id)
            self.telemetry.metric("ScheduleLagSeconds", max(0.0, lag), {"job": properties["job"]},
                                  operation_id=operation_id)
        if steps is not None:
            step = steps[run["step"] - 1]
            store.execute("begin_step_attempt", run_id=run_id, token=token, attempt=attempt, step=step.step,
                          target_database=step.database)
        started = time.perf_counter()
        while True:
            step = steps[run["step"] - 1] if steps is not None else None
            result = self._attempt(run, step, steps, body=body, dequeue_count=dequeue_count,
                                   message_id=message_id, operation_id=operation_id)
            if result is not None:
                break
            # The run went on to its next step at once, in this worker, under the same token.
        if result.outcome in RUN_ENDING_OUTCOMES and self.notifier is not None:
            self.notifier.wake()
        if result.outcome == Outcome.SUCCEEDED:
            duration_ms = (time.perf_counter() - started) * 1000
            log.debug("run %s (%s) succeeded in %.0f ms", run_id, properties["job"], duration_ms)
            if self.telemetry.enabled:
                extra = {"output": result.output} if result.output else {}
                self.telemetry.event("RunSucceeded", {**properties, "attempt": run["attempt"], "outcome": "succeeded",
                                                      "duration_ms": round(duration_ms), **extra},
                                     operation_id=operation_id)
                self.telemetry.metric("RunDurationMs", duration_ms, {"job": properties["job"]},
                                      operation_id=operation_id)
                if dequeue_count is not None:
                    self.telemetry.metric("DequeueCount", dequeue_count, {"job": properties["job"]},
                                          operation_id=operation_id)
        return result

    def _attempt(self, run: dict[str, Any], step: StepDefinition | None, steps: list[StepDefinition] | None, *,
                 body: str | None, dequeue_count: int | None, message_id: str | None,
                 operation_id: str) -> ExecutionResult | None:
        """One attempt: of the run (a one-step job), or of the step the run is at. Returns the
        result, or None when the run went on to another step (``run`` is updated to it)."""
        store = self._store()
        run_id, token = run["run_id"], run["token"]
        properties = {"job": run["job_name"] or "(task)", "run_id": run_id, "attempt": run["attempt"],
                      "token": token, "scheduled_for": run["scheduled_for"], "kind": run["kind"],
                      **target_properties(run)}
        if step is not None:
            properties["step"] = step.step
        attempt = Attempt(run, step, steps, properties, operation_id, body, dequeue_count, message_id)
        if step is not None and step.targets:
            return self._fan_out(attempt, step)
        command = step.command if step is not None else run["command"]
        try:
            # Parameters are bound (never in the text); SQL Agent's tokens are text, replaced
            # through their escape macros. Both only for a run that has them: the others take
            # the path they always took (no statement more, one substring search).
            params = values_for_run(run.get("params"), run.get("job_params"))
            # SQL Agent replaces tokens in a job step's command, never in ad-hoc SQL: a task's
            # (submit, agent.exec_async, and its fleet executions) runs as written, $( and all.
            if "$(" in command and run["kind"] != "task" and has_tokens(command):
                values = self._token_values(store, run, step)
                if values is not None:
                    command = substitute_at_run(command, values)
        except (ParamError, TokenError) as exc:
            return self.endings.failed(attempt, AttemptError("permanent", None, None, str(exc)), False, output=[])
        database = step.database if step is not None else run["target_database"]
        timeout_seconds = step.timeout_seconds if step is not None else run["timeout_seconds"]
        same_database = not database
        server = run.get("target_server") if step is None else None
        try:
            work_store = store if same_database else self._target_store(database, server)
        except Exception as exc:  # e.g. DATABASE on the embedded SQLite database
            info = classify(exc)
            return self.endings.failed(attempt, AttemptError("permanent", info.number, info.sqlstate, info.message),
                                       False, output=[])
        held = self.supervisor.hold(run_id, token, lease_seconds=run["lease_seconds"],
                                    timeout_seconds=timeout_seconds, cancel=work_store.cancel)
        store.operation_id = operation_id
        handed_on: list[dict[str, Any]] = []
        output: list[str] = []
        moved: dict[str, Any] | None = None
        owner: str | None = None
        try:
            owner = self._owner(store, run)
            with work_store.transaction(immediate=False):
                with self.telemetry.sql_call(properties["job"], target=work_store.target.display,
                                             operation_id=operation_id, data=command[:1000]):
                    work_store.run_script(command, output, owner=owner, params=params)
                if same_database:
                    ahead = self._claim_ahead(store, owner) if step is None else None
                    handed_on, moved = self.endings.finish(store, attempt, output, reset=True, ahead=ahead)
                    if ahead is not None and ahead[1]:
                        self._ahead.rows = ahead[1]
            if not same_database:
                # Work in another database has committed: at-least-once from here on.
                handed_on, moved = retry_transient(lambda: self.endings.finish_alone(attempt, output),
                                                   what=f"completing run {run_id}")
        except LeaseLost:
            return self.endings.fenced(attempt, "completion refused: the run's token moved on", same_database)
        except Exception as exc:
            if held.reason == "lease":
                return self.endings.fenced(attempt, "work stopped: the lease was taken over or the run cancelled",
                                           same_database)
            info = classify(exc)
            if run.get("parent_run_id") is not None and isinstance(exc, ConnectError) and info.kind == "transient":
                # A fleet target that cannot be reached (after AGENT_CONNECT_RETRY_SECONDS of
                # retries): this execution fails, retried per its step's policy.
                info = replace(info, kind="permanent")
            if held.reason == "timeout":
                setting = f"STEPS__{step.step}__TIMEOUT_SECONDS" if step is not None else "TIMEOUT_SECONDS"
                error = AttemptError("timeout", None, None, f"timed out after {timeout_seconds} s (JOB {setting})")
            else:
                message = info.message
                if owner and repr(owner) not in message:    # e.g. "permission denied": whose rights
                    message = f"{message} (the job runs as its owner {owner!r}, who defined it from T-SQL)"
                error = AttemptError(info.kind, info.number, info.sqlstate, message)
            return self.endings.failed(attempt, error, same_database, output=output)
        finally:
            store.operation_id = None
            self.supervisor.release(held)
            if not same_database:
                work_store.close()
        self.endings.send_handed_on(handed_on)
        if step is None or moved is None:
            return ExecutionResult(Outcome.SUCCEEDED, run_id, output=cap_output(output, TELEMETRY_OUTPUT_MAX_BYTES) or "")
        self.endings.step_event("StepSucceeded", properties, "succeeded", output, operation_id)
        return self.endings.after_transition(attempt, moved, error_message=None)

    def _token_values(self, store: Store, run: dict[str, Any], step: StepDefinition | None) -> dict[str, str] | None:
        """The run-time SQL Agent tokens' values (shared/jobs/tokens.py): the run's start and the
        current time in the job's time zone, its job's name (a fleet execution's: its run's job),
        the step's number. The job's name and time zone are one indexed read (token_context), made
        only for a command that has a token: every other run's path is what it was. None: the run
        is no job's (a task's fleet execution): its SQL has no tokens."""
        context = store.execute("token_context", run_id=run["run_id"]).one() or {}
        job_name = context.get("job_name") or run.get("job_name")
        if not job_name:
            return None
        return run_time_values(job_name=job_name,
                               step=step.step if step is not None else int(run.get("step") or 1),
                               started_at=run.get("started_at") or self.clock(), now=self.clock(),
                               time_zone=context.get("timezone"))

    def _owner(self, store: Store, run: dict[str, Any]) -> str | None:
        """The principal a run's SQL runs as when it was defined from the database side
        (agent.exec_async, agent.add_scheduled_job: migration 0007), else None (the agent's user,
        or AGENT_JOB_PRINCIPAL). start_run and claim_runs return it with the run (no statement of
        its own); a run dict from elsewhere costs one indexed read. Always from the database: this
        process's copy of the settings is no proof that the job of that name is still the
        settings' one (another process may have synced their removal and an operator defined the
        name since)."""
        if store.dialect == "sqlite":
            return None             # no procedures: nothing is defined from the database side
        # The claim says '' for the agent's user. NULL: the claim could not tell (none does now:
        # PostgreSQL's claim functions read it from the very row they claimed, migration 0013;
        # until then the statement calling them read it with an older snapshot, and a fleet
        # execution another worker created meanwhile was claimed unseen); never read as "no
        # owner", which would run an operator's job with the agent's rights.
        if run.get("owner") is not None:
            return run["owner"] or None
        return store.execute("run_owner", run_id=run["run_id"]).scalar()

    def _fan_out(self, attempt: Attempt, step: StepDefinition) -> ExecutionResult:
        """A fleet step: resolve its targets now (one listing per server or pool), then, fenced by
        the token, create one execution per database and let the run wait for them (no lease, no
        worker slot) — one statement, with the hand-on dispatch of the first executions in queue
        mode. The execution that ends last moves the run on (shared/sql: progress_fleets)."""

        run, properties, operation_id = attempt.run, attempt.properties, attempt.operation_id
        store = self._store()
        run_id, token = run["run_id"], run["token"]
        try:
            values = values_for_run(run.get("params"), run.get("job_params"))
        except ParamError as exc:
            return self.endings.failed(attempt, AttemptError("permanent", None, None, str(exc)), False, output=[])
        held = self.supervisor.hold(run_id, token, lease_seconds=run["lease_seconds"],
                                    timeout_seconds=step.timeout_seconds, cancel=lambda: None)
        try:
            try:
                # A server the deployer did not allow fails the step before any listing or
                # execution (the connector refuses it too, whoever asks).
                for server in sorted(member_servers(parse_targets("TARGETS", step.targets or ""))):
                    store.target.check_fleet_server(server)
                targets = resolve_step_targets(step.targets or "", dialect=store.dialect, control_store=self._store,
                                               target_store=self._target_store,
                                               setting=f"STEPS__{step.step}__TARGETS")
            except Exception as exc:
                info = classify(exc)
                if isinstance(exc, ConnectError) and info.kind == "transient":
                    # A server that still cannot be reached after AGENT_CONNECT_RETRY_SECONDS of
                    # retries: the step's attempt fails (retried per its policy), as a target's
                    # execution does, rather than burning deliveries into poison.
                    info = replace(info, kind="permanent")
                return self.endings.failed(attempt, AttemptError(info.kind, info.number, info.sqlstate,
                                                                 f"resolving the targets ({step.targets}): {info.message}"),
                                           False, output=[])
            if not targets:
                return self.endings.failed(attempt, AttemptError("permanent", None, None,
                                                                 f"the targets ({step.targets}) name no database now"),
                                           False, output=[])
            now = self.clock()
            params = {"run_id": run_id, "token": token, "now": now, "targets": targets_json(targets),
                      "target_count": len(targets), "parallelism": step.target_parallelism,
                      "stagger_seconds": step.target_stagger_seconds,
                      "next_on_success": flow_number(step.on_success), "next_on_failure": flow_number(step.on_failure),
                      "command": step.command, "max_attempts": step.max_attempts,
                      "timeout_seconds": step.timeout_seconds, "retry_interval_seconds": step.retry_interval_seconds,
                      "step": step.step,
                      # The run's parameters go with its executions, the job's defaults filled in
                      # (an execution has no job of its own to read them from).
                      "params": json.dumps(values, ensure_ascii=False) if values else None}
            with store.transaction():
                results = self.endings.chain_with_hand_on(store, [("fan_out_targets", params)], now)
                if results[0].one() is None:
                    raise LeaseLost()
        except LeaseLost:
            return self.endings.fenced(attempt, "fan-out refused: the run's token moved on", False)
        finally:
            self.supervisor.release(held)
        self.endings.send_handed_on(results[-1].rows if self.queue is not None else [])
        detail = (f"step {step.step}: {len(targets)} target execution(s), {step.target_parallelism} at a time: "
                  + ", ".join(t.text() for t in targets[:10]) + (", ..." if len(targets) > 10 else ""))
        log.info("run %s (%s) %s", run_id, properties["job"], detail)
        self.telemetry.event("TargetsResolved", {**properties, "outcome": "fanned_out", "targets": len(targets),
                                                 "target_parallelism": step.target_parallelism},
                             operation_id=operation_id)
        return ExecutionResult(Outcome.FANNED_OUT, run_id, detail)

    def _late_cutoff(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self.settings.agent.misfire_threshold_seconds)

    def _skipped_event(self, run: dict[str, Any]) -> None:
        note = run.get("note") or ""
        log.info("run %s (%s) slot %s skipped: %s", run["run_id"], run["job_name"], run["scheduled_for"], note)
        if self.telemetry.enabled:
            name = "OverlapSkipped" if note.startswith("overlap") else "MisfireSkipped"
            self.telemetry.event(name, {"job": run["job_name"] or "(task)", "run_id": run["run_id"],
                                        "scheduled_for": run["scheduled_for"], "outcome": "skipped",
                                        "error_message": note}, operation_id=run["operation_id"])


def flow_number(action: str) -> int:
    """A resolved flow action as progress_fleets reads it: the step to go to, 0 to quit with
    success, -1 to quit with failure."""
    target = target_step(action)
    if target is not None:
        return target
    return 0 if action == QUIT_SUCCESS else -1
