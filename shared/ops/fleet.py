"""Fleet targets seen from the operator's side: a job's fleet steps resolved now, for
``grant-sql --targets`` (which databases need the app's user) and ``doctor`` (can the agent
reach each of them).

Resolution is the one the executor does at every run (shared/engine/fleet.py, shared/jobs/targets.py): one
listing per server or elastic pool the members need, shared here by every step and job that
needs it, then the members turned into databases.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from shared.errors import UsageError
from shared.control.store import Store
from shared.jobs.targets import Target, TargetMember, dialect_problem, needs_listing, parse_targets, resolve

ListingKey = tuple[str, "str | None", "str | None"]     # ('server' | 'pool', server, pool)
# doctor connects to this many targets at once.
PROBE_PARALLELISM = 8
# doctor tries each target once: a refusing database answers at once, and a check that waited
# out every target's retries would take minutes on a large fleet. (A paused serverless target
# answers 40613 and is reported with that reason; runs retry it.)
PROBE_RETRY_SECONDS = 0.0


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
    from shared.engine.fleet import list_databases
    from shared.control.sqlerrors import describe

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
                resolution.listing_errors[key] = describe(_unwrap(exc))
    for step in steps:
        resolution.steps.append(replace(step, targets=tuple(resolve(step.members, listings, dialect=dialect))))
    return resolution


def database_fleet_jobs(agent: Any) -> dict[str, list[FleetStep]]:
    """The fleet steps of the valid jobs defined from T-SQL (agent.add_scheduled_job @targets),
    as the engine planned them, by job name: one query."""
    from shared.engine.planning import PROCEDURE
    from shared.jobs.steps import run_steps

    fleets: dict[str, list[FleetStep]] = {}
    setting = f"{PROCEDURE} @targets"
    store = agent.store()
    if store.schema_version() == 0:
        return fleets                  # no schema yet: no job defined from T-SQL either
    store.require_schema()
    for row in store.execute("list_database_fleet_jobs").rows:
        steps = [FleetStep(row["job_name"], s.step, setting, parse_targets(setting, s.targets))
                 for s in run_steps(row) if s.targets]
        if steps:
            fleets[row["job_name"]] = steps
    return fleets


def job_fleet(agent: Any, name: str) -> list[FleetStep]:
    """The fleet steps of the job ``name``, from the agent's settings or, for a job defined from
    T-SQL, from the control database; UsageError naming the job when there is no such valid job,
    or it has no fleet step, or the control database cannot run fleets."""
    job = agent.settings.job(name)
    if job is None:
        invalid = next((bad for bad in agent.settings.invalid_jobs if bad.name == name), None)
        if invalid is not None:
            raise UsageError(f"--targets {name}: the job is invalid: {invalid.message}")
        defined_in_database = database_fleet_jobs(agent)
        if name not in defined_in_database:
            fleets = sorted({j.name for j in agent.settings.jobs if any(s.targets for s in j.steps)}
                            | set(defined_in_database))
            raise UsageError(f"--targets {name}: no valid job named {name!r} with fleet targets in the settings or "
                             f"defined from T-SQL (jobs with fleet targets: {', '.join(fleets) or 'none'})")
        steps = defined_in_database[name]
    else:
        steps = fleet_steps(job)
        if not steps:
            raise UsageError(f"--targets {name}: job {name!r} has no fleet step (expected JOB__{name}__TARGETS or "
                             f"JOB__{name}__STEPS__<n>__TARGETS; it runs in "
                             f"{'database ' + repr(job.database) if job.database else 'the control database'})")
    problem = dialect_problem([m for s in steps for m in s.members], agent.target.dialect)
    if problem:
        raise UsageError(f"--targets {name}: {problem} (the control database is {agent.target.display})")
    return steps


def probe_target(agent_target: Any, target: Target) -> str | None:
    """Connect to ``target`` once and run SELECT 1: None when it answers, else why not."""
    from shared.control.db import connector
    from shared.control.sqlerrors import describe

    fast = replace(agent_target, connect_retry_seconds=PROBE_RETRY_SECONDS)
    try:
        connection = connector(fast, target.database, target.server)()
    except Exception as exc:
        return describe(_unwrap(exc))
    try:
        cursor = connection.cursor()
        cursor.execute("SELECT 1")
        cursor.fetchall()
        cursor.close()
        return None
    except Exception as exc:
        return describe(_unwrap(exc))
    finally:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - the answer is already known
            pass


def probe_targets(agent_target: Any, targets: Iterable[Target], *,
                  parallelism: int = PROBE_PARALLELISM) -> dict[Target, str | None]:
    """Each target probed once, ``parallelism`` at a time."""
    targets = list(dict.fromkeys(targets))
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(parallelism, len(targets)), thread_name_prefix="probe") as pool:
        answers = list(pool.map(lambda t: probe_target(agent_target, t), targets))
    return dict(zip(targets, answers))


def fast_target_store(agent: Any) -> Callable[..., Store]:
    """A target_store like Agent.target_store, trying each connection once (doctor)."""
    from shared.control.db import connector

    fast = replace(agent.target, connect_retry_seconds=PROBE_RETRY_SECONDS)

    def open_store(database: str, server: str | None = None) -> Store:
        return Store(fast, connector(fast, database, server), job_principal=agent.settings.agent.job_principal)

    return open_store


def _unwrap(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
