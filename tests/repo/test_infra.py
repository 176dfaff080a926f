"""Checks on the infrastructure code in infra/ (Bicep), run without Azure and without the Bicep
CLI (which cannot be installed here):

- the app settings the Bicep sets and the settings the engine reads (shared/settings.py) agree,
  in both directions, including the JOB__<name>__<SUFFIX> settings built from the `jobs`
  parameter, and the example jobs in the parameters files (manual and azd) are valid engine jobs;
- every role assignment uses a known built-in role, targets the app's managed identity and is
  scoped to the one resource it grants; the set of grants is the intended, narrow one;
- the properties the design depends on (Entra-only SQL, keyless storage, Flex Consumption,
  the Python version, ...) are there;
- main.bicep passes every module exactly the parameters the module declares (what `bicep build`
  would check);
- the alert queries use event and dimension names the engine emits;
- `checkov -d infra --framework bicep` reports no failed check.

The Bicep is parsed by pycep-parser (Checkov's own Bicep parser) in .checkov-venv; see
tests/support/infra_helpers.py. Without that venv these tests skip on a developer machine and fail in CI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from shared import settings, values
from shared.jobs import from_settings, model
from shared.telemetry import client as telemetry
from tests.support.infra_helpers import (
    INFRA,
    NETWORK_PROFILES,
    PUBLIC_ONLY_SKIP,
    REPO,
    BicepFile,
    BicepShapeError,
    accessor_path,
    bicep,
    bicep_paths,
    body,
    function_call,
    inline_skips,
    is_loop,
    parse_errors,
    render_infra,
    render_profile,
    run_checkov,
    skip_comments,
)

# App settings the Bicep may set although the engine does not read them, and who reads each.
# Anything the Bicep sets must be here or in shared.settings.ENGINE_SETTINGS.
PLATFORM_APP_SETTINGS = {
    # Functions host: identity-based host storage. It keeps singleton and timer-trigger locks
    # and the timer's schedule status as blobs (the engine only uses the queue endpoint).
    "AzureWebJobsStorage__blobServiceUri": "Azure Functions host",
    # Functions host: its diagnostic events are persisted in a table of the same account.
    "AzureWebJobsStorage__tableServiceUri": "Azure Functions host",
}

# Built-in role definition ids (identical in every tenant): the ones listed in the team's Azure
# notes, and Storage Queue Data Reader (the Functions docs' queue-trigger role, with Message
# Processor), so that a grant of any of them is recognised by name.
KNOWN_BUILT_IN_ROLES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "8a0f0c08-91a1-4084-bc3d-661d67233fed": "Storage Queue Data Message Processor",
    "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a": "Storage Queue Data Message Sender",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "19e7f393-937e-4f77-808e-94535e297925": "Storage Queue Data Reader",
}

QUEUES = "Microsoft.Storage/storageAccounts/queueServices/queues"
ACCOUNTS = "Microsoft.Storage/storageAccounts"

# The intended grants: (role, type of the resource it is scoped to, name of that resource as
# written in the Bicep). What identity-based AzureWebJobsStorage needs for this app, per the
# Functions docs ("Connecting to host storage with an identity"); widening or narrowing one has
# to change this list, on purpose (and docs/deploying.md and shared/ops/doctor.py STORAGE_ROLES,
# which test_the_roles_the_bicep_grants_are_the_ones_docs_and_doctor_name checks).
# Telemetry ingestion with Entra ID: the component has local (key) authentication disabled.
TELEMETRY_GRANTS = {("Monitoring Metrics Publisher", "Microsoft.Insights/components", "appInsightsName")}
EXPECTED_GRANTS = {
    # Host storage (blob leases for singleton/timer locks, timer status, keys) and the Flex
    # Consumption deployment container.
    ("Storage Blob Data Owner", ACCOUNTS, "storageAccountName"),
    # The queue trigger (receive, hide, delete), the tick's dispatch (send) and the host's move to
    # <queue>-poison (send, and create that queue if it is missing).
    ("Storage Queue Data Contributor", ACCOUNTS, "storageAccountName"),
    # The host's diagnostic events (AzureWebJobsStorage__tableServiceUri).
    ("Storage Table Data Contributor", ACCOUNTS, "storageAccountName"),
}

GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
JOB_SETTING_TEMPLATE = re.compile(r"^(?P<prefix>[A-Za-z_]+)\$\{(?P<item>\w+)\.name\}__(?P<suffix>[A-Z_]+)$")
# App Service: "App setting names can contain only letters, numbers (0-9), periods (.), and
# underscores (_)", and Linux apps see a period as an underscore; so job names in the Bicep
# parameters keep to letters, digits and underscores.
# A step setting of the flat jobSteps list: JOB__${s.job}__STEPS__${s.step}__<SUFFIX>.
STEP_SETTING_TEMPLATE = re.compile(r"^(?P<prefix>[A-Za-z_]+)\$\{(?P<item>\w+)\.job\}__STEPS__\$\{(?P=item)\.step\}__(?P<suffix>[A-Z_]+)$")
APP_SETTING_SAFE_JOB_NAME = re.compile(r"^[A-Za-z0-9_]+$")
CALENDAR_SETTING_TEMPLATE = re.compile(r"^CALENDAR__\$\{(?P<item>\w+)\.name\}__(?P<suffix>[A-Z_]+)$")
ALERT_SETTING_TEMPLATE = re.compile(r"^ALERT__\$\{(?P<item>\w+)\.name\}__(?P<suffix>[A-Z_]+)$")


# ------------------------------------------------------------------ reading the app settings


def _conditional(expression: Any) -> dict[str, Any] | None:
    """The operands {condition, true_value, false_value} of `condition ? a : b`, else None."""
    if isinstance(expression, dict) and expression.get("operator", {}).get("type") == "conditional":
        return expression["operator"]["operands"]
    return None


def _site(functionapp: BicepFile) -> tuple[str, dict[str, Any]]:
    return functionapp.only_resource("Microsoft.Web/sites")


def _camel_to_upper_snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).upper()


class AppSettings:
    """The site's siteConfig.appSettings, taken apart: literal {name, value} entries and the
    per-job settings generated from the `jobs` parameter."""

    def __init__(self, functionapp: BicepFile) -> None:
        self.file = functionapp
        self.literal: dict[str, Any] = {}  # name -> value expression
        self.job_fields: dict[str, str] = {}  # suffix -> key of the jobs entry
        self.job_prefixes: set[str] = set()
        self.step_fields: dict[str, str] = {}  # step suffix -> key of the jobSteps entry
        self.calendar_fields: dict[str, str] = {}  # CALENDAR__<name>__ suffix -> key of the calendars entry
        self.alert_fields: dict[str, str] = {}  # ALERT__<name>__ suffix -> key of the alerts entry
        _, site = _site(functionapp)
        self._collect(body(site)["properties"]["siteConfig"]["appSettings"], via="appSettings")

    def _collect(self, expression: Any, via: str) -> None:
        file = self.file
        if isinstance(expression, str) and expression in file.variables:
            value = file.variable(expression)
            if is_loop(value) and value["loop_type"]["detail"].get("array_name") == "jobs":
                self._job_loop(expression, value)
            elif is_loop(value) and value["loop_type"]["detail"].get("array_name") == "jobSteps":
                self._step_loop(expression, value)
            elif is_loop(value) and value["loop_type"]["detail"].get("array_name") == "calendars":
                self._calendar_loop(expression, value)
            elif is_loop(value) and value["loop_type"]["detail"].get("array_name") == "alerts":
                self._alert_loop(expression, value)
            else:
                self._collect(value, via=expression)
            return
        if isinstance(expression, list):
            for entry in expression:
                if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and "value" in entry):
                    raise BicepShapeError(f"{via}: app setting entry is not a literal {{name, value}}: {entry}")
                if entry["name"] in self.literal:
                    raise AssertionError(f"app setting {entry['name']} is set twice")
                self.literal[entry["name"]] = entry["value"]
            return
        concat = function_call(expression, "concat")
        if concat is not None:
            for argument in concat.values():
                self._collect(argument, via=via)
            return
        conditional = _conditional(expression)
        if conditional is not None:
            # `flag ? [ ... ] : [ ... ]`: settings present in one configuration or the other
            # (the user-assigned identity's client ids); both branches are collected.
            for branch in (conditional["true_value"], conditional["false_value"]):
                self._collect(branch, via=via)
            return
        filtered = function_call(expression, "filter")
        if filtered is not None:
            self._collect(filtered["input_array"], via=via)
            return
        if is_loop(expression):
            # A loop over an earlier list that passes each entry's name through unchanged
            # (the string conversion of job setting values).
            detail = expression["loop_type"]["detail"]
            name = expression["config"].get("name")
            if accessor_path(name) != [detail["item_name"], "name"]:
                raise BicepShapeError(f"{via}: a loop over {detail.get('array_name')} must keep "
                                      f"`name: {detail['item_name']}.name`, found {name}")
            self._collect(detail["array_name"], via=via)
            return
        raise BicepShapeError(f"{via}: cannot read app settings from {json.dumps(expression)[:300]}")

    def _step_loop(self, variable: str, loop: dict[str, Any]) -> None:
        item = loop["loop_type"]["detail"]["item_name"]
        name = loop["config"]["name"]
        match = STEP_SETTING_TEMPLATE.match(name) if isinstance(name, str) else None
        if not match or match.group("item") != item:
            raise BicepShapeError(f"{variable}: step setting name must look like "
                                  f"'JOB__${{{item}.job}}__STEPS__${{{item}.step}}__SUFFIX', found {name!r}")
        path = accessor_path(loop["config"]["value"])
        if len(path) != 2 or path[0] != item:
            raise BicepShapeError(f"{variable}: value must be `{item}.<field>` (or `{item}.?<field>`), found {path}")
        suffix = match.group("suffix")
        if suffix in self.step_fields:
            raise AssertionError(f"step setting suffix {suffix} is generated twice ({variable})")
        self.step_fields[suffix] = path[1]
        self.job_prefixes.add(match.group("prefix"))

    def _calendar_loop(self, variable: str, loop: dict[str, Any]) -> None:
        item = loop["loop_type"]["detail"]["item_name"]
        name = loop["config"]["name"]
        match = CALENDAR_SETTING_TEMPLATE.match(name) if isinstance(name, str) else None
        if not match or match.group("item") != item:
            raise BicepShapeError(f"{variable}: calendar setting name must look like "
                                  f"'CALENDAR__${{{item}.name}}__SUFFIX', found {name!r}")
        path = accessor_path(loop["config"]["value"])
        if len(path) != 2 or path[0] != item:
            raise BicepShapeError(f"{variable}: value must be `{item}.<field>` (or `{item}.?<field>`), found {path}")
        if match.group("suffix") in self.calendar_fields:
            raise AssertionError(f"calendar setting suffix {match.group('suffix')} is generated twice ({variable})")
        self.calendar_fields[match.group("suffix")] = path[1]

    def _alert_loop(self, variable: str, loop: dict[str, Any]) -> None:
        item = loop["loop_type"]["detail"]["item_name"]
        name = loop["config"]["name"]
        match = ALERT_SETTING_TEMPLATE.match(name) if isinstance(name, str) else None
        if not match or match.group("item") != item:
            raise BicepShapeError(f"{variable}: alert setting name must look like "
                                  f"'ALERT__${{{item}.name}}__SUFFIX', found {name!r}")
        path = accessor_path(loop["config"]["value"])
        if len(path) != 2 or path[0] != item:
            raise BicepShapeError(f"{variable}: value must be `{item}.<field>` (or `{item}.?<field>`), found {path}")
        if match.group("suffix") in self.alert_fields:
            raise AssertionError(f"alert setting suffix {match.group('suffix')} is generated twice ({variable})")
        self.alert_fields[match.group("suffix")] = path[1]

    def _job_loop(self, variable: str, loop: dict[str, Any]) -> None:
        item = loop["loop_type"]["detail"]["item_name"]
        name = loop["config"]["name"]
        match = JOB_SETTING_TEMPLATE.match(name) if isinstance(name, str) else None
        if not match or match.group("item") != item:
            raise BicepShapeError(f"{variable}: job setting name must look like "
                                  f"'JOB__${{{item}.name}}__SUFFIX', found {name!r}")
        path = accessor_path(loop["config"]["value"])
        if len(path) != 2 or path[0] != item:
            raise BicepShapeError(f"{variable}: value must be `{item}.<field>` (or `{item}.?<field>`), found {path}")
        suffix = match.group("suffix")
        if suffix in self.job_fields:
            raise AssertionError(f"job setting suffix {suffix} is generated twice ({variable})")
        self.job_fields[suffix] = path[1]
        self.job_prefixes.add(match.group("prefix"))


@pytest.fixture(scope="module")
def functionapp() -> BicepFile:
    return bicep("functionapp.bicep")


@pytest.fixture(scope="module")
def app_settings(functionapp: BicepFile) -> AppSettings:
    return AppSettings(functionapp)


# ------------------------------------------------------------------ tests


def test_every_bicep_file_parses_with_checkovs_parser():
    # A file pycep cannot parse would be reported by Checkov as a parsing error and not scanned.
    assert bicep_paths(), "infra/ holds no .bicep files"
    assert parse_errors() == {}


def test_engine_settings_contract_values_are_known():
    assert {spec.azure for spec in settings.ENGINE_SETTINGS} <= {"required", "optional", "local"}
    names = [spec.name for spec in settings.ENGINE_SETTINGS]
    assert len(names) == len(set(names)), "ENGINE_SETTINGS names a setting twice"


def test_bicep_sets_every_setting_the_engine_requires_in_azure(app_settings: AppSettings):
    required = {spec.name for spec in settings.ENGINE_SETTINGS if spec.azure == "required"}
    missing = required - set(app_settings.literal)
    assert not missing, f"shared/settings.py marks these settings required in Azure, infra/functionapp.bicep does not set them: {sorted(missing)}"


def test_bicep_sets_no_local_only_setting(app_settings: AppSettings):
    local = {spec.name for spec in settings.ENGINE_SETTINGS if spec.azure == "local"}
    wrongly_set = local & set(app_settings.literal)
    assert not wrongly_set, f"shared/settings.py marks these settings local-only, but infra/functionapp.bicep sets them: {sorted(wrongly_set)}"


def test_every_setting_the_bicep_sets_has_a_known_reader(app_settings: AppSettings):
    engine = {spec.name for spec in settings.ENGINE_SETTINGS}
    unknown = set(app_settings.literal) - engine - set(PLATFORM_APP_SETTINGS)
    assert not unknown, (
        f"infra/functionapp.bicep sets {sorted(unknown)}, which neither shared/settings.py "
        f"ENGINE_SETTINGS nor the platform allow-list in tests/repo/test_infra.py knows (renamed setting?)"
    )
    stale = set(PLATFORM_APP_SETTINGS) - set(app_settings.literal)
    assert not stale, f"platform allow-list entries the Bicep no longer sets: {sorted(stale)}"
    assert not engine & set(PLATFORM_APP_SETTINGS), "a setting is both an engine and a platform setting"


def test_identity_based_storage_settings(app_settings: AppSettings):
    # The engine and the host connect to storage with the managed identity: no connection string.
    assert app_settings.literal["AzureWebJobsStorage__credential"] == "managedidentity"
    assert "AzureWebJobsStorage" not in app_settings.literal
    assert not any("__accountKey" in name or name.endswith("ConnectionString") for name in app_settings.literal)


def test_host_storage_has_a_service_uri_for_each_service_it_is_granted(functionapp: BicepFile,
                                                                       app_settings: AppSettings):
    """Blob, queue and table are each granted (EXPECTED_GRANTS) and each has its
    AzureWebJobsStorage__<service>ServiceUri, pointing at that service of the same account over
    HTTPS: a role without its URI (or a URI without its role) is a half-configured connection."""
    granted = {role.split()[1].lower() for role, _, _ in EXPECTED_GRANTS}   # 'Storage Blob Data Owner' -> 'blob'
    assert granted == {"blob", "queue", "table"}
    uris = {name.split("__")[1][:-len("ServiceUri")]: value for name, value in app_settings.literal.items()
            if name.startswith("AzureWebJobsStorage__") and name.endswith("ServiceUri")}
    assert set(uris) == granted, f"service URIs {sorted(uris)} != granted services {sorted(granted)}"
    for service, value in uris.items():
        expected = f"https://${{storageAccountName}}.{service}.${{environment().suffixes.storage}}"
        assert functionapp.resolve(value) == expected, f"AzureWebJobsStorage__{service}ServiceUri: {value!r}"
    assert "AzureWebJobsStorage__accountName" not in app_settings.literal   # one way: the service URIs


def test_the_roles_the_bicep_grants_are_the_ones_docs_and_doctor_name():
    """One story for the storage roles: the Bicep's grants, `doctor`'s advice and the deployment
    guide's list are the same set of roles."""
    from shared.ops.doctor import STORAGE_ROLES

    granted = {role for role, _, _ in EXPECTED_GRANTS}
    assert set(STORAGE_ROLES) == granted, f"shared/ops/doctor.py STORAGE_ROLES {sorted(STORAGE_ROLES)} != {sorted(granted)}"
    guide = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    section = guide.split("## The app's storage roles", 1)[1].split("\n#", 1)[0]
    named = set(re.findall(r"\*\*(Storage [A-Za-z ]+?)\*\*", section))
    assert named == granted, f"docs/deploying.md names {sorted(named)}, the Bicep grants {sorted(granted)}"
    every_doc = "\n".join(path.read_text(encoding="utf-8") for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    other_roles = set(KNOWN_BUILT_IN_ROLES.values()) - granted - {role for role, _, _ in TELEMETRY_GRANTS}
    for role in other_roles:      # no page tells users the app needs a role it is not given
        assert role not in every_doc, f"the docs still name {role!r}, which the app is not granted"


def test_job_settings_generated_from_jobs_parameter_match_engine_suffixes(app_settings: AppSettings):
    assert app_settings.job_prefixes == {model.JOB_SETTING_PREFIX}
    generated = set(app_settings.job_fields)
    expected = set(from_settings.JOB_SETTING_SUFFIXES)
    assert generated == expected, (
        f"job setting suffixes: Bicep generates {sorted(generated)}, the engine reads {sorted(expected)}; "
        f"missing in Bicep {sorted(expected - generated)}, unknown to the engine {sorted(generated - expected)}"
    )
    for suffix, key in app_settings.job_fields.items():
        assert _camel_to_upper_snake(key) == suffix, f"jobs[].{key} becomes __{suffix}, expected __{_camel_to_upper_snake(key)}"


def test_calendar_settings_generated_from_calendars_parameter_match_the_engine(app_settings: AppSettings):
    from shared.jobs.calendars import CALENDAR_FIELDS

    assert set(app_settings.calendar_fields) == set(CALENDAR_FIELDS)
    for suffix, key in app_settings.calendar_fields.items():
        assert _camel_to_upper_snake(key) == suffix, f"calendars[].{key} becomes __{suffix}"


def test_alert_settings_generated_from_alerts_parameter_match_the_engine(app_settings: AppSettings):
    """Condition alerts (issue 32 item 3): every ALERT__<name>__<SUFFIX> the engine reads is generated
    from the `alerts` parameter, and main.bicep passes it through."""
    from shared.jobs.alert_definitions import ALERT_SETTING_SUFFIXES

    assert set(app_settings.alert_fields) == set(ALERT_SETTING_SUFFIXES)
    for suffix, key in app_settings.alert_fields.items():
        assert _camel_to_upper_snake(key) == suffix, f"alerts[].{key} becomes __{suffix}"
    main = (REPO / "infra" / "main.bicep").read_text(encoding="utf-8")
    assert "param alerts array = []" in main and "    alerts: alerts\n" in main


def test_no_job_field_is_required_in_bicep_but_the_name():
    # In the Bicep a required field is read with `job.<field>` (a missing one fails the
    # deployment), an optional one with `job.?<field>` (a missing one is left out). pycep drops
    # the `?`, so this reads the source lines.
    text = (INFRA / "functionapp.bicep").read_text(encoding="utf-8")
    plain = set(re.findall(r"value: job\.(\w+) \}", text))
    safe = set(re.findall(r"value: job\.\?(\w+) \}", text))
    # command is optional: a job has a command or steps (the engine refuses neither and both);
    # schedule too: a job without one runs on demand.
    assert plain == set()
    assert plain | safe == {_lower_camel(suffix) for suffix in from_settings.JOB_SETTING_SUFFIXES}
    step_plain = set(re.findall(r"value: s\.(\w+) \}", text))
    step_safe = set(re.findall(r"value: s\.\?(\w+) \}", text))
    assert step_plain == {"command"}
    assert step_plain | step_safe == {_lower_camel(suffix) for suffix in from_settings.STEP_SETTING_SUFFIXES}


def test_step_settings_generated_from_job_steps_parameter_match_engine_suffixes(app_settings: AppSettings):
    assert set(app_settings.step_fields) == set(from_settings.STEP_SETTING_SUFFIXES)
    for suffix, key in app_settings.step_fields.items():
        assert _camel_to_upper_snake(key) == suffix, f"jobSteps[].{key} becomes __{suffix}"


def _lower_camel(suffix: str) -> str:
    head, *rest = suffix.lower().split("_")
    return head + "".join(part.capitalize() for part in rest)


def test_bicep_defaults_match_engine_defaults():
    main = bicep("main.bicep")
    defaults = {spec.name: spec.default for spec in settings.ENGINE_SETTINGS}
    assert main.parameter_default("queueName") == defaults["AGENT_QUEUE_NAME"]
    assert main.parameter_default("tickSchedule") == defaults["AGENT_TICK_SCHEDULE"] == settings.DEFAULT_TICK_SCHEDULE
    assert str(main.parameter_default("maxDequeueCount")) == defaults["AGENT_MAX_DEQUEUE_COUNT"]


def test_max_dequeue_count_is_capped_at_host_json():
    """Design invariant 5: the engine poisons at or below host.json maxDequeueCount, or the host
    moves the message to <queue>-poison before the engine can record why. The Bicep cannot even
    be deployed with a larger AGENT_MAX_DEQUEUE_COUNT: every maxDequeueCount parameter's
    @maxValue is host.json's value (one number; raise host.json's first, then the caps)."""
    host = json.loads((REPO / "host.json").read_text(encoding="utf-8"))
    host_max = host.get("extensions", {}).get("queues", {}).get("maxDequeueCount", 5)
    for name in ("main.bicep", "functionapp.bicep"):
        rules = bicep(name).decorators("maxDequeueCount")
        assert rules.get("max_value") == host_max, (
            f"infra/{name}: @maxValue({rules.get('max_value')}) on maxDequeueCount, but host.json "
            f"extensions.queues.maxDequeueCount is {host_max}: make them equal")
        assert rules.get("min_value") == 1, f"infra/{name}: maxDequeueCount needs @minValue(1)"
    main = bicep("main.bicep")
    assert 1 <= main.parameter_default("maxDequeueCount") <= host_max
    # main.bicep hands its parameter to the app setting the engine reads, unchanged.
    assert _module_params(main, "functionApp")["maxDequeueCount"] == "maxDequeueCount"
    value = AppSettings(bicep("functionapp.bicep")).literal["AGENT_MAX_DEQUEUE_COUNT"]
    assert function_call(value, "string") == {"value_to_convert": "maxDequeueCount"}, value
    parameters = _parameters_file()
    if "maxDequeueCount" in parameters:
        assert parameters["maxDequeueCount"] <= host_max
    # The host's value is host.json's alone: no app setting overrides it behind the file's back.
    assert not any(name.lower().startswith("azurefunctionsjobhost__") for name in AppSettings(bicep("functionapp.bicep")).literal)


# The manual path's parameters (az deployment group create, docs/deploying.md) and azd's
# (infra/main.parameters.json: azd reads <module>.parameters.json and fills ${VARIABLE} from its
# environment). Both are checked against main.bicep; azd's after the substitution azd makes.
MANUAL_PARAMETERS = "manual.parameters.json"
AZD_PARAMETERS = "main.parameters.json"
# What an azd environment holds when the hook-less part of `azd up` reads the parameters: the
# values azd itself sets (AZURE_PRINCIPAL_TYPE is `User`, or `ServicePrincipal` for a service
# principal login).
AZD_ENVIRONMENT = {"AZURE_ENV_NAME": "dev", "AZURE_LOCATION": "swedencentral",
                   "AZURE_PRINCIPAL_ID": "11111111-2222-3333-4444-555555555555", "AZURE_PRINCIPAL_TYPE": "User"}
AZD_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=(?P<default>[^}]*))?\}")


def _parameters_file(name: str = MANUAL_PARAMETERS) -> dict[str, Any]:
    document = json.loads((INFRA / name).read_text(encoding="utf-8"))
    return {parameter: entry["value"] for parameter, entry in document["parameters"].items()}


def _azd_substitute(value: Any, environment: dict[str, str], kind: str) -> Any:
    """A string parameter value as azd makes it: ${NAME} and ${NAME=default} replaced from the
    environment (unset: the default, or empty), then converted to the parameter's type as azd
    does for a whole-string value ('true' -> bool for a bool parameter, digits -> int)."""
    if not isinstance(value, str) or "${" not in value:
        return value
    text = AZD_VARIABLE.sub(lambda m: environment.get(m.group("name"), m.group("default") or ""), value)
    if kind == "bool":
        assert text in ("true", "false"), f"{value!r} gives {text!r}, not a bool"
        return text == "true"
    if kind == "int":
        return int(text)
    return text


def _check_parameter_values(file: str, values: dict[str, Any]) -> None:
    main = bicep("main.bicep")
    undeclared = set(values) - set(main.parameters)
    assert not undeclared, f"{file} sets parameters main.bicep does not declare: {sorted(undeclared)}"
    without_default = {name for name, parameter in main.parameters.items() if parameter.get("default") is None}
    missing = without_default - set(values)
    assert not missing, f"{file} lacks parameters that have no default: {sorted(missing)}"
    for name, value in values.items():
        kind = main.parameters[name]["type"]
        python_type = {"string": str, "int": int, "bool": bool, "array": list, "object": dict}[kind]
        assert isinstance(value, python_type) and not (kind == "int" and isinstance(value, bool)), \
            f"parameter {name}: {value!r} is not a Bicep {kind}"
        rules = main.decorators(name)
        if "allowed" in rules:
            assert value in rules["allowed"], f"parameter {name}: {value!r} not in @allowed {rules['allowed']}"
        if "min_value" in rules:
            assert value >= rules["min_value"], f"parameter {name}: {value!r} below @minValue({rules['min_value']})"
        if "max_value" in rules:
            assert value <= rules["max_value"], f"parameter {name}: {value!r} above @maxValue({rules['max_value']})"
        if "min_length" in rules:
            assert len(value) >= rules["min_length"], f"parameter {name}: {value!r} shorter than @minLength"
        if "max_length" in rules:
            assert len(value) <= rules["max_length"], f"parameter {name}: {value!r} longer than @maxLength"


def test_parameters_file_matches_main_bicep_declarations():
    _check_parameter_values(MANUAL_PARAMETERS, _parameters_file())


@pytest.mark.parametrize("principal_type", ["User", "ServicePrincipal"])
def test_azd_parameters_file_matches_main_bicep_declarations_once_azd_fills_it(principal_type):
    """What azd deploys: the file with its ${...} filled from an azd environment (the deployer's
    principal as the SQL administrator, so the postprovision hook can run init-db as it)."""
    main = bicep("main.bicep")
    environment = {**AZD_ENVIRONMENT, "AZURE_PRINCIPAL_TYPE": principal_type}
    raw = _parameters_file(AZD_PARAMETERS)
    values = {name: _azd_substitute(value, environment, main.parameters[name]["type"]) if name in main.parameters else value
              for name, value in raw.items()}
    _check_parameter_values(AZD_PARAMETERS, values)
    assert raw["environmentName"] == "${AZURE_ENV_NAME}" and raw["location"] == "${AZURE_LOCATION}"
    assert values["sqlAdminObjectId"] == environment["AZURE_PRINCIPAL_ID"]
    assert values["sqlAdminPrincipalType"] == principal_type
    assert values["identityType"] == "UserAssigned"   # the quickstart's choice: the user exists before the publish
    # An unset variable with no default would deploy an empty value: only azd's own variables
    # (always set) may go without a default.
    for name, value in raw.items():
        for match in AZD_VARIABLE.finditer(value if isinstance(value, str) else ""):
            assert match.group("default") is not None or match.group("name") in AZD_ENVIRONMENT, \
                f"{AZD_PARAMETERS}: {name} uses ${{{match.group('name')}}} without a default"
    # main.bicep maps azd's ServicePrincipal to the SQL administrator type Application.
    admin_type = _module_params(main, "sql")["adminPrincipalType"]
    operands = _conditional(admin_type)
    assert operands is not None and operands["true_value"] == "Application", admin_type


def test_the_two_parameters_files_tell_one_example():
    """azd's file and the manual path's set the same jobs, steps, alerts and everything else;
    they differ only in what azd fills from its environment."""
    manual, azd = _parameters_file(MANUAL_PARAMETERS), _parameters_file(AZD_PARAMETERS)
    azd_only = {name for name, value in azd.items() if isinstance(value, str) and "${" in value}
    assert azd_only == {"environmentName", "location", "sqlAdminLogin", "sqlAdminObjectId",
                        "sqlAdminPrincipalType", "identityType", "monitorEntraClientId", "monitorAllowedGroupObjectId",
                        "networkProfile", "sqlTier"}
    # azd env set AGENT_NETWORK_PROFILE private / AGENT_SQL_TIER ...; unset, the template's defaults.
    bicep_main = bicep("main.bicep")
    assert azd["networkProfile"] == f"${{AGENT_NETWORK_PROFILE={bicep_main.parameter_default('networkProfile')}}}"
    assert azd["sqlTier"] == f"${{AGENT_SQL_TIER={bicep_main.parameter_default('sqlTier')}}}"
    # The monitor's sign-in: `azd env set AGENT_MONITOR_CLIENT_ID ...`; unset, closed as by hand.
    assert {azd[name] for name in ("monitorEntraClientId", "monitorAllowedGroupObjectId")} == {
        "${AGENT_MONITOR_CLIENT_ID=}", "${AGENT_MONITOR_GROUP_ID=}"}
    assert manual["monitorEntraClientId"] == manual["monitorAllowedGroupObjectId"] == ""
    assert not any(isinstance(value, str) and "${" in value for value in manual.values())
    shared = set(manual) - azd_only
    assert shared <= set(azd), f"{AZD_PARAMETERS} lacks {sorted(shared - set(azd))}"
    assert {name: manual[name] for name in shared} == {name: azd[name] for name in shared}
    assert set(azd) - azd_only == shared


def _job_settings_as_bicep_builds_them(jobs: list[dict[str, Any]], fields: dict[str, str]) -> dict[str, str]:
    """What functionapp.bicep turns `jobs` into: JOB__<name>__<SUFFIX> for each field present,
    booleans as 'true' / 'false', numbers as decimal text (the Bicep's jobAppSettings)."""
    settings: dict[str, str] = {}
    for job in jobs:
        for suffix, key in fields.items():
            if key not in job or job[key] is None:
                continue
            value = job[key]
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            settings[f"{model.JOB_SETTING_PREFIX}{job['name']}__{suffix}"] = text
    return settings


def test_example_jobs_in_parameters_file_are_valid_engine_jobs(app_settings: AppSettings):
    # The azd file's jobs are the same (test_the_two_parameters_files_tell_one_example).
    jobs = _parameters_file().get("jobs", [])
    assert jobs, "manual.parameters.json should show at least one job"
    known_keys = {"name", *app_settings.job_fields.values()}
    for job in jobs:
        assert set(job) <= known_keys, f"job {job.get('name')!r}: unknown keys {sorted(set(job) - known_keys)}"
        assert "name" in job, f"job {job!r} needs a name"
        assert APP_SETTING_SAFE_JOB_NAME.match(job["name"]), f"job name {job['name']!r}: use letters, digits, underscores"
        assert values.JOB_NAME_PATTERN.match(job["name"])
    settings = _job_settings_as_bicep_builds_them(jobs, app_settings.job_fields)
    steps = _parameters_file().get("jobSteps", [])
    assert steps, "manual.parameters.json should show a multi-step job"
    for step in steps:
        assert set(step) <= {"job", "step", *app_settings.step_fields.values()}, step
        for suffix, key in app_settings.step_fields.items():
            if key in step:
                settings[f"{model.JOB_SETTING_PREFIX}{step['job']}__STEPS__{step['step']}__{suffix}"] = str(step[key])
    valid, invalid = from_settings.parse_jobs(settings)
    assert not invalid, [bad.message for bad in invalid]
    assert sorted(job.name for job in valid) == sorted(job["name"] for job in jobs)
    by_name = {job.name: job for job in valid}
    for job in jobs:
        parsed = by_name[job["name"]]
        assert parsed.schedule == job.get("schedule", "")
        if "command" in job:
            assert parsed.command == job["command"].strip() and not parsed.steps
        else:
            assert [s.step for s in parsed.steps] == sorted(s["step"] for s in steps if s["job"] == job["name"])
        if "enabled" in job:
            assert parsed.enabled is job["enabled"]
    alert_jobs = set(_parameters_file().get("alertJobs", []))
    assert alert_jobs <= set(by_name), f"alertJobs names unknown jobs: {sorted(alert_jobs - set(by_name))}"


def _app_identity(file: BicepFile, principal_id: Any, where: str) -> tuple[str, str]:
    """(function app symbol, user-assigned identity symbol) of a principalId that is
    `useUserAssignedIdentity ? <identity>.properties.principalId : <app>.identity.principalId`."""
    operands = _conditional(file.resolve(principal_id))
    assert operands is not None and operands["condition"] == "useUserAssignedIdentity", \
        f"{where}: principalId must be appPrincipalId (the identity the app runs as), found {principal_id}"
    assigned, own = accessor_path(operands["true_value"]), accessor_path(operands["false_value"])
    assert len(own) == 3 and own[1:] == ["identity", "principalId"], f"{where}: {own}"
    app = file.resources.get(own[0])
    assert app is not None and app["type"] == "Microsoft.Web/sites" and not app["existing"], \
        f"{where}: the system-assigned principal must be the function app this file deploys"
    assert len(assigned) == 3 and assigned[1:] == ["properties", "principalId"], f"{where}: {assigned}"
    identity = file.resources.get(assigned[0])
    assert identity is not None and identity["type"] == "Microsoft.ManagedIdentity/userAssignedIdentities" \
        and not identity["existing"], f"{where}: the user-assigned principal must be the identity this file creates"
    # The identity exists exactly when the app uses it.
    assert identity["config"].get("condition") == "useUserAssignedIdentity"
    return own[0], assigned[0]


def test_role_assignments_use_known_built_in_roles_and_target_the_app_identity():
    grants = set()
    assignments = 0
    for path in bicep_paths():
        file = bicep(path.name)
        for symbol, assignment in file.resources_of_type("Microsoft.Authorization/roleAssignments").items():
            assignments += 1
            where = f"{path.name}: {symbol}"
            declaration = body(assignment)
            properties = declaration["properties"]

            call = function_call(properties["roleDefinitionId"], "subscription_resource_id")
            assert call is not None and call["resource_type"] == "Microsoft.Authorization/roleDefinitions", \
                f"{where}: roleDefinitionId must be subscriptionResourceId('Microsoft.Authorization/roleDefinitions', <id>)"
            role_id = file.resolve(call["resource_name_1"])
            assert isinstance(role_id, str) and GUID.match(role_id), f"{where}: role id {role_id!r} is not a GUID"
            assert role_id in KNOWN_BUILT_IN_ROLES, f"{where}: {role_id} is not a known built-in role"
            role = KNOWN_BUILT_IN_ROLES[role_id]

            # The grantee is the identity the app runs as: `appPrincipalId`, the user-assigned
            # identity's principal when identityType is UserAssigned, else the app's own.
            app_symbol, identity_symbol = _app_identity(file, properties["principalId"], where)
            assert properties.get("principalType") == "ServicePrincipal", f"{where}: set principalType ServicePrincipal"

            scope_symbol = declaration.get("scope")
            assert isinstance(scope_symbol, str) and scope_symbol in file.resources, \
                f"{where}: scope must be the one resource it grants (not the resource group)"
            scope = file.resources[scope_symbol]

            # A deterministic name per (resource, app, role): redeploys update, never duplicate.
            name = function_call(declaration["name"], "guid")
            assert name is not None, f"{where}: name must be guid(<scope>.id, <app>.id, <role id>)"
            arguments = list(name.values())
            assert accessor_path(arguments[0]) == [scope_symbol, "id"], f"{where}: guid() must start with {scope_symbol}.id"
            # ... and the grantee: the identity's id or the app's, as the identity in use (so a
            # switch of identityType makes new assignments rather than re-pointing old ones).
            grantee = _conditional(file.resolve(arguments[1])) if isinstance(arguments[1], str) else None
            assert grantee is not None and grantee["condition"] == "useUserAssignedIdentity" and \
                (accessor_path(grantee["true_value"]), accessor_path(grantee["false_value"])) == \
                ([identity_symbol, "id"], [app_symbol, "id"]), f"{where}: guid()'s second argument must be granteeId"
            assert any(isinstance(argument, str) and file.resolve(argument) == role_id for argument in arguments), \
                f"{where}: guid() must include the role id"

            grants.add((role, scope["type"], body(scope)["name"]))
    assert assignments, "no role assignments found"
    expected = EXPECTED_GRANTS | TELEMETRY_GRANTS
    assert grants == expected, (
        f"unexpected grants {sorted(grants - expected)}; missing grants {sorted(expected - grants)}"
    )


def test_the_app_is_wired_to_the_account_and_queues_the_storage_module_creates():
    # functionapp.bicep grants on an `existing` account named by its storageAccountName parameter
    # and sets AGENT_QUEUE_NAME from queueName; main.bicep must feed both from the storage
    # module's outputs, and the poison queue storage.bicep creates is the one the host uses.
    main = bicep("main.bicep")
    params = _module_params(main, "functionApp")
    assert accessor_path(params["queueName"]) == ["storage", "outputs", "queueName"]
    assert accessor_path(params["storageAccountName"]) == ["storage", "outputs", "storageAccountName"]
    storage = bicep("storage.bicep")
    assert accessor_path(storage.outputs["queueName"]["value"]) == ["tasksQueue", "name"]
    assert accessor_path(storage.outputs["poisonQueueName"]["value"]) == ["poisonQueue", "name"]
    assert body(storage.resources["tasksQueue"])["name"] == "queueName"
    assert body(storage.resources["poisonQueue"])["name"] == "${queueName}-poison"


def _module_params(file: BicepFile, symbol: str) -> dict[str, Any]:
    return body(file.modules[symbol])["params"]


def test_main_passes_each_module_exactly_its_declared_parameters():
    main = bicep("main.bicep")
    assert main.modules, "main.bicep composes no modules"
    for symbol, module in main.modules.items():
        path = module["detail"]["path"]
        target = bicep(path)
        passed = set(_module_params(main, symbol))
        declared = set(target.parameters)
        needed = {name for name, parameter in target.parameters.items() if parameter.get("default") is None}
        assert passed <= declared, f"module {symbol} ({path}): unknown parameters {sorted(passed - declared)}"
        assert needed <= passed, f"module {symbol} ({path}): missing parameters {sorted(needed - passed)}"
    # Every `<module>.outputs.<name>` used in main.bicep exists in that module.
    text = (INFRA / "main.bicep").read_text(encoding="utf-8")
    for symbol, output in re.findall(r"\b(\w+)\.outputs\.(\w+)", text):
        assert symbol in main.modules, f"main.bicep uses outputs of unknown module {symbol}"
        target = bicep(main.modules[symbol]["detail"]["path"])
        assert output in target.outputs, f"main.bicep uses {symbol}.outputs.{output}, which the module does not declare"


def test_main_outputs_what_the_deployment_guide_needs():
    main = bicep("main.bicep")
    assert {"functionAppName", "sqlServerFqdn", "sqlDatabaseName", "storageAccountName",
            "appInsightsConnectionStringSettingName"} <= set(main.outputs)
    assert main.outputs["appInsightsConnectionStringSettingName"]["value"] == telemetry.CONNECTION_STRING_SETTING
    assert accessor_path(main.outputs["databaseUserName"]["value"]) == ["functionApp", "outputs", "databaseUserName"]
    assert "databaseUserName" in json.dumps(main.outputs["grantSqlCommand"]["value"])


# What the azd postprovision hook (scripts/azd/) reads from the azd environment, which azd fills
# from these outputs: output -> the module output it must be.
AZD_OUTPUTS = {
    "AZURE_FUNCTION_APP_NAME": ["functionApp", "outputs", "functionAppName"],
    "SERVICE_AGENT_NAME": ["functionApp", "outputs", "functionAppName"],
    "AZURE_SQL_SERVER_NAME": ["sql", "outputs", "sqlServerName"],
    "AGENT_SQL_SERVER": ["sql", "outputs", "sqlServerFqdn"],
    "AGENT_SQL_DATABASE": ["sql", "outputs", "databaseName"],
    "AGENT_DATABASE_USER": ["functionApp", "outputs", "databaseUserName"],
    "AGENT_IDENTITY_CLIENT_ID": ["functionApp", "outputs", "identityClientId"],
}


def test_main_outputs_what_azd_and_its_postprovision_hook_read():
    main = bicep("main.bicep")
    for name, path in AZD_OUTPUTS.items():
        assert name in main.outputs, f"main.bicep has no output {name}"
        assert accessor_path(main.outputs[name]["value"]) == path, f"output {name}: {main.outputs[name]['value']}"
    engine = {spec.name for spec in settings.ENGINE_SETTINGS}
    assert {"AGENT_SQL_SERVER", "AGENT_SQL_DATABASE"} <= engine   # the CLI run by the hook reads them as is
    hook = (REPO / "scripts" / "azd" / "postprovision.sh").read_text(encoding="utf-8")
    for name in ("AZURE_SQL_SERVER_NAME", "AGENT_DATABASE_USER", "AZURE_RESOURCE_GROUP"):
        assert f"${{{name}" in hook, f"the hook does not read {name}"


def test_the_app_carries_the_azd_service_tag_of_azure_yaml(functionapp: BicepFile):
    import yaml

    services = yaml.safe_load((REPO / "azure.yaml").read_text(encoding="utf-8"))["services"]
    assert list(services) == ["agent"]
    tags = function_call(body(_site(functionapp)[1])["tags"], "union")
    assert tags is not None and tags["arg_1"] == "tags" and tags["arg_2"] == {"'azd-service-name'": "agent"}
    main = bicep("main.bicep")
    assert "environmentName" in main.parameters and main.parameter_default("environmentName") == ""
    for symbol in main.modules:   # every module gets the tags with azd-env-name
        assert _module_params(main, symbol)["tags"] == "allTags", symbol


def test_user_assigned_identity_option(functionapp: BicepFile, app_settings: AppSettings):
    """identityType UserAssigned (azd's default here, as in Microsoft's Flex Consumption Python
    quickstart): an identity created beside the app, named by main.bicep, whose client id the
    app's settings carry for each credential the app makes, and whose name is the database user;
    SystemAssigned (the manual path's default) leaves those settings out."""
    main = bicep("main.bicep")
    assert main.parameter_default("identityType") == "SystemAssigned"
    assert main.decorators("identityType")["allowed"] == functionapp.decorators("identityType")["allowed"] == \
        ["SystemAssigned", "UserAssigned"]
    params = _module_params(main, "functionApp")
    assert (params["identityType"], params["userAssignedIdentityName"]) == ("identityType", "identityName")
    assert "-id-" in json.dumps(main.variable("identityName"))
    _, identity = functionapp.only_resource("Microsoft.ManagedIdentity/userAssignedIdentities")
    assert body(identity)["name"] == "userAssignedIdentityName"
    settings = _conditional(functionapp.variable("userAssignedIdentitySettings"))
    assert settings["condition"] == "useUserAssignedIdentity" and settings["false_value"] == []
    by_name = {entry["name"]: accessor_path(entry["value"]) for entry in settings["true_value"]}
    assert by_name == {"AGENT_SQL_CLIENT_ID": ["appIdentity", "properties", "clientId"],
                       "AzureWebJobsStorage__clientId": ["appIdentity", "properties", "clientId"]}
    assert set(by_name) <= set(app_settings.literal)
    # Telemetry ingestion names the identity too (shared/telemetry/client.py parses ClientId).
    auth = _conditional(app_settings.literal["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"])
    assert auth["false_value"] == "Authorization=AAD"
    assert auth["true_value"] == "Authorization=AAD;ClientId=${appIdentity.properties.clientId}"
    assert telemetry.parse_authentication_string("Authorization=AAD;ClientId=11111111-2222-3333-4444-555555555555")
    user = _conditional(functionapp.variable("databaseUserName"))
    assert (user["true_value"], user["false_value"]) == ("userAssignedIdentityName", "functionAppName")
    assert functionapp.outputs["databaseUserName"]["value"] == "databaseUserName"


def test_storage_is_keyless_private_to_entra_and_has_the_queues():
    storage = bicep("storage.bicep")
    _, account = storage.only_resource("Microsoft.Storage/storageAccounts")
    properties = body(account)["properties"]
    assert properties["allowSharedKeyAccess"] is False
    assert properties["allowBlobPublicAccess"] is False
    assert properties["minimumTlsVersion"] == "TLS1_2"
    assert properties["supportsHttpsTrafficOnly"] is True
    _, container = storage.only_resource("Microsoft.Storage/storageAccounts/blobServices/containers")
    assert body(container)["properties"]["publicAccess"] == "None"
    queues = {body(resource)["name"] for resource in storage.resources_of_type(QUEUES).values()}
    assert queues == {"queueName", "${queueName}-poison"}


def test_sql_is_entra_only_and_tls12():
    sql = bicep("sql.bicep")
    _, server = sql.only_resource("Microsoft.Sql/servers")
    properties = body(server)["properties"]
    assert properties["minimalTlsVersion"] == "1.2"
    administrators = properties["administrators"]
    assert administrators["azureADOnlyAuthentication"] is True
    assert administrators["administratorType"] == "ActiveDirectory"
    assert (administrators["login"], administrators["sid"]) == ("adminLogin", "adminObjectId")
    assert "administratorLoginPassword" not in properties and "administratorLogin" not in properties
    assert "autoPauseDelayMinutes" in sql.parameters
    assert not any(parameter.get("decorators") and any(d["type"] == "secure" for d in parameter["decorators"])
                   for parameter in sql.parameters.values()), "no secrets: the server has no SQL password"


def test_the_sql_admin_is_a_deployer_parameter_never_the_apps_identity():
    """The app's identity is not the server's Entra admin (which is sysadmin-like: every database,
    every login): the admin is a parameter (a user, or better a group), and the app gets a database
    user with grant-sql's rights after deployment (docs/deploying.md, "What the agent's identity
    can do")."""
    main = bicep("main.bicep")
    params = _module_params(main, "sql")
    assert (params["adminLogin"], params["adminObjectId"]) == ("sqlAdminLogin", "sqlAdminObjectId")
    assert main.parameters["sqlAdminPrincipalType"].get("default") == "Group"
    text = (INFRA / "sql.bicep").read_text(encoding="utf-8") + (INFRA / "main.bicep").read_text(encoding="utf-8")
    assert not re.search(r"sid:\s*\S*(principalId|identity)", text, re.I), "the SQL admin's sid must be the parameter"
    # No Azure role on the SQL server for the app (control plane: it could make itself admin).
    for path in bicep_paths():
        for _, assignment in bicep(path.name).resources_of_type("Microsoft.Authorization/roleAssignments").items():
            scope = body(assignment).get("scope")
            assert "sql" not in str(scope).lower(), f"{path.name}: a role assignment on {scope}"


def test_the_private_network_profile_integrates_the_app_and_closes_sql_and_storage():
    """networkProfile private (docs/deploying.md "Private networking"): the app joins a subnet
    delegated to Microsoft.App/environments; the SQL server and the storage account's three
    services the app uses (blob, queue, table: the services it is granted roles on) get private
    endpoints, with privatelink DNS zones; both turn public network access off; the SQL firewall
    rule for Azure services exists with the public profile only."""
    main, network = bicep("main.bicep"), bicep("network.bicep")
    assert main.decorators("networkProfile")["allowed"] == list(NETWORK_PROFILES)
    assert main.parameter_default("networkProfile") == "public"
    assert main.variable("isPrivate") == {"operator": {"type": "equals", "operands": {
        "operand_1": "networkProfile", "operand_2": "private"}}}
    assert main.modules["network"]["config"]["condition"] == "isPrivate"
    params = _module_params(main, "network")
    assert accessor_path(params["sqlServerId"]) == ["sql", "outputs", "sqlServerId"]
    assert accessor_path(params["storageAccountId"]) == ["storage", "outputs", "storageAccountId"]
    for module in ("storage", "sql"):
        assert _module_params(main, module)["networkProfile"] == "networkProfile", module
    subnet = _conditional(_module_params(main, "functionApp")["appSubnetId"])
    assert subnet["condition"] == "isPrivate" and subnet["false_value"] == ""
    assert accessor_path(subnet["true_value"]) == ["network", "outputs", "appSubnetId"]
    site = body(_site(bicep("functionapp.bicep"))[1])["properties"]
    integration = _conditional(site["virtualNetworkSubnetId"])
    assert integration["true_value"] is None and integration["false_value"] == "appSubnetId"

    # The subnets of a network created here; the app's delegated to Flex Consumption's service.
    vnet = body(network.resources["virtualNetwork"])
    subnets = {entry["name"]: entry["properties"] for entry in vnet["properties"]["subnets"]}
    assert set(subnets) == {"appSubnetName", "privateEndpointSubnetName"}
    assert [d["properties"]["serviceName"] for d in subnets["appSubnetName"]["delegations"]] == ["Microsoft.App/environments"]
    assert all(properties["networkSecurityGroup"] for properties in subnets.values())
    assert network.resources["virtualNetwork"]["config"]["condition"] == "createVnet"

    # One endpoint per service, each with its privatelink zone.
    endpoints = {entry["groupId"]: entry for entry in network.variable("endpoints")}
    granted = {role.split()[1].lower() for role, _, _ in EXPECTED_GRANTS}
    assert set(endpoints) == {"sqlServer"} | granted == {"sqlServer", "blob", "queue", "table"}
    assert endpoints["sqlServer"]["serviceId"] == "sqlServerId"
    assert {endpoints[service]["serviceId"] for service in granted} == {"storageAccountId"}
    assert endpoints["sqlServer"]["zone"] == "privatelink${environment().suffixes.sqlServerHostname}"
    for service in granted:
        assert endpoints[service]["zone"] == f"privatelink.{service}.${{environment().suffixes.storage}}"
    loop = network.resources["privateEndpoints"]["config"]
    assert loop["loop_type"]["detail"]["array_name"] == "endpoints"
    (connection,) = loop["config"]["properties"]["privateLinkServiceConnections"]
    assert accessor_path(connection["properties"]["privateLinkServiceId"]) == ["endpoint", "serviceId"]
    assert [accessor_path(g) for g in connection["properties"]["groupIds"]] == [["endpoint", "groupId"]]
    for symbol in ("privateDnsZones", "privateDnsZoneLinks", "privateDnsZoneGroups"):
        assert network.resources[symbol]["config"]["condition"] == "createPrivateDnsZones", symbol

    # Public network access off on both with the private profile; the firewall rule public only.
    sql, storage = bicep("sql.bicep"), bicep("storage.bicep")
    server = body(sql.only_resource("Microsoft.Sql/servers")[1])["properties"]
    account = body(storage.only_resource("Microsoft.Storage/storageAccounts")[1])["properties"]
    for value, private in ((server["publicNetworkAccess"], "Disabled"), (account["publicNetworkAccess"], "Disabled"),
                           (account["networkAcls"]["defaultAction"], "Deny")):
        operands = _conditional(value)
        assert operands["condition"] == "isPrivate" and operands["true_value"] == private, value
    rule = sql.only_resource("Microsoft.Sql/servers/firewallRules")[1]
    assert rule["config"]["condition"] == {"operator": {"type": "not", "operands": {"bool_value": "isPrivate"}}}
    assert main.outputs["AGENT_NETWORK_PROFILE"]["value"] == "networkProfile"


SQL_TIERS = ["S0", "S1", "S2", "S3", "Serverless", "ServerlessFree"]


def test_the_database_tier_is_one_parameter_and_the_free_offer_one_of_its_values():
    """sqlTier: a provisioned S tier (the default, from the list prices: docs/deploying.md), or
    serverless GP_S_Gen5 with or without the free offer. The free offer's properties are set for
    ServerlessFree alone, the serverless properties for the serverless tiers alone, so no
    combination the service refuses can be written."""
    main, sql = bicep("main.bicep"), bicep("sql.bicep")
    assert main.decorators("sqlTier")["allowed"] == sql.decorators("tier")["allowed"] == SQL_TIERS
    assert main.parameter_default("sqlTier") == "S0"
    assert main.decorators("sqlFreeLimitExhaustionBehavior")["allowed"] == sql.decorators("freeLimitExhaustionBehavior")["allowed"] \
        == ["BillOverUsage", "AutoPause"]
    # The scheduler keeps running when the free amount is used up, unless the deployer asks otherwise.
    assert main.parameter_default("sqlFreeLimitExhaustionBehavior") == "BillOverUsage"
    params = _module_params(main, "sql")
    assert (params["tier"], params["freeLimitExhaustionBehavior"]) == ("sqlTier", "sqlFreeLimitExhaustionBehavior")

    symbol, database = sql.only_resource("Microsoft.Sql/servers/databases")
    declaration = body(database)
    assert database["api_version"].endswith("-preview") and database["api_version"] >= "2023-02-01-preview", \
        "useFreeLimit needs a preview API version (2023-02-01-preview or later)"
    assert sql.variable("serverless") == {"operator": {"type": "or", "operands": {
        "operand_1": {"operator": {"type": "equals", "operands": {"operand_1": "tier", "operand_2": "Serverless"}}},
        "operand_2": {"operator": {"type": "equals", "operands": {"operand_1": "tier", "operand_2": "ServerlessFree"}}}}}}
    assert sql.variable("useFreeLimit") == {"operator": {"type": "equals", "operands": {
        "operand_1": "tier", "operand_2": "ServerlessFree"}}}
    sku = _conditional(declaration["sku"])
    assert sku["condition"] == "serverless"
    assert sku["true_value"] == {"name": "GP_S_Gen5", "tier": "GeneralPurpose", "family": "Gen5", "capacity": "maxVCores"}
    assert sku["false_value"] == {"name": "tier", "tier": "Standard"}     # S0..S3 are Standard-tier SKU names
    properties = declaration["properties"]
    for name in ("autoPauseDelay", "minCapacity", "maxSizeBytes"):
        operands = _conditional(properties[name])
        assert operands["condition"] == "serverless" and operands["false_value"] is None, name
    assert properties["useFreeLimit"] == "useFreeLimit"
    behaviour = _conditional(properties["freeLimitExhaustionBehavior"])
    assert (behaviour["condition"], behaviour["true_value"], behaviour["false_value"]) == (
        "useFreeLimit", "freeLimitExhaustionBehavior", None)
    guide = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    section = guide.split("## The database tier", 1)[1].split("\n## ", 1)[0]
    for tier in SQL_TIERS + ["BillOverUsage", "AutoPause", "docs/cost.md"]:
        assert tier in section, f"docs/deploying.md's database tier section does not name {tier}"


def test_function_app_is_flex_consumption_python_with_its_managed_identity(functionapp: BicepFile):
    _, plan = functionapp.only_resource("Microsoft.Web/serverfarms")
    assert body(plan)["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    _, site = _site(functionapp)
    declaration = body(site)
    assert declaration["kind"] == "functionapp,linux"
    # Always a managed identity: the app's own, or the user-assigned one created beside it.
    identity = declaration["identity"]
    assert identity["type"] == "identityType"
    assert functionapp.decorators("identityType")["allowed"] == ["SystemAssigned", "UserAssigned"]
    assigned = _conditional(identity["userAssignedIdentities"])
    assert assigned["condition"] == "useUserAssignedIdentity" and assigned["false_value"] is None
    assert assigned["true_value"] == {"'${appIdentity.id}'": {}}
    assert functionapp.variable("useUserAssignedIdentity") == {"operator": {"type": "equals", "operands": {
        "operand_1": "identityType", "operand_2": "UserAssigned"}}}
    assert declaration["properties"]["httpsOnly"] is True
    app_config = declaration["properties"]["functionAppConfig"]
    assert app_config["runtime"] == {"name": "python", "version": "pythonVersion"}   # tests/repo/test_python_versions.py
    storage = app_config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    authentication = _conditional(storage["authentication"])
    assert authentication["false_value"] == {"type": "SystemAssignedIdentity"}
    assert authentication["true_value"]["type"] == "UserAssignedIdentity"
    assert accessor_path(authentication["true_value"]["userAssignedIdentityResourceId"]) == ["appIdentity", "id"]
    assert set(app_config["scaleAndConcurrency"]) == {"maximumInstanceCount", "instanceMemoryMB"}
    # Flex Consumption rejects these: the runtime comes from functionAppConfig.
    names = set(AppSettings(functionapp).literal)
    assert not names & {"FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE"}


def test_alert_queries_use_event_and_dimension_names_the_engine_emits():
    alerts = bicep("alerts.bicep")
    queries = {name: variable["value"] for name, variable in alerts.variables.items()
               if isinstance(variable["value"], str) and "customEvents" in variable["value"]}
    assert len(queries) == 2, f"expected the dead-man's switch and poison queries, found {sorted(queries)}"
    events = {event for query in queries.values() for event in re.findall(r'name == "(\w+)"', query)}
    assert events == {"RunSucceeded", "RunPoisoned"}
    assert events <= set(telemetry.EVENT_NAMES)
    dimensions = {d for query in queries.values() for d in re.findall(r"customDimensions\.(\w+)", query)}
    assert dimensions and dimensions <= set(telemetry.STANDARD_DIMENSIONS), dimensions - set(telemetry.STANDARD_DIMENSIONS)
    # Every {PLACEHOLDER} of the dead-man's switch template is substituted.
    template = alerts.variable("deadMansSwitchQueryTemplate")
    placeholders = set(re.findall(r"\{[A-Z]+\}", template))
    replaced, expression = set(), alerts.variable("deadMansSwitchQuery")
    while (call := function_call(expression, "replace")) is not None:
        replaced.add(call["old_string"])
        expression = call["original_string"]
    assert expression == "deadMansSwitchQueryTemplate" and placeholders == replaced
    # Each alert splits by the `job` column its query returns.
    for symbol, rule in alerts.resources_of_type("Microsoft.Insights/scheduledQueryRules").items():
        for criterion in body(rule)["properties"]["criteria"]["allOf"]:
            query = alerts.resolve(criterion["query"])
            query_text = alerts.variable("deadMansSwitchQueryTemplate") if function_call(query, "replace") else query
            for dimension in criterion["dimensions"]:
                assert re.search(rf"\b{dimension['name']}\b", query_text), f"{symbol}: query has no {dimension['name']} column"


def test_notification_alerts_follow_each_jobs_notify_on_events_the_engine_emits():
    notifications = bicep("notifications.bicep")
    templates = {name: variable["value"] for name, variable in notifications.variables.items()
                 if isinstance(variable["value"], str) and "customEvents" in variable["value"]}
    assert set(templates) == {"failedRunQueryTemplate", "succeededRunQueryTemplate"}
    events = {event for query in templates.values() for event in re.findall(r'name == "(\w+)"', query)}
    assert events == {"RunFailed", "RunPoisoned", "RunSucceeded"} and events <= set(telemetry.EVENT_NAMES)
    dimensions = {d for query in templates.values() for d in re.findall(r"customDimensions\.(\w+)", query)}
    assert dimensions <= set(telemetry.STANDARD_DIMENSIONS), dimensions - set(telemetry.STANDARD_DIMENSIONS)
    for query in ("failedRunQuery", "succeededRunQuery"):
        call = function_call(notifications.variable(query), "replace")
        assert call is not None and call["old_string"] == "{JOBS}"
    text = (INFRA / "notifications.bicep").read_text(encoding="utf-8")
    # The engine's default notify (on_failure) is the Bicep's default too.
    assert text.count(f"job.?notify ?? '{from_settings.JOB_DEFAULTS['NOTIFY']}'") == 2
    assert set(re.findall(r"'(on_\w+)'", text)) <= set(model.NOTIFY_POLICIES)
    assert set(_parameters_file().get("notifyEmails", [])) is not None


@pytest.mark.parametrize("profile", NETWORK_PROFILES)
def test_checkov_reports_no_failed_checks(profile: str, tmp_path: Path):
    """Each network profile rendered (tests/support/infra_helpers.py render_infra: every
    `isPrivate ? A : B` resolved; for private, the skips whose reason is "(networkProfile public)"
    removed, so those checks run and must pass), then scanned from outside the repository."""
    scanned = render_infra(profile, tmp_path / profile)
    result = run_checkov(directory=scanned)
    assert result.summary.get("parsing_errors") == 0 and not result.parsing_errors, result.parsing_errors
    assert result.summary.get("resource_count", 0) > 0

    sources = sorted(scanned.glob("*.bicep"))
    skips = [skip for path in sources for skip in inline_skips(path)]
    assert all(skip.reason for skip in skips), \
        [f"{s.file}:{s.line} {s.check_id} has no reason" for s in skips if not s.reason]
    for record in result.skipped:
        reason = record["check_result"].get("suppress_comment", "")
        assert reason and reason != "No comment provided", f"{record['check_id']} on {record['resource']} skipped without a reason"
    if profile == "private":
        assert not [skip for skip in skips if PUBLIC_ONLY_SKIP in skip.reason]

    # Checkov 3.3.30 does not apply inline suppressions to its graph checks on Bicep (its Bicep
    # runner builds graph records without reading them; python checks are suppressed). A graph
    # check failure counts as skipped only when the failing resource carries an inline
    # `checkov:skip=<id>:<reason>` for that very check, the same comment Checkov honours for its
    # other checks.
    still_failing, honoured_here = [], []
    for record in result.failed:
        first, last = record["file_line_range"]
        path = scanned / record["file_path"].lstrip("/")
        lines = path.read_text(encoding="utf-8").splitlines()[first - 1:last]
        skipped_inline = any(
            skip.check_id == record["check_id"] and skip.reason
            for number, line in enumerate(lines, start=first)
            for skip in skip_comments(path.name, number, line)
        )
        is_graph_check = ".graph." in (record.get("check_class") or "")
        if is_graph_check and skipped_inline:
            honoured_here.append(record)
        else:
            still_failing.append(f"{record['check_id']} {record['check_name']!r} on {record['resource']} "
                                 f"({record['file_path']}:{first}-{last})")
    assert not still_failing, f"Checkov failed checks, network profile {profile}:\n" + "\n".join(still_failing)

    # No stale skip comments: each one names a check Checkov ran on that resource.
    evaluated = {(record["check_id"], record["file_path"].lstrip("/"), tuple(record["file_line_range"]))
                 for record in result.skipped + honoured_here}
    for skip in skips:
        assert any(check_id == skip.check_id and file == skip.file and first <= skip.line <= last
                   for check_id, file, (first, last) in evaluated), \
            f"{skip.file}:{skip.line}: checkov:skip={skip.check_id} does not match a check Checkov ran there (stale?)"


def test_the_profile_renderer_resolves_every_profile_conditional_and_only_those():
    """What the Checkov runs above rely on: the renderer picks the branch of each profile, leaves
    everything else alone, and refuses a profile conditional it cannot read."""
    text = ("publicNetworkAccess: isPrivate ? 'Disabled' : 'Enabled'\n"
            "  // checkov:skip=CKV_AZURE_59:(networkProfile public) public endpoint\n"
            "  // checkov:skip=CKV_AZURE_43:the name is derived\n"
            "x: serverless ? 1 : 2\n")
    private = render_profile(text, "private")
    assert private == ("publicNetworkAccess: 'Disabled'\n  // checkov:skip=CKV_AZURE_43:the name is derived\n"
                       "x: serverless ? 1 : 2\n")
    public = render_profile(text, "public")
    assert public.startswith("publicNetworkAccess: 'Enabled'\n  // checkov:skip=CKV_AZURE_59:")
    with pytest.raises(BicepShapeError):
        render_profile("value: isPrivate ? concat(a, b) : c\n", "private")
    # Every profile-dependent value in infra/ is one the renderer resolves.
    for path in bicep_paths():
        for profile in NETWORK_PROFILES:
            render_profile(path.read_text(encoding="utf-8"), profile)


def test_plain_checkov_from_the_repository_root_reports_no_failed_checks():
    """Exactly the command in the README and the issue: `checkov -d infra --framework bicep`."""
    result = run_checkov(with_repo_config=True)
    assert result.failed == [], [f"{r['check_id']} {r.get('resource')}" for r in result.failed]
    assert result.passed and not result.parsing_errors


def test_checkov_config_skips_only_checks_skipped_inline_with_a_reason():
    """`.checkov.yaml` exists because Checkov does not apply inline skips to Bicep graph
    checks; every id it skips must also be skipped inline, with a reason, in infra/."""
    root = Path(__file__).resolve().parents[2]
    config = (root / ".checkov.yaml").read_text(encoding="utf-8")
    ids = re.findall(r"^\s*-\s*(CKV_[A-Z0-9_]+)\s*$", config, flags=re.MULTILINE)
    assert ids, "no skip-check entries found"
    bicep = "\n".join(p.read_text(encoding="utf-8") for p in (root / "infra").glob("*.bicep"))
    for check_id in ids:
        reasons = re.findall(rf"//\s*checkov:skip={check_id}:(\S.*)", bicep)
        assert reasons, f"{check_id} is skipped in .checkov.yaml but not inline in infra/*.bicep"


def test_monitor_sign_in_is_entra_id_for_one_parameterised_group(functionapp: BicepFile, app_settings: AppSettings):
    """The monitor (issue 17): App Service Authentication in front of the whole app, Entra ID the
    only provider, admitting the group of one parameter, which the engine reads too; closed (401)
    until the client id and the group are given; browsers redirected to sign in."""
    name, resource = functionapp.only_resource("Microsoft.Web/sites/config")
    declaration = body(resource)
    assert declaration["name"] == "authsettingsV2" and declaration["parent"] == _site(functionapp)[0]
    properties = declaration["properties"]
    assert properties["platform"]["enabled"] is True
    validation = properties["globalValidation"]
    assert validation["requireAuthentication"] is True
    assert validation["redirectToProvider"] == "azureactivedirectory"
    action = validation["unauthenticatedClientAction"]["operator"]["operands"]
    assert (action["true_value"], action["false_value"]) == ("RedirectToLoginPage", "Return401")
    configured = functionapp.variables["monitorConfigured"]
    assert "monitorEntraClientId" in json.dumps(configured) and "monitorAllowedGroupObjectId" in json.dumps(configured)
    assert action["condition"] == "monitorConfigured"
    providers = properties["identityProviders"]
    entra = providers.pop("azureActiveDirectory")
    assert entra["enabled"] == "monitorConfigured"
    assert all(provider == {"enabled": False} for provider in providers.values()), providers
    assert entra["registration"]["clientId"] == "monitorEntraClientId"
    assert entra["validation"]["defaultAuthorizationPolicy"]["allowedPrincipals"] == {
        "groups": ["monitorAllowedGroupObjectId"]}
    assert app_settings.literal["AGENT_MONITOR_ALLOWED_GROUP"] == "monitorAllowedGroupObjectId"
    main = bicep("main.bicep")
    for parameter in ("monitorEntraClientId", "monitorAllowedGroupObjectId", "monitorClientSecretSettingName"):
        assert parameter in functionapp.parameters and main.parameters[parameter].get("default") == ""
    assert "monitorUrl" in main.outputs and "/api/monitor/" in json.dumps(functionapp.outputs["monitorUrl"])


def test_the_monitor_trigger_is_anonymous_to_the_host_behind_app_service_authentication():
    """No function key (people use a browser): the sign-in above is what guards it."""
    from functions import monitor_trigger

    binding = monitor_trigger.agent_monitor.build().get_bindings()[0].get_dict_repr()
    assert binding["type"] == "httpTrigger" and binding["route"] == "monitor/{*path}"
    assert getattr(binding["authLevel"], "value", binding["authLevel"]) == "anonymous"
