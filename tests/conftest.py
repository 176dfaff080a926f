"""Shared fixtures: every store scenario runs on SQLite and on PostgreSQL (through pyodbc,
as production reaches Azure SQL), and on SQL Server when AGENT_TEST_MSSQL is set; each
PostgreSQL test gets a database of its own. The plain helpers tests import (make_agent, query,
work, ...) are in tests/support/harness.py, which says where each service comes from.

The tests are grouped by what they need: tests/unit (no service), tests/integration
(PostgreSQL, SQLite, Azurite, SQL Server or Babelfish when set), tests/e2e (processes, the
browser, Azurite end to end), tests/repo (the repository's files: README, docs, Bicep,
.funcignore, lint, packaging); their helpers are in tests/support.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.harness import (  # noqa: E402
    AGENTS_MADE,
    DIALECT_PARAMS,
    LEAST_PRIVILEGE,
    create_pg_database,
    drop_pg_database,
    fresh_database,
    least_privilege_database,
    make_agent,
)


@pytest.fixture(params=DIALECT_PARAMS)
def db_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty control database URL of each dialect."""
    with fresh_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def pg_url() -> Iterator[str]:
    if LEAST_PRIVILEGE:   # AGENT_TEST_PG_LEAST_PRIVILEGE=1: the agent connects as grant-sql --agent-login's login
        with least_privilege_database(test_tables=True) as (url, _, _):
            yield url
        return
    name, url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(name)


# The agents a test's body built (make_agent records each in AGENTS_MADE) are closed after it,
# before its fixtures drop their databases.
_BODY_AGENTS = pytest.StashKey[list]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    first = len(AGENTS_MADE)
    yield
    made, AGENTS_MADE[first:] = AGENTS_MADE[first:], []
    item.stash[_BODY_AGENTS] = made


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    for agent in reversed(item.stash.get(_BODY_AGENTS, [])):
        agent.close()
    yield


@pytest.fixture
def agent_factory(db_url):
    """Build agents on the test's database; closes them afterwards."""
    agents = []

    def build(jobs=None, *, clock=None, queue=None, simulated_time=True, **agent_settings):
        agent = make_agent(db_url, jobs, clock=clock, queue=queue, simulated_time=simulated_time, **agent_settings)
        agents.append(agent)
        return agent

    yield build
    for agent in agents:
        agent.close()
