"""The monitor's job form (issue 32 item 6): an operator defines, previews, edits and removes the
jobs the database holds, as agent.add_scheduled_job and agent.remove_scheduled_job do
(shared/engine/operations.py, define_job and remove_job: the procedures' bodies, audited with
source monitor, the job owned by the signed-in principal). The jobs of the app settings are listed
read-only, with where they are defined.

Every field is validated as the procedure and the engine validate it (shared/jobs/definition.py);
a bad field shows the form again with what was typed and, beside the field, the error naming it,
the value and what is expected; the procedure's own refusals come back in its words. A preview
(no save) shows the job's next five slots in its time zone and in UTC, computed by the function
`sql-agent next` uses (shared/engine/views.py, upcoming_slots), from the database's clock.

The checks every action passes first (Origin, the operator's role, the session's one-use token)
are shared/web/actions.py's; this module is imported when the form is asked for, never at the
function app's cold start."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote

from shared.engine import views
from shared.engine.audit import Actor, AuditAction, record_refusal
from shared.engine.operations import NEW_JOB, define_job, settings_job_words
from shared.errors import AgentError, ConfigError, NotFoundError, PageError, UsageError
from shared.jobs.definition import FIELDS, FieldError, blank_form, form_of, parse_definition
from shared.jobs.targets import member_servers, parse_targets
from shared.web.html import escape, visible

PREVIEW_COUNT = 5
INTENTS = ("preview", "save")


@dataclass
class FormState:
    """What the form page shows: the form (new, or the edit of ``target``), its values as typed,
    its errors by field, a preview, the result or the refusal, and every job (read-only ones with
    where they are defined)."""
    target: str                                     # NEW_JOB, or the name of the job edited
    values: dict[str, str]
    jobs: list[dict[str, Any]]
    dialect: str
    errors: list[FieldError] = field(default_factory=list)
    preview: dict[str, Any] | None = None
    done: str | None = None
    refused: str | None = None
    settings_job: str | None = None                 # ?job= names a settings job: shown read-only

    @property
    def title(self) -> str:
        if self.settings_job:
            return f"Job {self.settings_job}"
        return "Define a job" if self.target == NEW_JOB else f"Edit job {self.target}"


def page_state(store: Any, job: str | None) -> FormState:
    """GET define (``job`` None) or define?job=NAME: the form of a new job, of a database job to
    edit, or a settings job shown read-only."""
    jobs = views.configured_jobs(store)
    if not job:
        return FormState(NEW_JOB, blank_form(), jobs, store.dialect)
    row = views.job_definition(store, job)
    if row is None or not row["configured"]:
        raise PageError(404, f"no job named {job!r} is defined (jobs: {', '.join(r['job_name'] for r in jobs) or 'none'})")
    if not row["defined_in_database"]:
        return FormState(NEW_JOB, blank_form(), jobs, store.dialect, settings_job=job)
    return FormState(job, form_of(row), jobs, store.dialect)


def handle_define(agent: Any, form: Mapping[str, str], target: str, owner: str, actor: Actor) -> tuple[int, FormState]:
    """A POSTed form (its token redeemed already): preview it, or save it (one audit row 'define',
    done or refused). Returns the status and the page's state."""
    intent = form.get("intent", "")
    if intent not in INTENTS:
        raise PageError(400, f"form field 'intent'={intent!r}: expected preview or save (the form's two buttons)")
    values = {spec.name: form.get(spec.name, spec.default) for spec in FIELDS}
    if target != NEW_JOB:
        values["name"] = form.get("name", target)
    store = agent.store()
    now = agent.clock()
    definition, errors = parse_definition(values)
    errors += _server_errors(agent, values.get("targets") or "")
    errors += _step_server_errors(agent, values.get("steps") or "")
    if errors:
        definition = None
    jobs = views.configured_jobs(store)
    state = FormState(target, values, jobs, store.dialect, errors=errors)
    existing = views.job_definition(store, definition.name) if definition else None
    if intent == "preview":
        if definition is not None:
            state.preview = views.upcoming_slots(definition.preview_row(existing), now, PREVIEW_COUNT)
        return (400 if errors else 200), state
    if errors:
        arguments = {key: value for key, value in values.items()}
        # The job's name: the one edited, else the one typed (audit --job finds the refusal).
        named = target if target != NEW_JOB else (values.get("name") or "").strip()
        record_refusal(store, actor, AuditAction.DEFINE, clock=agent.clock, arguments=arguments,
                       error=UsageError("; ".join(error.message for error in errors)),
                       job_name=named[:64] or None)
        return 400, state
    assert definition is not None
    try:
        defined = define_job(store, definition, owner=owner, now=now, actor=actor,
                             edit=None if target == NEW_JOB else target)
    except AgentError as exc:
        state.refused = str(exc)
        return (404 if isinstance(exc, NotFoundError) else 409), state
    row = views.job_definition(store, defined.job_name)
    saved = FormState(defined.job_name, form_of(row) if row else values, views.configured_jobs(store), store.dialect)
    saved.done = (f"job {defined.job_name!r} {defined.action}; it runs as {defined.owner!r}; the agent plans its "
                  "first slot at its next tick (or doorbell)")
    saved.preview = views.upcoming_slots(definition.preview_row(row), now, PREVIEW_COUNT)
    return 200, saved


def _server_errors(agent: Any, targets: str) -> list[FieldError]:
    """The servers @targets names that the deployer did not allow (AGENT_FLEET_SERVERS): refused
    here as a field, as the agent's planning and its connections refuse them."""
    try:
        servers = member_servers(parse_targets("targets", targets)) if targets.strip() else set()
    except ConfigError:
        return []    # parse_definition said what is wrong with it
    errors = []
    for server in sorted(servers):
        try:
            agent.target.check_fleet_server(server)
        except ConfigError as exc:
            errors.append(FieldError("targets", targets, f"servers the deployer allowed (AGENT_FLEET_SERVERS): "
                                                         f"{server!r} is not one ({exc.expected})"))
    return errors


def _step_server_errors(agent: Any, steps: str) -> list[FieldError]:
    """The servers the steps' targets name that the deployer did not allow: refused as the
    steps field (parse_definition says what else is wrong with it)."""
    import json

    try:
        document = json.loads(steps) if steps.strip() else []
    except (ValueError, RecursionError):
        return []
    errors = []
    for step in document if isinstance(document, list) else []:
        targets = step.get("targets") if isinstance(step, dict) else None
        if isinstance(targets, str) and targets.strip():
            errors += [FieldError("steps", steps, error.expected) for error in _server_errors(agent, targets)]
    return errors


# ---------------------------------------------------------------- rendering


def render(state: FormState, pages: Any) -> str:
    """The form page's body (``pages``: the monitor's Pages, with the operator's forms)."""
    out = [f"<h1>{escape(state.title)}</h1>"]
    if state.done:
        out.append(f'<p class="result-done">{escape(state.done)}</p>')
    if state.refused:
        out.append(f'<p class="error" role="alert">Refused: <bdi>{visible(state.refused)}</bdi></p>')
    if state.errors:
        items = "".join(f"<li><bdi>{visible(error.message)}</bdi></li>" for error in state.errors)
        out.append(f'<div class="error" role="alert"><p>The job was not saved; nothing was lost: fix these fields '
                   f"and save again.</p><ul class=\"field-errors\">{items}</ul></div>")
    if state.settings_job:
        name = state.settings_job
        out.append(f'<p class="readonly">Job <bdi>{visible(name)}</bdi> is {escape(settings_job_words(name))}: '
                   "it is shown read-only here; change or remove it in the app settings.</p>")
    elif state.dialect == "sqlite":
        out.append('<p class="note">This control database is SQLite, which has no procedures: jobs are defined in the '
                   "app settings (JOB__&lt;name&gt;__*) there. A preview still shows a definition's next slots; saving "
                   "is refused.</p>")
    if not state.settings_job:
        out.append(_form(state, pages))
    if state.preview is not None:
        out.append(f'<section class="preview"><p>Preview of <bdi>{visible(state.preview["job_name"])}</bdi>: '
                   f'{escape(state.preview["schedule_words"])}, time zone {escape(state.preview["timezone"])} '
                   f"(its next {PREVIEW_COUNT} slots; UTC and the job's time zone).</p>"
                   f"{pages.next_slots(state.preview)}</section>")
    out.append(_job_list(state, pages))
    return "\n".join(out) + "\n"


def _form(state: FormState, pages: Any) -> str:
    act = pages.act
    errors = {error.field: error for error in state.errors}
    rows = []
    for spec in FIELDS:
        value = state.values.get(spec.name, spec.default)
        attrs = f'name="{escape(spec.name)}" id="field-{escape(spec.name)}"'
        if errors.get(spec.name):
            attrs += f' aria-invalid="true" aria-describedby="error-{escape(spec.name)}"'
        if spec.name in ("sql", "steps"):
            # The newline after the opening tag: HTML drops the first one, which would eat a
            # command's own leading newline on every round trip.
            control = f"<textarea {attrs} rows=\"6\" cols=\"80\" spellcheck=\"false\">\n{escape(value)}</textarea>"
        elif spec.choices:
            options = "".join(f'<option value="{escape(c)}"{" selected" if c == value.strip().lower() else ""}>'
                              f"{escape({'1': 'yes', '0': 'no'}.get(c, c) if spec.name == 'enabled' else c)}</option>"
                              for c in spec.choices)
            if value.strip().lower() not in spec.choices:     # what was typed stays, and is refused by name
                options += f'<option value="{escape(value)}" selected>{escape(value)}</option>'
            control = f"<select {attrs}>{options}</select>"
        else:
            readonly = " readonly" if spec.name == "name" and state.target != NEW_JOB else ""
            control = f'<input type="text" {attrs} value="{escape(value)}" size="60"{readonly}>'
        error = errors.get(spec.name)
        message = (f'<div class="error" id="error-{escape(spec.name)}"><bdi>{visible(error.message)}</bdi></div>'
                   if error else "")
        rows.append(f'<tr><th><label for="field-{escape(spec.name)}">{escape(spec.label)}</label></th>'
                    f"<td>{control}{message}<div class=\"hint\">{escape(spec.expected)}</div></td></tr>")
    token = act.token("define", state.target)
    return (f'<form class="action action-define job-form" method="post" '
            f'action="{escape(pages.base_path + "/actions/define")}">'
            f'<input type="hidden" name="job" value="{escape(state.target)}">'
            f'<input type="hidden" name="token" value="{escape(token)}">'
            f'<table class="job-form">{"".join(rows)}</table>'
            '<p><button type="submit" name="intent" value="preview" class="act-preview">Preview next slots</button> '
            '<button type="submit" name="intent" value="save" class="act-define">Save</button></p></form>')


def _job_list(state: FormState, pages: Any) -> str:
    out = ["<h2>Jobs</h2>"]
    if state.target != NEW_JOB or state.settings_job:
        out.append(f'<p><a class="new-job" href="{pages.link("/define")}">Define a new job</a></p>')
    if not state.jobs:
        out.append("<p>No jobs yet.</p>")
        return "\n".join(out)
    lines = []
    for row in state.jobs:
        name = row["job_name"]
        if row.get("source") == "database":
            where = "defined in the database (agent.add_scheduled_job)"
            manage = (f'<a class="edit-job" href="{pages.link("/define", job=name)}">Edit</a> '
                      + pages.act.form("remove", name))
        else:
            where = settings_job_words(name)
            manage = f'<a class="view-job" href="{pages.link("/define", job=name)}">read-only</a>'
        lines.append(f'<tr><td><a href="{pages.link("/jobs/" + quote(str(name), safe=""))}"><bdi>{visible(name)}</bdi>'
                     f"</a></td><td>{escape(where)}</td><td><code>{escape(row.get('schedule') or 'on demand')}</code> "
                     f"({escape(row.get('timezone'))})</td><td>{manage}</td></tr>")
    out.append('<table class="defined-jobs"><thead><tr><th>Job</th><th>Defined</th><th>Schedule</th><th></th></tr>'
               f"</thead><tbody>{''.join(lines)}</tbody></table>")
    return "\n".join(out)

