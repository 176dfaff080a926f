"""Jobs that follow jobs, as a graph (JOB__<name>__AFTER, agent.add_scheduled_job @after).

Each job follows at most one job, so the jobs form chains; a cycle is a loop of jobs each of whose
runs would start the next, forever. Definitions refuse cycles: the settings as a whole
(``from_settings``), the settings against the jobs defined in the database (the settings sync,
under the job-definitions lock), and each ``agent.add_scheduled_job`` against every job (in the
procedure, under the same lock). Pure: names in, cycles out; the callers fold names as their
database compares them (case-insensitively, as Azure SQL does).

The run-time guard (``start_follow_up_runs``) carries each follow-up run's chain of jobs with it:
a follow-up is not started for a job already in its chain, nor past MAX_CHAIN_JOBS jobs.
"""

from __future__ import annotations

from typing import Mapping

# The most jobs one chain of follow-up runs may hold (the run that started it included): the
# follow-up that would be the 101st is recorded skipped instead of started. A chain of runs also
# holds each job once at most, so it is bounded by the number of jobs besides.
MAX_CHAIN_JOBS = 100


def find_cycles(follows: Mapping[str, str]) -> dict[str, list[str]]:
    """Every job of a cycle mapped to its cycle: the jobs in walk order, each followed by the job
    it follows (``follows``: a job's key to the key of the job it follows). Each cycle is found
    once, whatever the number of jobs (each job is walked once)."""
    in_cycle: dict[str, list[str]] = {}
    done: set[str] = set()
    for start in follows:
        path: list[str] = []
        position: dict[str, int] = {}
        current: str | None = start
        while current is not None and current not in done and current not in position:
            position[current] = len(path)
            path.append(current)
            current = follows.get(current)
        if current is not None and current in position:
            cycle = path[position[current]:]
            for member in cycle:
                in_cycle[member] = cycle
        done.update(path)
    return in_cycle


# A cycle longer than this is shown with its middle left out: its first and last jobs, and how
# many between (an error line stays readable, and within what a driver reports of a message).
SHOWN_JOBS = 8


def show_chain(order: list[str]) -> str:
    """'a -> b -> a'; with more than SHOWN_JOBS jobs between the ends, the first and the last
    four of them and the count of those left out between ('a -> b -> ... (12 more) -> z -> a').
    The procedures show their cycles the same way."""
    inner = order[1:-1]
    if len(inner) > SHOWN_JOBS:
        half = SHOWN_JOBS // 2
        inner = inner[:half] + [f"... ({len(inner) - SHOWN_JOBS} more)"] + inner[-half:]
    return " -> ".join([order[0], *inner, order[-1]])


def run_order(cycle: list[str], start: str) -> list[str]:
    """The cycle from ``start`` in the order its runs start each other (a job's run starts its
    follower), back to ``start``: ['a', 'b', 'a'] for a job a that b follows and that follows b."""
    order = cycle[::-1]
    at = order.index(start)
    return order[at:] + order[:at] + [start]
