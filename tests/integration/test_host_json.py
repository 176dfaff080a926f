"""host.json agrees with the engine's defaults, and the engine reads it.

The Functions host and the engine each hold part of the delivery rules: the host redelivers
and (as a last resort) moves messages to "<queue>-poison"; the engine poisons at its own
threshold, decodes nothing itself and bounds each job's run time. These tests fail when a
change to either side breaks the agreement.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.jobs.from_settings import JOB_DEFAULTS
from shared.messaging.port import HOST_JSON, HostQueueOptions, host_queue_options, parse_timespan
from shared.settings import ENGINE_SETTINGS

ROOT = Path(__file__).resolve().parents[2]


def engine_default(name: str) -> str:
    (spec,) = [spec for spec in ENGINE_SETTINGS if spec.name == name]
    assert spec.default is not None, f"{name} has no default"
    return spec.default


@pytest.fixture(scope="module")
def host() -> dict:
    return json.loads((ROOT / "host.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def queues(host: dict) -> dict:
    return host["extensions"]["queues"]


def test_the_engine_reads_the_repository_host_json() -> None:
    assert HOST_JSON == ROOT / "host.json"


def test_host_json_is_version_2_on_extension_bundle_4(host: dict) -> None:
    assert host["version"] == "2.0"
    # Bundle v4 carries the Storage queues extension 5.x, whose behaviour the adapter mimics
    # (base64 messageEncoding, badly encoded messages poisoned at once).
    assert host["extensionBundle"] == {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"}


def test_host_max_dequeue_count_leaves_poison_to_the_app(queues: dict) -> None:
    """At AGENT_MAX_DEQUEUE_COUNT the executor records the poison and returns normally; the host's
    own move to <queue>-poison (at maxDequeueCount) must never come first."""
    assert queues["maxDequeueCount"] >= int(engine_default("AGENT_MAX_DEQUEUE_COUNT"))


def test_the_bicep_cannot_set_an_engine_threshold_above_the_hosts(queues: dict) -> None:
    """One poison threshold: the Bicep's maxDequeueCount parameter (AGENT_MAX_DEQUEUE_COUNT in Azure)
    is capped at host.json's maxDequeueCount, in every file that declares it. Read from the source
    text, so this holds without Checkov's parser (tests/repo/test_infra.py checks the parsed Bicep too)."""
    import re

    declarations = {}
    for path in sorted((ROOT / "infra").glob("*.bicep")):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"((?:^@\w+\(.*\)\s*\n|^//.*\n)*)^param maxDequeueCount int\b", text, re.MULTILINE):
            caps = re.findall(r"^@maxValue\((\d+)\)", match.group(1), re.MULTILINE)
            declarations[path.name] = [int(cap) for cap in caps]
    assert {"main.bicep", "functionapp.bicep"} <= set(declarations), declarations
    for name, caps in declarations.items():
        assert caps == [queues["maxDequeueCount"]], (
            f"infra/{name}: maxDequeueCount is capped at {caps}, host.json maxDequeueCount is "
            f"{queues['maxDequeueCount']}: with a larger AGENT_MAX_DEQUEUE_COUNT the host moves messages to "
            "<queue>-poison before the engine poisons them")


def test_host_message_encoding_is_the_engine_default(queues: dict) -> None:
    assert queues["messageEncoding"] == engine_default("AGENT_QUEUE_ENCODING") == "base64"


def test_function_timeout_exceeds_the_default_job_timeout(host: dict) -> None:
    """The host would kill an invocation at functionTimeout; a job's own TIMEOUT_SECONDS must
    cancel it first, so the run is recorded as timed out instead of dying with the worker."""
    function_timeout = parse_timespan(host["functionTimeout"], "host.json functionTimeout")
    assert function_timeout == 3600
    assert function_timeout > int(JOB_DEFAULTS["TIMEOUT_SECONDS"])


def test_redelivery_delay_is_shorter_than_the_dispatch_lease(queues: dict) -> None:
    """After a transient failure the run waits for the redelivery under a dispatch lease; if the
    message came back later than that, a tick would dispatch the run again (a second message)."""
    visibility = parse_timespan(queues["visibilityTimeout"], "visibilityTimeout")
    assert 0 < visibility < int(engine_default("AGENT_DISPATCH_LEASE_SECONDS"))


def test_polling_and_batch_settings_are_within_the_documented_limits(queues: dict) -> None:
    polling = parse_timespan(queues["maxPollingInterval"], "maxPollingInterval")
    assert 0.1 <= polling <= 10  # the documented minimum is 100 ms; seconds keep latency low
    assert 1 <= queues["batchSize"] <= 32
    assert 0 <= queues["newBatchThreshold"] < queues["batchSize"]


def test_host_queue_options_reads_the_shipped_host_json(queues: dict) -> None:
    options = host_queue_options()
    assert options == HostQueueOptions(visibility_timeout_seconds=30.0, max_dequeue_count=5,
                                       message_encoding="base64", batch_size=8, max_polling_interval_seconds=2.0)
    assert options.max_polling_interval_seconds == parse_timespan(queues["maxPollingInterval"], "maxPollingInterval")
    assert options.max_dequeue_count == queues["maxDequeueCount"]
    assert options.batch_size == queues["batchSize"]


def test_host_queue_options_reads_other_values_and_defaults(tmp_path: Path) -> None:
    file = tmp_path / "host.json"
    file.write_text(json.dumps({"version": "2.0", "extensions": {"queues": {
        "visibilityTimeout": "1.00:00:01.5", "maxDequeueCount": 9, "messageEncoding": "None", "batchSize": 3,
        "maxPollingInterval": "00:00:00.5"}}}))
    assert host_queue_options(file) == HostQueueOptions(visibility_timeout_seconds=86401.5, max_dequeue_count=9,
                                                        message_encoding="none", batch_size=3,
                                                        max_polling_interval_seconds=0.5)
    file.write_text(json.dumps({"version": "2.0"}))
    assert host_queue_options(file) == HostQueueOptions()            # the host's own defaults
    assert host_queue_options(tmp_path / "missing.json") == HostQueueOptions()


def test_a_bad_host_json_is_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "host.json"
    file.write_text(json.dumps({"extensions": {"queues": {"visibilityTimeout": "30s"}}}))
    with pytest.raises(ConfigError) as error:
        host_queue_options(file)
    assert error.value.setting == "host.json extensions.queues.visibilityTimeout"
    assert error.value.value == "30s" and "hh:mm:ss" in str(error.value)
    file.write_text("{ not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        host_queue_options(file)


def test_the_local_runner_applies_host_json(tmp_path: Path) -> None:
    from shared.engine.runner import LocalRunner
    from tests.support.harness import make_agent

    agent = make_agent(f"sqlite:///{tmp_path / 'agent.db'}")
    try:
        runner = LocalRunner(agent)
        assert runner.visibility_timeout == 30.0
        assert runner.host.max_dequeue_count == 5
    finally:
        agent.close()


def test_an_idle_queue_consumer_backs_off_as_the_host_does_up_to_max_polling_interval() -> None:
    """The local runner's queue consumer: 100 ms after an empty poll, doubling (+-20% jitter) up
    to host.json's maxPollingInterval, and at once again after a message (not AGENT_POLL_SECONDS)."""
    from shared.messaging.port import MIN_POLLING_INTERVAL_SECONDS, next_polling_interval

    maximum = host_queue_options().max_polling_interval_seconds
    waits, previous = [], None
    for _ in range(12):
        previous = next_polling_interval(previous, False, maximum)
        waits.append(previous)
    assert waits[0] == MIN_POLLING_INTERVAL_SECONDS
    assert waits == sorted(waits) and waits[-1] == maximum == 2.0
    assert all(b <= 2 * a + 1e-9 for a, b in zip(waits, waits[1:]))
    assert next_polling_interval(maximum, True, maximum) == 0.0
    for r in (0.0, 0.999):                                  # jitter stays within the bounds
        assert MIN_POLLING_INTERVAL_SECONDS <= next_polling_interval(1.0, False, maximum, r) <= maximum


def test_the_local_runners_queue_workers_poll_within_max_polling_interval(tmp_path: Path) -> None:
    from shared.engine.runner import LocalRunner
    from shared.messaging.memory import MemoryQueue
    from tests.support.harness import make_agent

    agent = make_agent(f"sqlite:///{tmp_path / 'agent.db'}", queue=MemoryQueue(), AGENT_POLL_SECONDS="30")
    try:
        runner = LocalRunner(agent)
        assert agent.queue_mode
        waits = [runner._next_wait() for _ in range(10)]
        assert max(waits) <= runner.host.max_polling_interval_seconds == 2.0 < runner.poll_interval
    finally:
        agent.close()
