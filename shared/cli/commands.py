"""Operator commands and the local runner: the `sql-agent` command. A command parses its
arguments, calls one operator action (shared.engine.operations) or view (shared.engine.views), and prints; it
runs no statement of its own (tests/test_layers.py).

    sql-agent [--db DB] [--settings FILE] [--json] COMMAND ...
    python -m shared.cli ...          (the same, from a clone)

Exit codes: 0 success, 1 runtime failure or a finding (doctor's failed check, a tick's errors,
jobs import-sqlagent could not carry over), 2 usage or configuration error (a bad argument or
setting, a job, run or poison message that does not exist), 130 interrupted (Ctrl-C) before the
command finished, 141 stdout closed by its reader (`| head`). Errors are one line on stderr, without a traceback; with --json, every command
prints one JSON document on stdout and an error is one JSON object on stderr:
{"error": ..., "kind": ..., "setting": ..., "value": ..., "expected": ...} (the last three when known).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import signal
import sys
from dataclasses import asdict, replace
from datetime import timezone
from typing import Sequence

from shared.cli.grant import cmd_grant_sql
from shared.cli.output import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ErrorStyle,
    configure_logging,
    dispatched_text,
    known_fields,
    last_targets,
    print_attempt_output,
    print_error,
    print_fleets,
    print_json,
    print_table,
    time_text,
    warn,
)
from shared.cli.parser import build_parser
from shared.control.sqlerrors import classify
from shared.engine.alerts import alert_limits_text
from shared.engine.condition_alerts import condition_alert_text
from shared.engine.agent import Agent
from shared.engine.audit import AuditAction, command_line_actor, record_refusal
from shared.engine.liveness import liveness
from shared.engine.operations import (
    apply_import,
    backfill,
    cancel,
    dispatch_now,
    pause_job,
    requeue,
    resume_job,
    run_now,
    stop,
    submit,
)
from shared.engine.runner import LocalRunner
from shared.engine.views import (
    after_words,
    alerts_view,
    audit_view,
    catchup_words,
    history_view,
    jobs_view,
    next_view,
    params_words,
    poison_view,
    stuck_view,
)
from shared.errors import AgentError, ConfigError, NotFoundError, UsageError
from shared.jobs.run_model import RunStatus
from shared.ops.doctor import run_doctor
from shared.ops.sqlagent.source import check_encoding, decode_script
from shared.ops.sqlagent_import import ScriptError, alert_apply_calls, apply_calls, convert_script, report
from shared.settings import load_settings, merged_environment
from shared.web.app import monitor_settings
from shared.web.local_server import make_server

UTC = timezone.utc




# Operator commands (doctor, jobs, history, ...) wait at most this long for a connection; the
# commands that run the agent or install it wait the whole AGENT_CONNECT_RETRY_SECONDS.
COMMAND_CONNECT_RETRY_SECONDS = 10


WAITING_COMMANDS = ("run", "work", "tick", "init-db")




def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Known before parsing, so that a usage error is JSON too: --json anywhere before a "--".
    ErrorStyle.json = "--json" in arguments[:arguments.index("--")] if "--" in arguments else "--json" in arguments
    try:
        parser = build_parser()
        args = parser.parse_args(arguments)
        ErrorStyle.json = args.json
        configure_logging(args, process=argv is None)
        return _run(args)
    finally:
        ErrorStyle.json = False


# Commands after which the function app's next timer tick connects to the control database
# (quiet ticks, shared/engine/quiet.py): they created or changed work the tick may have to see.
WORK_CHANGING_COMMANDS = frozenset({"run-now", "backfill", "submit", "pause", "resume", "cancel", "stop", "poison", "init-db",
                                    "import-sqlagent"})


def _wake_the_timer(settings, args: argparse.Namespace) -> None:
    from shared.engine import quiet

    if args.db:
        settings = replace(settings, agent=replace(settings.agent, db=args.db))
    quiet.invalidate(settings, f"sql-agent {args.command}")


def _run(args: argparse.Namespace) -> int:
    agent = None
    try:
        if args.command == "completion":
            return cmd_completion(None, args)           # the parser only
        if args.command == "import-sqlagent" and not args.apply:
            return cmd_import_sqlagent(None, args)      # reads files only: no settings, no database

        settings = load_settings(settings_file=args.settings)
        if args.command not in WAITING_COMMANDS:
            # An operator's command answers within seconds: it waits out a short outage and says
            # what it saw when the database stays away (the agent itself, and init-db, wait
            # AGENT_CONNECT_RETRY_SECONDS, as long as a paused serverless database takes).
            settings = replace(settings, agent=replace(
                settings.agent, connect_retry_seconds=min(settings.agent.connect_retry_seconds,
                                                          COMMAND_CONNECT_RETRY_SECONDS)))
        agent = Agent(settings, db=args.db)
        handler = COMMANDS[args.command]
        code = handler(agent, args)
        if args.command in WORK_CHANGING_COMMANDS:
            _wake_the_timer(settings, args)
        return code
    except ConfigError as exc:
        print_error(str(exc), "config", setting=exc.setting, value=exc.value, expected=exc.expected)
        return EXIT_USAGE
    except NotFoundError as exc:
        print_error(str(exc), "not_found", **known_fields(exc))
        return EXIT_USAGE
    except UsageError as exc:
        print_error(str(exc), "usage", **known_fields(exc))
        return EXIT_USAGE
    except AgentError as exc:
        print_error(str(exc), "failure", **known_fields(exc), **driver_codes(exc.__cause__ or exc.__context__))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print_error("interrupted", "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as shell tools do; stdout goes to
        # /dev/null so that the interpreter's last flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # driver errors and the like: one line, classified

        info = classify(exc)
        code = f" [{info.number or info.sqlstate}]" if (info.number or info.sqlstate) else ""
        extra = driver_codes(exc)
        name = type(exc).__name__
        said = info.message[len(name) + 2:] if info.message.startswith(f"{name}: ") else info.message
        print_error(f"{name}{code}: {said}", "failure", **extra)
        return EXIT_FAILURE
    finally:
        if agent is not None:
            agent.close()


def driver_codes(exc: BaseException | None) -> dict[str, object]:
    """number and sqlstate of the driver's error behind a failure (a connection refused, raised as
    the agent's ConnectError from it), when the driver gave them: the --json error's fields."""
    for _ in range(10):                 # through the agent's own errors to the driver's
        if not isinstance(exc, AgentError):
            break
        exc = exc.__cause__ or exc.__context__
    if exc is None or isinstance(exc, AgentError):
        return {}
    info = classify(exc)
    return {key: value for key, value in (("number", info.number), ("sqlstate", info.sqlstate)) if value}


def cmd_init_db(agent, args) -> int:
    before, after = agent.init()
    if args.json:
        print_json({"database": agent.target.display, "dialect": agent.target.dialect,
                     "schema_version_before": before, "schema_version": after, "upgraded": before != after})
    elif before == after:
        print(f"{agent.target.display}: schema is at version {after}, nothing to do")
    else:
        print(f"{agent.target.display}: schema upgraded from version {before} to {after}")
    return EXIT_OK


def cmd_tick(agent, args) -> int:
    report = agent.tick(args.now)
    summary = report.summary()
    if report.refused and not args.json:
        print(f"error: {report.errors[0]}", file=sys.stderr)   # one line: the skew, and that nothing changed
        return EXIT_FAILURE
    if args.json:
        print_json(summary)
    else:
        print(f"tick at {summary['now']}: {summary['jobs_due']} due, {summary['runs_claimed']} claimed, "
              f"{summary['runs_skipped']} skipped, {summary['runs_dispatched']} dispatched, "
              f"{summary['leases_expired']} leases expired ({summary['statements']} statements, "
              f"{summary['duration_ms']} ms)")
        for warning in report.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for error in report.errors:
            print(f"error: {error}", file=sys.stderr)
    return EXIT_FAILURE if report.errors else EXIT_OK


def cmd_work(agent, args) -> int:

    agent.store().require_schema()
    agent.release()   # the workers take connections as they find work (AGENT_MAX_CONNECTIONS)
    runner = LocalRunner(agent, concurrency=args.concurrency, visibility_timeout=args.visibility_timeout)
    count = runner.work_once() if args.once else runner.work_until_idle(args.max_seconds)
    if args.json:
        print_json({"processed": count, "unit": "messages" if agent.queue_mode else "runs"})
    else:
        print(f"processed {count} {'message(s)' if agent.queue_mode else 'run(s)'}")
    return EXIT_OK


def cmd_run(agent, args) -> int:

    before, after = agent.init()
    agent.release()
    runner = LocalRunner(agent, concurrency=args.concurrency)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())
    jobs = ", ".join(job.name for job in agent.settings.jobs) or "none"
    where = (f"queue {agent.queue.name}" if agent.queue_mode
             else f"workers claim from the runs table, {runner.concurrency} at most at once")
    # Announced inside the try: a Ctrl-C right after the announcement stops the runner as usual.
    try:
        if args.json:        # the one document, at start (the runner runs until stopped)
            print(json.dumps({"running": True, "database": agent.target.display, "schema_version": after,
                              "mode": "queue" if agent.queue_mode else "direct",
                              "queue": agent.queue.name if agent.queue_mode else None,
                              "concurrency": runner.concurrency, "jobs": [job.name for job in agent.settings.jobs],
                              "invalid_jobs": [{"name": bad.name, "error": bad.message}
                                               for bad in agent.settings.invalid_jobs]}), flush=True)
        else:
            print(f"agent running on {agent.target.display} (schema v{after}); {where}; "
                  f"jobs: {jobs}; Ctrl-C stops", file=sys.stderr)
            for bad in agent.settings.invalid_jobs:
                print(f"warning: job {bad.name} is invalid and will not run: {bad.message}", file=sys.stderr)
        runner.run()
    except KeyboardInterrupt:
        runner.stop()
    if not args.json:
        print("agent stopped", file=sys.stderr)
    return EXIT_OK


def cmd_jobs(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    # What the agent last synced (its tick syncs the settings): never this machine's settings,
    # which would mark the production jobs removed when run from an operator's laptop.
    now = agent.clock()
    rows = jobs_view(store, now)
    alive = liveness(store, now)
    if alive["late"]:
        if args.json:
            # stdout stays the one document (a list of jobs); on stderr, a log record (JSON).
            logging.getLogger("sql-agent").warning("%s", alive["message"])
        else:
            print(f"WARNING: {alive['message']}", flush=True)   # at the top, before the table
    if args.json:
        print_json(rows)
        return EXIT_OK
    table = []
    for row in rows:
        last = f"{row['last_status']} #{row['last_run_id']}" if row["last_run_id"] else "-"
        schedule = row["schedule"] or ("on demand" if row["valid"] else "-")
        if row.get("calendar_words"):
            schedule += f", {row['calendar_words']}"
        if after_words(row):
            schedule += f", {after_words(row)}"
        if catchup_words(row):
            schedule += f", {catchup_words(row)}"
        state = row["state"]
        if row.get("paused") and row.get("paused_until"):
            state = f"paused until {time_text(row['paused_until'])}"
        table.append([row["job_name"], state, row["source"], schedule, row["timezone"],
                      time_text(row["next_due_at"]), row["status"], last, last_targets(row), alert_limits_text(row),
                      params_words(row.get("params")), row["config_error"] or ""])
    print_table(["JOB", "STATE", "DEFINED IN", "SCHEDULE", "TIMEZONE", "NEXT DUE (UTC)", "NOW", "LAST RUN",
                  "LAST TARGETS", "ALERTS", "PARAMS", "ERROR"], table)
    return EXIT_OK


def cmd_next(agent, args) -> int:
    """The job's next slots (--count: 1 to 1000, checked by the parser's SLOT_COUNT)."""
    store = agent.store()
    store.require_schema()
    # The job as the agent last synced it (see cmd_jobs); its slots computed here, from its row.
    view = next_view(store, args.name, args.start or agent.clock(), args.count)
    if args.json:
        print_json(view)
        return EXIT_OK
    print(f"{view['job_name']}: {view['schedule'] or 'on demand'} ({view['schedule_words']}), "
          f"time zone {view['timezone']}" + (f"; {view['calendar_words']}" if view["calendar_words"] else ""))
    if view["slots"]:
        print_table(["#", "SLOT (UTC)", f"SLOT ({view['timezone']})", "NOTE"],
                     [[k, time_text(slot["at"]), (slot["local"] or "").replace("T", " "),
                       slot["moved"] or (f"jitter +{slot['jitter_seconds']} s" if slot["jitter_seconds"] else "")]
                      for k, slot in enumerate(view["slots"], start=1)])
    if view["removed"]:
        print()
        print_table(["REMOVED (UTC)", f"REMOVED ({view['timezone']})", "BY", "MOVED TO (UTC)"],
                     [[time_text(slot["at"]), (slot["local"] or "").replace("T", " "), slot["calendar"],
                       time_text(slot["moved_to"]) if slot["moved_to"] else "-"] for slot in view["removed"]])
    if view["note"]:
        print(view["note"])
    return EXIT_OK


def cmd_history(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    view = history_view(store, args.job, args.limit, with_output=args.json or args.output)
    runs, events = view["runs"], view["job_events"]
    by_run = {run["run_id"]: run["attempts"] for run in runs}
    if args.json:
        print_json(view)
        return EXIT_OK
    table = []
    for run in runs:
        error = run["last_error"] or run["note"] or ""
        job = run["job_name"] or (f"(target of run {run['parent_run_id']})" if run.get("parent_run_id") else "(task)")
        kind = run["kind"] if run.get("followed_run_id") is None else f"after #{run['followed_run_id']}"
        table.append([run["run_id"], job, kind, time_text(run["scheduled_for"]),
                      run["status"], f"{run['attempt']}/{run['max_attempts']}", time_text(run["finished_at"]),
                      error[:120]])
    print_table(["RUN", "JOB", "KIND", "SCHEDULED (UTC)", "STATUS", "ATTEMPTS", "FINISHED", "ERROR / NOTE"], table)
    print_fleets(runs)
    with_params = [run for run in runs if run.get("params")]
    if with_params:
        print()
        print_table(["RUN", "PARAMETERS"], [[run["run_id"], ", ".join(f"{name}={value!r}" for name, value in
                                                                       run["params"].items())[:300]]
                                            for run in with_params])
    if args.output:
        print_attempt_output(runs, by_run)
    if events:
        print()
        print_table(["EVENT", "JOB", "AT (UTC)", "KIND", "DETAIL"],
                     [[e["event_id"], e["job_name"], time_text(e["event_at"]), e["kind"], (e["detail"] or "")[:160]]
                      for e in events])
    return EXIT_OK


def cmd_audit(agent, args) -> int:
    """The audit trail, newest first (--job, --since, --limit)."""
    store = agent.store()
    store.require_schema()
    rows = audit_view(store, args.job, args.since, args.limit)
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        print("no audited actions")
        return EXIT_OK
    # Names, arguments and errors come from operators and scripts: one line each, escaped.
    print_table(["ID", "AT (UTC)", "PRINCIPAL", "FROM", "SOURCE", "ACTION", "TARGET", "OUTCOME", "DETAIL"],
                 [[r["audit_id"], time_text(r["acted_at"]), _one_line(r["principal"] or ""),
                   _one_line((r["client"] or "")[:60]), r["source"], r["action"], _one_line(_audit_target(r)),
                   r["outcome"], _one_line((r["detail"] or "")[:120])] for r in rows])
    if len(rows) == args.limit:
        print(f"(the newest {args.limit}; --limit shows more)", file=sys.stderr)
    return EXIT_OK


def cmd_alerts(agent, args) -> int:
    """The condition alerts (ALERT__<name>__*, agent.add_alert) with their state, and the latest
    responses."""
    store = agent.store()
    store.require_schema()
    view = alerts_view(store, args.limit)
    if args.json:
        print_json(view)
        return EXIT_OK
    if not view["alerts"]:
        print("no condition alerts (ALERT__<name>__QUERY or __ERRORS in the settings, or agent.add_alert)")
        return EXIT_OK
    # Names, queries and errors come from settings and callers: one line each, escaped.
    print_table(["ALERT", "FROM", "WATCHES", "DELAY S", "RESPONSE", "STATE", "NEXT CHECK (UTC)", "LAST RESPONSE (UTC)",
                 "SEEN/ANSWERED", "PROBLEM"],
                [[_one_line(a["alert_name"]), a["source"] + (f" ({_one_line(a['owner'])})" if a["owner"] else ""),
                  _one_line(condition_alert_text(a)), a["delay_seconds"],
                  _one_line(", ".join(part for part in ("notify" if a["notify"] else "",
                                                         f"start {a['response_job']}" if a["response_job"] else "")
                                      if part)),
                  a["state"], time_text(a["next_check_at"]) if not a["errors"] else "each tick",
                  time_text(a["last_response_at"]), f"{a['occurrences']}/{a['responses']}",
                  _one_line((a["config_error"] or a["last_error"] or "")[:160])] for a in view["alerts"]])
    if view["firings"]:
        print()
        print_table(["FIRING", "ALERT", "AT (UTC)", "KIND", "SAID", "RESPONSE RUN"],
                    [[f["firing_id"], _one_line(f["alert_name"]), time_text(f["raised_at"]), f["kind"],
                      _one_line(_firing_text(f["detail"] or {}))[:120],
                      f["response_run_id"] or _one_line(f["response_error"] or "-")] for f in view["firings"]])
    return EXIT_OK


def _firing_text(body: dict) -> str:
    if body.get("kind") == "condition":
        return f"{body.get('row_count', 0)} row(s)" + (f" ({body['rows_cut']})" if body.get("rows_cut") else "")
    if body.get("kind") == "errors":
        return f"{body.get('failure_count', 0)} failure(s) matching {body.get('condition')}"
    return f"probe failed: {body.get('error')}"


def _audit_target(row) -> str:
    parts = [f"job {row['job_name']}" if row["job_name"] else "", f"run {row['run_id']}" if row["run_id"] else ""]
    return ", ".join(part for part in parts if part) or "-"


def cmd_stuck(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    rows = stuck_view(store, agent.clock(), args.older_than, args.limit)
    if args.json:
        print_json(rows)
    elif rows:
        print_table(["RUN", "JOB", "STATUS", "SCHEDULED (UTC)", "LEASE EXPIRED", "TOKEN"],
                     [[r["run_id"], r["job_name"] or "(task)", r["status"], time_text(r["scheduled_for"]),
                       time_text(r["lease_expires_at"]), r["token"]] for r in rows])
        if len(rows) == args.limit:
            print(f"(the first {args.limit}; --limit shows more)", file=sys.stderr)
    else:
        print("no stuck runs")
    return EXIT_OK


def cmd_poison(agent, args) -> int:

    store = agent.store()
    store.require_schema()
    if args.poison_command == "list":
        rows = poison_view(store, args.limit)
        if args.json:
            print_json(rows)
        elif rows:
            print_table(["ID", "RUN", "DEQUEUES", "POISONED (UTC)", "REQUEUED", "REASON"],
                         [[r["poison_id"], r["run_id"] or "-", r["dequeue_count"], time_text(r["poisoned_at"]),
                           time_text(r["requeued_at"]), r["reason"][:140]] for r in rows])
        else:
            print("no poison messages")
        return EXIT_OK
    requeued = requeue(agent, args.poison_id, actor=command_line_actor())
    if args.json:
        print_json({"poison_id": requeued.poison_id, "run_id": requeued.run_id, "requeued": True,
                     "dispatched": requeued.dispatched})
    else:
        print(f"run {requeued.run_id} requeued (one more attempt){dispatched_text(requeued.dispatched)}")
    return EXIT_OK


def cmd_run_now(agent, args) -> int:
    agent.store().require_schema()
    # The job as the agent last synced it (see cmd_jobs): this machine's settings are not read.
    run = run_now(agent, args.name, params=args.param, actor=command_line_actor())
    if run.skipped:
        if args.json:
            print_json({"run_id": run.run_id, "job_name": run.job_name, "status": run.status, "note": run.note,
                         "dispatched": None, "params": run.params})
        else:
            print(f"run {run.run_id} of {run.job_name} skipped: {run.note}")
        return EXIT_OK
    if args.json:
        print_json({"run_id": run.run_id, "job_name": run.job_name, "status": run.status, "note": run.note,
                     "dispatched": run.dispatched, "params": run.params})
    else:
        print(f"run {run.run_id} of {run.job_name} created{dispatched_text(run.dispatched)}")
    return EXIT_OK



def cmd_backfill(agent, args) -> int:
    agent.store().require_schema()
    # The job as the agent last synced it (see cmd_jobs): this machine's settings are not read.
    done = backfill(agent, args.name, args.start, args.end, actor=command_line_actor())
    if args.json:
        print_json(done.as_dict())
        return EXIT_OK
    print(f"{done.job_name}: {done.slots} slot(s) from {time_text(done.start)} to {time_text(done.end)}: "
          f"{len(done.made)} run(s) made, {done.already} already run or in flight, "
          f"{done.excluded} excluded by a calendar{dispatched_text(done.dispatched)}")
    if done.made:
        print_table(["RUN", "SLOT (UTC)", "HOW"], [[row["run_id"], time_text(row["scheduled_for"]),
                                                     "rerun (was skipped)" if row["action"] == "rerun" else "new run"]
                                                    for row in done.made])
    return EXIT_OK

def _operator_name() -> str:
    """Who pauses or resumes from this command line: the operating system's user."""

    try:
        return f"{getpass.getuser()} (sql-agent)"
    except Exception:      # no user name in this environment (a container without one)
        return "sql-agent"


def cmd_pause(agent, args) -> int:
    store = agent.store()
    store.require_schema()
    pause = pause_job(store, args.name, now=agent.clock(), until=args.until, paused_by=_operator_name(),
                      reason=args.reason, telemetry=agent.telemetry, actor=command_line_actor())
    if args.json:
        print_json(pause.as_dict())
        return EXIT_OK
    until = f"until {time_text(pause.paused_until)}" if pause.paused_until else "until resumed"
    skipped = f"; {pause.runs_skipped} slot(s) it had claimed recorded skipped" if pause.runs_skipped else ""
    print(f"job {args.name} paused since {time_text(pause.paused_at)}, {until}{skipped}")
    return EXIT_OK


def cmd_resume(agent, args) -> int:
    store = agent.store()
    store.require_schema()
    resumed = resume_job(store, args.name, now=agent.clock(), resumed_by=_operator_name(), telemetry=agent.telemetry,
                         actor=command_line_actor())
    if resumed.runs_resumed or resumed.runs_caught_up:
        dispatch_now(agent)     # queue mode: the slots given back go to the queue now, not at a doorbell
    if args.json:
        print_json(resumed.as_dict())
        return EXIT_OK
    caught = "; the last slot it held is caught up now" if resumed.runs_caught_up else ""
    print(f"job {args.name} resumed (paused since {time_text(resumed.paused_at)}); {resumed.runs_resumed} slot(s) "
          f"claimed ahead run at their time{caught}")
    return EXIT_OK


def cmd_submit(agent, args) -> int:
    task = submit(agent, args.sql, order=args.order, max_attempts=args.max_attempts,
                  timeout_seconds=args.timeout_seconds, actor=command_line_actor())
    if args.json:
        print_json({"run_id": task.run_id, "kind": "task", "order": task.order, "submitted": True,
                     "dispatched": task.dispatched})
        return EXIT_OK
    order = f" (order {task.order})" if task.order is not None else ""
    print(f"task run {task.run_id} submitted{order}{dispatched_text(task.dispatched)}")
    return EXIT_OK


def cmd_cancel(agent, args) -> int:
    agent.store().require_schema()
    cancelled = cancel(agent, args.run_id, actor=command_line_actor())
    if args.json:
        print_json({"run_id": cancelled.run_id, "status": RunStatus.CANCELLED})
    else:
        print(f"run {cancelled.run_id} cancelled")
    return EXIT_OK


def cmd_monitor(agent, args) -> int:

    environ = merged_environment(args.settings)
    monitor_settings(environ)            # a bad AGENT_MONITOR_* value: one line, exit 2
    agent.store().require_schema()
    try:
        server = make_server(agent, args.port, environ, operator=args.operator)
    except OSError as exc:
        raise UsageError(f"--port {args.port}: cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); "
                         "pick another port, or 0 for any free one", setting="--port", value=args.port,
                         expected="a free TCP port on 127.0.0.1, or 0 for any free one")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    host, port = server.server_address[:2]
    try:        # announced inside the try: a Ctrl-C right after it stops the server as usual
        if args.json:       # the one document, at start: where it listens (with --port 0, the port picked)
            print(json.dumps({"monitor": f"http://{host}:{port}/", "host": host, "port": port}), flush=True)
        else:
            mode = "with the operator's actions" if args.operator else "read-only"
            print(f"monitor: http://{host}:{port}/ ({mode}; Ctrl-C stops)", file=sys.stderr, flush=True)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    if not args.json:
        print("monitor stopped", file=sys.stderr)
    return EXIT_OK


def cmd_stop(agent, args) -> int:
    agent.store().require_schema()
    stopped = stop(agent, args.name, actor=command_line_actor())
    ids = stopped.cancelled_run_ids
    if args.json:
        print_json({"job_name": stopped.job_name, "cancelled_run_ids": list(ids)})
        return EXIT_OK
    if not ids:
        print(f"job {stopped.job_name}: no run in flight")
        return EXIT_OK
    # A running step notices at its worker's next lease renewal (every LEASE_SECONDS / 3).
    print(f"job {stopped.job_name}: {len(ids)} run(s) cancelled ({', '.join(map(str, ids))}); a running step stops "
          "within a third of its lease")
    return EXIT_OK


def cmd_doctor(agent, args) -> int:

    report = run_doctor(agent, processes=args.processes)
    if args.json:
        failed = report.failed
        print_json({"target": report.target, "ok": report.ok, "failed": failed.name if failed else None,
                     "checks": [{"name": check.name, "ok": check.ok, "detail": check.detail, "fix": check.fix or None,
                                 "lines": list(check.lines)} for check in report.checks],
                     "warnings": report.warnings})
    else:
        print(report.render())
    return EXIT_OK if report.ok else EXIT_FAILURE


def cmd_import_sqlagent(agent, args) -> int:
    """SQL Server Agent job scripts -> JOB__<name>__* settings (JSON on stdout); what could not be
    carried over is listed per job (and for the script) and makes the exit code 1. --apply:
    agent.add_scheduled_job for the scheduled jobs (with agent.set_job_steps in the same
    transaction for a job with steps: the steps its JOB__<name>__STEPS__<n>__* settings say), then
    agent.add_alert for the alerts (those whose response job is among them, or that have none); the
    others (an on-demand job, an alert with a webhook of its own) stay in the printed settings and
    are listed under not_applied. --apply is an audited action: refused before it ran (an unreadable script, a bad time
    zone) it is recorded refused too."""
    try:
        return _import_sqlagent(agent, args)
    except (AgentError, OSError) as exc:
        if args.apply and agent is not None:
            record_refusal(agent.store(), command_line_actor(), AuditAction.IMPORT, clock=agent.clock, error=exc,
                           arguments={"files": list(args.files), "timezone": args.timezone,
                                      "encoding": args.encoding})
        raise


def _import_sqlagent(agent, args) -> int:

    timezone = args.timezone
    warnings: list[str] = []
    if args.encoding is not None:
        try:
            check_encoding(args.encoding)
        except ValueError as exc:
            raise UsageError(f"import-sqlagent --encoding {args.encoding!r}: {exc}; expected an encoding name such "
                             "as utf-8, utf-16, cp1252", setting="--encoding", value=args.encoding,
                             expected="an encoding name (utf-8, utf-16, utf-16-le, cp1252, ...)") from None
    texts, encodings = [], {}
    for path in args.files:
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise UsageError(f"import-sqlagent: cannot read {path!r}: {exc.strerror}", setting="FILE.sql", value=path,
                             expected="a readable T-SQL script") from None
        try:
            decoded = decode_script(raw, path, args.encoding)
        except ScriptError as exc:
            raise UsageError(f"import-sqlagent: {exc}", setting="FILE.sql", value=path,
                             expected="a T-SQL script in UTF-8, UTF-16 or Windows-1252 (or the --encoding given)") \
                from None
        for message in decoded.warnings:
            warn(args, warnings, message)
        encodings[path] = decoded.encoding
        texts.append((path, decoded.text))
    if timezone is None:       # said once the files are read: an unreadable file is the one message
        timezone = "UTC"
        warn(args, warnings, "no --timezone: the schedules are taken as UTC; SQL Server Agent runs in the server's "
                              "local time (give --timezone Europe/Paris, America/New_York, ...)")
    try:
        converted = convert_script(texts, timezone)
    except ScriptError as exc:
        raise UsageError(f"import-sqlagent: {exc}") from None
    except ValueError as exc:       # the time zone
        from shared.jobs.schedules import TIMEZONE_EXPECTED

        raise UsageError(f"import-sqlagent --timezone {timezone!r}: {exc}",
                         setting="--timezone", value=timezone, expected=TIMEZONE_EXPECTED) from None
    for source in converted.sources:
        source["encoding"] = encodings.get(source["file"])
    result = report(converted, timezone)
    incomplete = not result["complete"]
    if args.apply:
        calls, refused = apply_calls(converted)
        alerts, refused_alerts = alert_apply_calls(converted.alerts, [call["name"] for call in calls])
        applied = apply_import(agent.target, calls, alerts, store=agent.store(), now=agent.clock(),
                               actor=command_line_actor())
        # The jobs, then the alerts (each entry names one: "job" or "alert"), as not_applied does.
        result["applied"] = [asdict(added) for added in applied.jobs] + [asdict(added) for added in applied.alerts]
        refused += ([asdict(job) for job in applied.jobs_not_added] + refused_alerts
                    + [asdict(alert) for alert in applied.alerts_not_added])
        result["not_applied"] = refused
        incomplete = incomplete or bool(refused)
    if args.json:       # the same document, the warnings in it; not_carried lists what was left
        result["warnings"] = warnings
    print(json.dumps(result, indent=2, ensure_ascii=False))
    if not args.json:
        # One line each: names and commands from the script may hold line breaks, control or
        # bidirectional characters; they are escaped so that a line is what it says.
        for missing in result["not_carried"]:
            print(_one_line(f"not carried: {missing['source']}, line {missing['line']}: {missing['what']}: "
                            f"{missing['reason']}"), file=sys.stderr)
        for item in result["jobs"]:
            for missing in item["not_carried"]:
                print(_one_line(f"not carried: {item['sql_agent_name']}: {missing['what']}: {missing['reason']}"),
                      file=sys.stderr)
        for item in result["alerts"]:
            for missing in item["not_carried"]:
                print(_one_line(f"not carried: alert {item['sql_agent_name']}: {missing['what']}: {missing['reason']}"),
                      file=sys.stderr)
        for item in result.get("not_applied", ()):
            what = f"job {item['job']}" if "job" in item else f"alert {item['alert']}"
            print(_one_line(f"not applied: {what}: {item['reason']}"), file=sys.stderr)
    return EXIT_FAILURE if incomplete else EXIT_OK


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() and not ("\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069")
                   else c.encode("unicode_escape").decode("ascii") for c in text)


def cmd_completion(agent, args) -> int:
    """The shell's completion script, made by shtab from this parser (commands, sub-commands,
    options and choices)."""
    try:
        # shtab loads only for `sql-agent completion`
        import shtab
    except ImportError:
        raise UsageError("completion needs the shtab package (requirements-cli.txt; pip install . installs it)",
                         setting="completion", expected="shtab installed") from None
    script = shtab.complete(build_parser(), shell=args.shell)
    if args.json:
        print_json({"shell": args.shell, "script": script})
    else:
        print(script, end="" if script.endswith("\n") else "\n")
    return EXIT_OK


COMMANDS = {
    "init-db": cmd_init_db,
    "tick": cmd_tick,
    "work": cmd_work,
    "run": cmd_run,
    "jobs": cmd_jobs,
    "backfill": cmd_backfill,
    "next": cmd_next,
    "history": cmd_history,
    "audit": cmd_audit,
    "alerts": cmd_alerts,
    "stuck": cmd_stuck,
    "poison": cmd_poison,
    "run-now": cmd_run_now,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "submit": cmd_submit,
    "cancel": cmd_cancel,
    "monitor": cmd_monitor,
    "stop": cmd_stop,
    "doctor": cmd_doctor,
    "grant-sql": cmd_grant_sql,
    "import-sqlagent": cmd_import_sqlagent,
    "completion": cmd_completion,
}


if __name__ == "__main__":
    sys.exit(main())
