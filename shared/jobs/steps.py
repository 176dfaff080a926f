"""Job steps (SQL Agent's job steps): their settings, validation and flow.

A job either has one ``COMMAND`` (a one-step job: today's behaviour and rows) or steps
``JOB__<name>__STEPS__<n>__COMMAND`` numbered 1..N, each with optional ``__DATABASE``,
``__MAX_ATTEMPTS``, ``__RETRY_INTERVAL_SECONDS``, ``__TIMEOUT_SECONDS``, ``__ON_SUCCESS`` and
``__ON_FAILURE`` (``next``, ``quit_success``, ``quit_failure``, ``goto:<n>``). SQL Agent's
defaults: on success the next step (after the last one: quit with success), on failure quit
with failure.

Validation happens at sync, per job: gaps in the numbering, a goto to a missing step, a step
from which no quit can be reached (a loop with no way out). Each problem is one line; the job
alone is invalid. The flow is resolved once here (``next`` becomes ``goto:<n+1>`` or the quit
after the last step), so the executor only follows ``goto:<n>`` and the two quits.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from shared.errors import ConfigError
from shared.jobs.model import JOB_SETTING_PREFIX, MAX_STEPS, StepDefinition
from shared.jobs.targets import MAX_PARALLELISM, MAX_STAGGER_SECONDS, describe_members, parse_targets
from shared.values import DATABASE_NAME_PATTERN, parse_int, printable, storable_problem

FLOW_ACTIONS = ("next", "quit_success", "quit_failure", "goto:<n>")
_GOTO = re.compile(r"^goto:(\d+)\Z")
QUIT_SUCCESS = "quit_success"
QUIT_FAILURE = "quit_failure"


def one_fleet_step(command: str, *, max_attempts: int, timeout_seconds: int, targets: str, parallelism: int,
                   stagger_seconds: int = 0):
    """The step of a one-step fleet job (JOB__<name>__TARGETS, or agent.add_scheduled_job
    @targets): the executor runs fleets as steps. ``targets``: the normalised members."""

    return StepDefinition(step=1, command=command.strip(), database=None, max_attempts=max_attempts,
                          retry_interval_seconds=None, timeout_seconds=timeout_seconds, on_success=QUIT_SUCCESS,
                          on_failure=QUIT_FAILURE, targets=targets, target_parallelism=parallelism,
                          target_stagger_seconds=stagger_seconds)


def parse_steps(name: str, values: dict[str, tuple[str, str]], errors: list[str], *, default_max_attempts: int,
                default_timeout_seconds: int, default_database: str | None, default_parallelism: int = 8,
                default_stagger_seconds: int = 0, names: Callable[[int | None, str], str] | None = None):
    """The job's steps from its ``STEPS__<n>__<SUFFIX>`` entries of ``values`` (key, raw value),
    appending one line per problem to ``errors``. ``names(n, SUFFIX)``: what a problem calls step
    n's SUFFIX (n None: every step's) when ``values`` holds no key for it; by default the setting
    JOB__<name>__STEPS__<n>__<SUFFIX> (agent.set_job_steps names its @steps' fields)."""

    by_number: dict[int, dict[str, tuple[str, str]]] = {}
    for suffix, entry in values.items():
        if not suffix.startswith("STEPS__"):
            continue
        _, number_text, step_suffix = suffix.split("__", 2)
        try:
            number = int(number_text)
        except ValueError:
            number = 0
        if not 1 <= number <= MAX_STEPS or str(number) != number_text.strip():
            errors.append(str(ConfigError(entry[0], entry[1][:80], f"a step number from 1 to {MAX_STEPS} "
                                          f"in JOB__<name>__STEPS__<n>__{step_suffix} (found {number_text!r})")))
            continue
        by_number.setdefault(number, {})[step_suffix] = entry
    if not by_number:
        return ()
    numbers = sorted(by_number)
    prefix = f"{JOB_SETTING_PREFIX}{name}__STEPS__"
    if names is None:
        def names(step: int | None, suffix: str) -> str:
            return f"{prefix}{'<n>' if step is None else step}__{suffix}"
    if numbers != list(range(1, len(numbers) + 1)):
        missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
        errors.append(f"{prefix}<n>__*: steps must be numbered 1, 2, 3, ... without gaps; found steps "
                      f"{', '.join(map(str, numbers))} (missing {', '.join(map(str, missing))})")
        return ()
    last = numbers[-1]
    steps = []
    for number in numbers:
        entries = by_number[number]

        def key(suffix: str) -> str:
            return entries.get(suffix, (names(number, suffix), ""))[0]

        def value(suffix: str) -> str | None:
            entry = entries.get(suffix)
            return None if entry is None or not entry[1].strip() else entry[1].strip()

        def number_setting(suffix: str, default: int | None, low: int, high: int) -> int | None:
            raw = value(suffix)
            if raw is None:
                return default
            try:
                return parse_int(key(suffix), raw, low, high)
            except ConfigError as exc:
                errors.append(str(exc))
                return default

        command = value("COMMAND")
        if command is None:
            errors.append(str(ConfigError(key("COMMAND"), entries.get("COMMAND", ("", None))[1],
                                          "the SQL this step runs (non-empty)")))
        database = value("DATABASE") or default_database
        if value("DATABASE") is not None and not DATABASE_NAME_PATTERN.match(database):
            errors.append(str(ConfigError(key("DATABASE"), database, "a database name of letters, digits, '_' or '-'")))
        targets = None
        if value("TARGETS") is not None:
            try:
                targets = describe_members(parse_targets(key("TARGETS"), value("TARGETS")))
            except ConfigError as exc:
                errors.append(str(exc))
            if value("DATABASE") is not None:
                errors.append(f"{key('TARGETS')} and {key('DATABASE')} are both set: a step runs in its TARGETS "
                              "or in one DATABASE, not both")
            database = None

        parallelism = number_setting("TARGET_PARALLELISM", default_parallelism, 1, MAX_PARALLELISM)
        stagger = number_setting("TARGET_STAGGER_SECONDS", default_stagger_seconds, 0, MAX_STAGGER_SECONDS)
        flows = {}
        for suffix, default in (("ON_SUCCESS", "next"), ("ON_FAILURE", QUIT_FAILURE)):
            raw = (value(suffix) or default).lower()
            target = _GOTO.match(raw)
            if raw == "next":
                flows[suffix] = f"goto:{number + 1}" if number < last else (
                    QUIT_SUCCESS if suffix == "ON_SUCCESS" else QUIT_FAILURE)
            elif raw in (QUIT_SUCCESS, QUIT_FAILURE):
                flows[suffix] = raw
            elif target and 1 <= int(target.group(1)) <= last:
                flows[suffix] = f"goto:{int(target.group(1))}"
            elif target:
                errors.append(str(ConfigError(key(suffix), value(suffix), f"a goto to an existing step (this job has "
                                              f"steps 1 to {last}; there is no step {target.group(1)})")))
                flows[suffix] = QUIT_FAILURE
            else:
                errors.append(str(ConfigError(key(suffix), value(suffix), " or ".join(FLOW_ACTIONS))))
                flows[suffix] = QUIT_FAILURE
        steps.append(StepDefinition(
            step=number, command=command or "", database=database,
            max_attempts=number_setting("MAX_ATTEMPTS", default_max_attempts, 1, 100),
            retry_interval_seconds=number_setting("RETRY_INTERVAL_SECONDS", None, 0, 86400),
            timeout_seconds=number_setting("TIMEOUT_SECONDS", default_timeout_seconds, 1, 7 * 86400),
            on_success=flows["ON_SUCCESS"], on_failure=flows["ON_FAILURE"], targets=targets,
            target_parallelism=parallelism or default_parallelism,
            target_stagger_seconds=stagger))
    if errors:
        return ()
    trapped = steps_without_exit(steps)
    if trapped:
        errors.append(f"{names(None, 'ON_SUCCESS/ON_FAILURE')}: a loop that can never end: from step(s) "
                      f"{', '.join(map(str, trapped))} no quit_success or quit_failure can be reached; "
                      "give one of them a way out")
        return ()
    return tuple(steps)


# agent.set_job_steps @steps: each step a JSON object of these fields, meaning what the settings
# JOB__<name>__STEPS__<n>__<SUFFIX> mean (sql: COMMAND).
STEP_JSON_FIELDS = {"sql": "COMMAND", "database": "DATABASE", "on_success": "ON_SUCCESS", "on_failure": "ON_FAILURE",
                    "max_attempts": "MAX_ATTEMPTS", "retry_interval_seconds": "RETRY_INTERVAL_SECONDS",
                    "timeout_seconds": "TIMEOUT_SECONDS", "targets": "TARGETS", "target_parallelism": "TARGET_PARALLELISM",
                    "target_stagger_seconds": "TARGET_STAGGER_SECONDS"}
_JSON_FIELD_OF = {suffix: field for field, suffix in STEP_JSON_FIELDS.items()}
_JSON_KINDS = {"dict": "object", "str": "string", "int": "number", "float": "number", "bool": "true or false",
               "NoneType": "null"}


def step_settings_from_json(text: str, parameter: str) -> tuple[str | None, dict[str, tuple[str, str]], Callable[[int | None, str], str]]:
    """A JSON array of step objects (agent.set_job_steps @steps) as the settings' key/values
    parse_steps reads (``STEPS__<n>__<SUFFIX>``: (the name a problem gives, the raw value)): (the
    problem with the document itself, or None; the values; the namer for parse_steps). Each
    problem names ``parameter``, the step and the field."""
    def names(step: int | None, suffix: str) -> str:
        field = _JSON_FIELD_OF.get(suffix, suffix.lower())
        return f"{parameter} step {'<n>' if step is None else step} {field}"

    shown = printable(text, 200)
    try:
        document = json.loads(text)
    except RecursionError:
        return str(ConfigError(parameter, shown, "a JSON array of step objects (found arrays or objects nested "
                                                 "too deeply to read)")), {}, names
    except ValueError as exc:
        return str(ConfigError(parameter, shown, f"a JSON array of steps, e.g. [{{\"sql\": \"EXEC dbo.load\"}}, "
                                                 f"{{\"sql\": \"EXEC dbo.report\"}}] (not JSON: {exc})")), {}, names
    if not isinstance(document, list):
        kind = _JSON_KINDS.get(type(document).__name__, "value")
        return str(ConfigError(parameter, shown, f"a JSON array of steps (found a JSON {kind})")), {}, names
    if len(document) > MAX_STEPS:
        return str(ConfigError(parameter, shown, f"at most {MAX_STEPS} steps (found {len(document)})")), {}, names
    values: dict[str, tuple[str, str]] = {}
    problems = []
    for number, step in enumerate(document, start=1):
        if not isinstance(step, dict):
            problems.append(str(ConfigError(f"{parameter} step {number}", printable(json.dumps(step)),
                                            "a JSON object such as {\"sql\": \"...\", \"on_failure\": \"goto:3\"}")))
            continue
        for field, value in step.items():
            suffix = STEP_JSON_FIELDS.get(field)
            if suffix is None:
                problems.append(f"{parameter} step {number}: unknown field {printable(field)!r}; expected one of "
                                f"{', '.join(STEP_JSON_FIELDS)}")
                continue
            if value is None:
                continue            # null: the default, as a setting left out
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                problems.append(str(ConfigError(names(number, suffix), printable(json.dumps(value)),
                                                "a JSON string or whole number (or null: the default)")))
                continue
            raw = str(value)
            problem = storable_problem(raw)
            if problem:
                problems.append(str(ConfigError(names(number, suffix), printable(raw),
                                                f"text the database can store (found {problem})")))
                continue
            values[f"STEPS__{number}__{suffix}"] = (names(number, suffix), raw)
        if "sql" not in step or step.get("sql") is None:
            # parse_steps reports a missing COMMAND only for a step it was given a key of.
            values.setdefault(f"STEPS__{number}__COMMAND", (names(number, "COMMAND"), ""))
    return ("; ".join(problems) or None), values, names


def parse_steps_json(name: str, text: str | None, parameter: str, *, default_max_attempts: int,
                     default_timeout_seconds: int, default_database: str | None, default_parallelism: int = 8,
                     default_stagger_seconds: int = 0) -> tuple[list[str], tuple[StepDefinition, ...], Callable]:
    """(problems, steps, namer) of agent.set_job_steps @steps (the monitor's form's steps too): the
    JSON array read as the settings' STEPS__<n>__* and checked by parse_steps with the job's own
    defaults, as JOB__<name>__STEPS__<n>__* are; NULL, blank or [] is no step. Each problem names
    ``parameter``, the step and the field."""
    if text is None or not text.strip():
        return [], (), lambda step, suffix: parameter
    problem, values, names = step_settings_from_json(text, parameter)
    if problem:
        return [problem], (), names
    errors: list[str] = []
    steps = parse_steps(name, values, errors, default_max_attempts=default_max_attempts,
                        default_timeout_seconds=default_timeout_seconds, default_database=default_database,
                        default_parallelism=default_parallelism, default_stagger_seconds=default_stagger_seconds,
                        names=names)
    return errors, steps, names


def steps_without_exit(steps) -> list[int]:
    """Steps reachable from step 1 from which no quit can be reached whatever the outcomes."""
    edges = {s.step: [target_step(s.on_success), target_step(s.on_failure)] for s in steps}
    reaches_quit: set[int] = set()
    changed = True
    while changed:   # at most len(steps) passes; a job has at most MAX_STEPS steps
        changed = False
        for step, targets in edges.items():
            if step not in reaches_quit and any(t is None or t in reaches_quit for t in targets):
                reaches_quit.add(step)
                changed = True
    reachable, frontier = {1}, [1]
    while frontier:
        for target in edges[frontier.pop()]:
            if target is not None and target not in reachable:
                reachable.add(target)
                frontier.append(target)
    return sorted(reachable - reaches_quit)


def target_step(action: str) -> int | None:
    """The step a resolved action goes to, None for a quit."""
    match = _GOTO.match(action)
    return int(match.group(1)) if match else None


def run_steps(run: dict[str, Any]):
    """The steps copied onto a run (None for a one-step job), as StepDefinitions."""

    text = run.get("steps")
    if not text:
        return None
    return [StepDefinition(**entry) for entry in json.loads(text)]


def cap_output(lines: list[str], max_bytes: int) -> str | None:
    """A step attempt's output as stored: its lines, cut at ``max_bytes`` of UTF-8 with a note
    saying so (never in the middle of a character). None when there was none."""
    if not lines:
        return None
    text = "\n".join(lines)
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    kept = data[:max_bytes].decode("utf-8", errors="ignore")
    return f"{kept}\n[output cut at {max_bytes} bytes of {len(data)}]"
