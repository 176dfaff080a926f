"""Resolving a fleet step's targets against the servers, at run time.

A run of a fleet step lists each server (or elastic pool) its members need once, through the
named queries ``list_server_databases`` / ``list_pool_databases`` (SQL Server: in the server's
``master``; PostgreSQL: ``pg_database`` from any database of the server), then turns the members
into the databases to run in (shared/jobs/targets.py). The executor then creates one execution per
database in one statement (``fan_out_targets``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from shared.control.sqlerrors import describe
from shared.control.store import Store
from shared.jobs.run_model import RunStatus
from shared.jobs.targets import Target, TargetMember, needs_listing, parse_targets, resolve, user_databases

log = logging.getLogger(__name__)
# The database a listing connects to on another server.
LISTING_DATABASE = {"mssql": "master", "postgres": "postgres"}


def listing_store(dialect: str, server: str | None, control_store: Callable[[], Store],
                  target_store: Callable[..., Store]) -> tuple[Store, bool]:
    """The store a listing of ``server`` runs on, and whether the caller must close it. On
    PostgreSQL the agent's own server is listed from the control database; SQL Server lists from
    ``master`` (on Azure SQL a user database sees only itself there)."""
    if dialect == "postgres" and server is None:
        return control_store(), False
    return target_store(LISTING_DATABASE[dialect], server), True


def list_databases(kind: str, server: str | None, pool: str | None, *, dialect: str,
                   control_store: Callable[[], Store], target_store: Callable[..., Store]) -> list[str]:
    """The databases of a server (``kind`` 'server', system databases left out) or of an
    elastic pool (``kind`` 'pool'): one query."""
    store, close = listing_store(dialect, server, control_store, target_store)
    try:
        if kind == "pool":
            rows = store.execute("list_pool_databases", pool=pool).rows
        else:
            rows = store.execute("list_server_databases").rows
        names = [row["name"] for row in rows]
    finally:
        if close:
            store.close()
    return names if kind == "pool" else user_databases(names, dialect)


def resolve_members(members: tuple[TargetMember, ...], *, dialect: str, control_store: Callable[[], Store],
                    target_store: Callable[..., Store]) -> list[Target]:
    """The databases the members name now: one listing per server or pool they need."""
    listings: dict[tuple[str, str | None, str | None], list[str]] = {}
    for kind, server, pool in needs_listing(members):
        listings[(kind, server, pool)] = list_databases(kind, server, pool, dialect=dialect,
                                                        control_store=control_store, target_store=target_store)
    return resolve(members, listings, dialect=dialect, own_server=control_store().target.own_server())


def resolve_step_targets(targets: str, *, dialect: str, control_store: Callable[[], Store],
                         target_store: Callable[..., Store], setting: str = "TARGETS") -> list[Target]:
    """A step's stored TARGETS (normalised members) resolved now."""
    return resolve_members(parse_targets(setting, targets), dialect=dialect, control_store=control_store,
                           target_store=target_store)


def targets_json(targets: list[Target]) -> list[dict[str, Any]]:
    """The fan_out_targets parameter: one {n, target_server, target_database} per execution
    (n from 1: the first TARGET_PARALLELISM start at once)."""
    return [{"n": n, "target_server": t.server, "target_database": t.database} for n, t in enumerate(targets, 1)]


def report_moved_runs(rows: list[dict[str, Any]], telemetry: Any) -> bool:
    """Log (and, for an end, send RunSucceeded / RunFailed with the target counts) each run that
    progress_fleets moved on; True when one of them ended (its notification is due)."""
    ended = False
    for row in rows:
        job = row["job_name"] or "(task)"
        if row["status"] == RunStatus.PENDING:
            log.info("run %s (%s): its targets ended; on to step %s", row["run_id"], job, row["step"])
            continue
        ended = True
        log.log(logging.INFO if row["status"] == RunStatus.SUCCEEDED else logging.ERROR, "run %s (%s) %s after its targets: %s",
                row["run_id"], job, row["status"], row["last_error"] or "all succeeded")
        telemetry.event("RunSucceeded" if row["status"] == RunStatus.SUCCEEDED else "RunFailed",
                        {"job": job, "run_id": row["run_id"], "outcome": row["status"],
                         "error_message": row["last_error"], "targets": row["targets_total"],
                         "targets_failed": row["targets_failed"]}, operation_id=row["operation_id"])
    return ended


ListingKey = tuple[str, "str | None", "str | None"]     # ('server' | 'pool', server, pool)


@dataclass(frozen=True)
class FleetStep:
    job: str
    step: int
    setting: str                       # the setting its TARGETS came from, for messages
    members: tuple[TargetMember, ...]
    targets: tuple[Target, ...] = ()


@dataclass
class FleetResolution:
    steps: list[FleetStep] = field(default_factory=list)
    listed: list[ListingKey] = field(default_factory=list)          # every listing the steps need
    listing_errors: dict[ListingKey, str] = field(default_factory=dict)

    def targets(self) -> list[Target]:
        """Every target of every step, once, sorted."""
        return sorted({t for step in self.steps for t in step.targets}, key=lambda t: (t.server or "", t.database))

    def steps_needing(self, key: ListingKey) -> list[FleetStep]:
        return [step for step in self.steps if key in needs_listing(step.members)]


def listing_text(key: ListingKey) -> str:
    kind, server, pool = key
    where = f"server {server}" if server else "the agent's own server"
    return f"elastic pool {pool!r} on {where}" if kind == "pool" else f"the databases of {where}"


def target_text(target: Target) -> str:
    return f"db {target.database} on " + (f"server {target.server}" if target.server else "the agent's server")


def fleet_steps(job: Any) -> list[FleetStep]:
    """The steps of ``job`` (a JobDefinition) that run in fleet targets, members parsed."""
    one_step = job.targets is not None
    steps = []
    for step in job.steps:
        if not step.targets:
            continue
        setting = f"JOB__{job.name}__TARGETS" if one_step else f"JOB__{job.name}__STEPS__{step.step}__TARGETS"
        steps.append(FleetStep(job.name, step.step, setting, parse_targets(setting, step.targets)))
    return steps


def resolve_fleet(steps: Iterable[FleetStep], *, dialect: str, control_store: Callable[[], Store],
                  target_store: Callable[..., Store], keep_going: bool = False) -> FleetResolution:
    """The steps with their targets resolved now: each listing once for all of them. A listing
    that fails raises, or with ``keep_going`` is recorded (its steps resolve without it: their
    plain db: members still count)."""

    steps = list(steps)
    resolution = FleetResolution()
    listings: dict[ListingKey, list[str]] = {}
    for step in steps:
        for key in needs_listing(step.members):
            if key in listings or key in resolution.listing_errors:
                continue
            resolution.listed.append(key)
            kind, server, pool = key
            try:
                listings[key] = list_databases(kind, server, pool, dialect=dialect, control_store=control_store,
                                               target_store=target_store)
            except Exception as exc:
                if not keep_going:
                    raise
                resolution.listing_errors[key] = describe(unwrap_cause(exc))
    own_server = control_store().target.own_server()
    for step in steps:
        resolution.steps.append(replace(step, targets=tuple(resolve(step.members, listings, dialect=dialect,
                                                                     own_server=own_server))))
    return resolution


def unwrap_cause(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
