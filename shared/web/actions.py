"""The monitor's actions (issue 32 item 5): start, stop, pause, resume, cancel a run, requeue a
poison message, POSTed from the pages by an operator; everything else about them is
shared/engine/operations.py's (the same functions the command line calls, audited there with
source 'monitor' and the signed-in principal).

Who may act: in Azure, the members of AGENT_MONITOR_OPERATOR_GROUP (beside the readers of
AGENT_MONITOR_ALLOWED_GROUP); locally, the user who started `sql-agent monitor --operator`.
Everyone else sees no buttons and gets 403 on every POST (recorded in the audit trail as
refused, with who tried).

What a POST must carry (checked in this order; the first that fails answers):

1. an ``Origin`` header naming the monitor's own origin (scheme, host and port of the request;
   a browser always sends it on a form POST): a page of another site cannot post here;
2. the operator's role (a reader gets 403, audited as refused);
3. the session cookie the monitor set on a page (HttpOnly, SameSite=Strict; ``__Host-`` and
   Secure over HTTPS), and a form token made for that session: HMAC-SHA256 keyed by the
   session's random value over the principal, the action, its target (job, run or poison
   message), the time it was issued and a random nonce. A token is good for one use (per
   process), for TOKEN_LIFETIME_SECONDS, for that principal, that action and that target only.
   Keying the MAC by the session itself needs no secret shared between instances: a page of
   another origin can neither read the cookie nor the token;
4. for what cannot be undone (stop, cancel, requeue): ``confirm=yes``, which only the
   confirmation page this answers with carries (with a fresh token).

The result, or the error in words, is a page of its own with a link back.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from shared.engine.audit import Actor, AuditAction, AuditSource, record_refusal
from shared.engine.operations import (cancel, dispatch_now, pause_job, remove_job, requeue, resume_job, run_now,
                                     stop)
from shared.errors import AgentError, NotFoundError, PageError, UsageError
from shared.web.html import escape

log = logging.getLogger(__name__)
UTC = timezone.utc

SESSION_COOKIE = "agent-monitor-session"
SECURE_SESSION_COOKIE = "__Host-agent-monitor-session"
TOKEN_LIFETIME_SECONDS = 3600
MAX_BODY_BYTES = 64 * 1024
MAX_FIELD_LENGTH = 4000
# Parameters of a start, as form fields "param.<name>".
PARAM_PREFIX = "param."


@dataclass(frozen=True)
class ActionKind:
    name: str
    audit: AuditAction
    target: str            # the form field naming what it acts on: job, run or poison
    confirm: str | None    # the question of its confirmation step (None: none)
    button: str


ACTIONS: dict[str, ActionKind] = {kind.name: kind for kind in (
    ActionKind("start", AuditAction.RUN_NOW, "job", None, "Start"),
    ActionKind("stop", AuditAction.STOP, "job",
               "Stop job {target}? Every run of it in flight is cancelled (a running step is stopped at its "
               "worker's next lease renewal); this cannot be undone. Its future slots stay.", "Stop"),
    ActionKind("pause", AuditAction.PAUSE, "job", None, "Pause"),
    ActionKind("resume", AuditAction.RESUME, "job", None, "Resume"),
    ActionKind("cancel", AuditAction.CANCEL, "run",
               "Cancel run {target}? A running step is stopped at its worker's next lease renewal; this "
               "cannot be undone.", "Cancel run"),
    ActionKind("requeue", AuditAction.REQUEUE, "poison",
               "Requeue poison message {target}? Its run gets one more attempt and will run its command again; "
               "this cannot be undone.", "Requeue"),
    # The job form (shared/web/jobform.py): define or edit (its target: the job edited, or
    # "(new)"), previewed or saved; remove a job defined in the database.
    ActionKind("define", AuditAction.DEFINE, "job", None, "Save"),
    ActionKind("remove", AuditAction.REMOVE, "job",
               "Remove job {target}? Its definition is deleted from the database and its claimed slots are "
               "recorded skipped (its history stays); this cannot be undone.", "Remove"),
)}
# The job form's fields are bounded by the body alone (MAX_BODY_BYTES): a value too long for its
# field comes back on the form, named, with everything else typed (shared/jobs/definition.py).
JOB_FORM_FIELD_LENGTH = MAX_BODY_BYTES


@dataclass(frozen=True)
class Caller:
    """Who asks, as the front end (local server, Azure adapter) established it.

    ``name``: shown on the pages and recorded as the audit's principal; ``operator``: may act;
    ``client``: the audit's "from where"; ``session``: the session cookie's value as received
    (None: none or malformed); ``origin``: the request's Origin header; ``own_origin``: the
    monitor's origin as this request reached it; ``secure``: served over HTTPS (the cookie is then
    ``__Host-`` and Secure); ``owner``: whom a job this caller defines runs as (the job form): the
    principal name the platform vouches for (X-MS-CLIENT-PRINCIPAL-NAME in Azure, never a claim's
    fallback), locally the user who started the server; None: a save is refused."""
    name: str | None
    operator: bool = False
    client: str = "monitor"
    session: str | None = None
    origin: str | None = None
    own_origin: str | None = None
    secure: bool = False
    owner: str | None = None

    @property
    def principal(self) -> str:
        return self.name or "(unnamed principal)"


def new_session() -> str:
    return secrets.token_urlsafe(32)


def session_from_cookies(header: str | None, secure: bool) -> str | None:
    """The session cookie's value from a Cookie header (None: absent or not one this monitor
    could have set)."""
    wanted = SECURE_SESSION_COOKIE if secure else SESSION_COOKIE
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == wanted and 40 <= len(value) <= 64 and all(c.isalnum() or c in "-_" for c in value):
            return value
    return None


def session_cookie(session: str, secure: bool, base_path: str) -> str:
    """The Set-Cookie value: a session cookie (no expiry), unreadable by script, never sent by a
    request another site starts."""
    if secure:
        return f"{SECURE_SESSION_COOKIE}={session}; Path=/; Secure; HttpOnly; SameSite=Strict"
    return f"{SESSION_COOKIE}={session}; Path={base_path or '/'}; HttpOnly; SameSite=Strict"


class Tokens:
    """Form tokens bound to a session and a principal, each good for one use (in this process)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _mac(session: str, principal: str, action: str, target: str, issued: int, nonce: str) -> str:
        message = "\n".join(("sql-agent-monitor-action", principal, action, target, str(issued), nonce))
        digest = hmac.new(session.encode(), message.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, session: str, principal: str, action: str, target: str) -> str:
        issued = int(self.clock())
        nonce = secrets.token_urlsafe(12)
        return f"{issued}.{nonce}.{self._mac(session, principal, action, target, issued, nonce)}"

    def redeem(self, token: str, session: str | None, principal: str, action: str, target: str) -> None:
        """Accept the token once, or raise PageError(403) saying why in words."""
        refused = ("the form's token is not valid for this session ({why}): reload the page and try again")
        if session is None:
            raise PageError(403, refused.format(why="no session cookie came with it; cookies must be enabled"))
        issued_text, _, rest = (token or "").partition(".")
        nonce, _, mac = rest.partition(".")
        if not (issued_text.isdigit() and len(issued_text) <= 12 and nonce and mac):
            raise PageError(403, refused.format(why="the token is missing or malformed"))
        issued = int(issued_text)
        if not hmac.compare_digest(mac, self._mac(session, principal, action, target, issued, nonce)):
            raise PageError(403, refused.format(why="it was made for another session, user, action or target"))
        now = self.clock()
        if issued > now + 60 or now - issued > TOKEN_LIFETIME_SECONDS:
            raise PageError(403, refused.format(why=f"it is older than {TOKEN_LIFETIME_SECONDS // 60} minutes"))
        with self._lock:
            for key, at in list(self._used.items()):
                if now - at > TOKEN_LIFETIME_SECONDS + 60:
                    del self._used[key]
            if nonce in self._used:
                raise PageError(409, "this form was submitted already (a second click, or a replay); "
                                     "nothing more was done: reload the page to act again")
            self._used[nonce] = now


def check_origin(caller: Caller) -> None:
    """A POST must name the monitor's own origin (a browser sends Origin on every form POST)."""
    origin = (caller.origin or "").strip().lower()
    if not origin or origin == "null":
        raise PageError(403, "a POST needs an Origin header naming this monitor (the browser sends one); "
                             "none came: refused")
    own = (caller.own_origin or "").lower()
    if origin != own:
        raise PageError(403, f"cross-origin request refused: Origin {origin!r} is not this monitor's ({own!r})")


def own_origin(url_or_scheme: str, host: str | None) -> str:
    """scheme://host[:port] of the monitor as the browser addresses it (the Host header)."""
    scheme = urlsplit(url_or_scheme).scheme if "://" in url_or_scheme else url_or_scheme
    return f"{scheme or 'http'}://{(host or '').strip().lower()}"


def parse_form(body: bytes, content_type: str | None, field_length: int = MAX_FIELD_LENGTH) -> dict[str, str]:
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise PageError(415, f"Content-Type {kind or 'none'!r}: expected application/x-www-form-urlencoded (a form)")
    if len(body) > MAX_BODY_BYTES:
        raise PageError(413, f"the form is {len(body)} bytes; at most {MAX_BODY_BYTES}")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=200)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PageError(400, f"the form could not be read ({exc})") from None
    form = {}
    for key, values in fields.items():
        if len(values) != 1:
            raise PageError(400, f"form field {key!r} given {len(values)} times; expected once")
        if "\x00" in values[0] or len(values[0]) > field_length:
            raise PageError(400, f"form field {key!r}: expected at most {field_length} characters and no NUL")
        form[key] = values[0]
    return form


@dataclass
class Outcome:
    status: int
    title: str
    message: str
    back: str            # the page to go back to (below the base path)
    confirm: dict[str, str] | None = None    # the confirmation form's fields (then message is the question)
    form: Any = None     # the job form's page (shared/web/jobform.py, FormState): rendered instead of a message


def _target(kind: ActionKind, form: dict[str, str]) -> str:
    value = form.get(kind.target, "")
    if kind.target == "job":
        if not value or not value.strip():
            raise PageError(400, "form field 'job': expected a job's name")
        return value
    if not (value.isascii() and value.isdigit() and 0 < len(value) <= 19 and int(value) <= 2 ** 63 - 1):
        raise PageError(400, f"form field {kind.target!r}={value!r}: expected the id of a "
                             f"{'run' if kind.target == 'run' else 'poison message'} (a whole number)")
    return str(int(value))


def _back(kind: ActionKind, target: str) -> str:
    from urllib.parse import quote

    if kind.target == "job":
        return "/jobs/" + quote(target, safe="")
    if kind.target == "run":
        return f"/runs/{target}"
    return "/poison"


def _back_for(kind: ActionKind, target: str) -> str:
    return "/define" if kind.name in ("define", "remove") else _back(kind, target)


def _until(raw: str, now: datetime) -> datetime | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace(" ", "T", 1) if "T" not in raw else
                                       raw.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise UsageError(f"until {raw!r}: expected a date and time in UTC (e.g. 2026-01-31 02:00) or nothing "
                         "(until resumed)", setting="until", value=raw,
                         expected="a date and time in UTC, e.g. 2026-01-31 02:00") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Actions:
    """Performs a POSTed action for a caller; ``agent``: gives the Agent the operations act
    through (the process's)."""

    def __init__(self, agent: Callable[[], Any] | None, tokens: Tokens | None = None) -> None:
        self.agent = agent
        self.tokens = tokens or Tokens()

    def form_token(self, caller: Caller, session: str, action: str, target: Any) -> str:
        return self.tokens.issue(session, caller.principal, action, str(target))

    def handle(self, name: str, caller: Caller, session: str | None, body: bytes, content_type: str | None) -> Outcome:
        kind = ACTIONS.get(name)
        if kind is None:
            raise PageError(404, f"no action {name!r} (actions: {', '.join(ACTIONS)})")
        check_origin(caller)
        if not caller.operator:
            self._record_reader_refusal(kind, caller)
            raise PageError(403, f"{caller.name or 'this user'} may read the monitor but not act: actions are for "
                                 "the operators (AGENT_MONITOR_OPERATOR_GROUP in Azure; `sql-agent monitor "
                                 "--operator` locally)")
        if self.agent is None:
            raise PageError(403, "this monitor takes no actions")
        form = parse_form(body, content_type, JOB_FORM_FIELD_LENGTH if kind.name == "define" else MAX_FIELD_LENGTH)
        target = _target(kind, form)
        self.tokens.redeem(form.get("token", ""), session, caller.principal, kind.name, target)
        back = _back_for(kind, target)
        if kind.name == "define":
            return self._define(caller, form, target)
        if kind.confirm and form.get("confirm") != "yes":
            fields = {key: value for key, value in form.items() if key not in ("token", "confirm")}
            fields["confirm"] = "yes"
            return Outcome(200, "Confirm", kind.confirm.format(target=repr(target) if kind.target == "job" else target),
                           back, confirm=fields)
        agent = self.agent()
        try:
            message = self._perform(kind, agent, target, form, caller)
        except AgentError as exc:
            # Refused: recorded by the operation, or here when the form was refused before it
            # reached one (a bad until) — one row either way (record_refusal knows).
            arguments = {kind.target: target, **{k: v for k, v in form.items() if k not in ("token", "confirm")}}
            record_refusal(agent.store(), self._actor(caller), kind.audit, clock=agent.clock, arguments=arguments,
                           error=exc)
            return Outcome(404 if isinstance(exc, NotFoundError) else 409, "Refused", str(exc), back)
        finally:
            release = getattr(agent, "release", None)
            if release is not None:
                release()
        return Outcome(200, "Done", message, back)

    def _define(self, caller: Caller, form: dict[str, str], target: str) -> Outcome:
        """The job form, previewed or saved (shared/web/jobform.py): its page again, with the
        errors, the preview, the result or the refusal."""
        from shared.web.jobform import handle_define   # the form's code loads when it is used

        agent = self.agent()
        try:
            status, state = handle_define(agent, form, target, caller.owner or "", self._actor(caller))
        finally:
            release = getattr(agent, "release", None)
            if release is not None:
                release()
        title = "Done" if state.done else "Refused" if (state.refused or state.errors) else "Preview"
        return Outcome(status, title, state.done or state.refused or "", "/define", form=state)

    def _actor(self, caller: Caller) -> Actor:
        return Actor(source=AuditSource.MONITOR, client=caller.client[:256], os_user=caller.principal,
                     principal=caller.principal[:256])

    def _record_reader_refusal(self, kind: ActionKind, caller: Caller) -> None:
        if self.agent is None:
            return
        agent = self.agent()
        try:
            record_refusal(agent.store(), self._actor(caller), kind.audit, clock=agent.clock,
                           arguments={"action": kind.name},
                           error=PermissionError(f"{caller.principal} is a reader, not an operator"))
        except Exception as exc:     # the 403 stands whether or not the row could be written
            log.warning("monitor: a reader's refused %s could not be audited: %s", kind.name, exc)
        finally:
            agent.release()

    def _perform(self, kind: ActionKind, agent: Any, target: str, form: dict[str, str], caller: Caller) -> str:
        actor = self._actor(caller)
        by = f"{caller.principal} (monitor)"
        if kind.name == "start":
            params = {key[len(PARAM_PREFIX):]: value for key, value in form.items()
                      if key.startswith(PARAM_PREFIX) and value != ""}
            result = run_now(agent, target, actor=actor, params=params or None)
            if result.skipped:
                return f"job {target!r}: run {result.run_id} recorded skipped: {result.note}"
            shown = f" with {', '.join(f'{k}={v}' for k, v in result.params.items())}" if result.params else ""
            return f"job {target!r} started: run {result.run_id}{shown}"
        if kind.name == "stop":
            stopped = stop(agent, target, actor=actor)
            ids = ", ".join(str(run_id) for run_id in stopped.cancelled_run_ids)
            return (f"job {target!r} stopped: run(s) {ids} cancelled" if ids
                    else f"job {target!r} had no run in flight: nothing to stop")
        if kind.name == "pause":
            now = agent.clock()
            reason = form.get("reason", "").strip() or None
            pause = pause_job(agent.store(), target, now=now, until=_until(form.get("until", ""), now), paused_by=by,
                              reason=reason, telemetry=agent.telemetry, actor=actor)
            until = (f"until {pause.paused_until.isoformat(' ', 'seconds')[:19]} UTC" if pause.paused_until
                     else "until resumed")
            return (f"job {target!r} paused {until}"
                    + (f"; {pause.runs_skipped} slot(s) it had claimed recorded skipped" if pause.runs_skipped else ""))
        if kind.name == "resume":
            resumed = resume_job(agent.store(), target, now=agent.clock(), resumed_by=by, telemetry=agent.telemetry,
                                 actor=actor)
            if resumed.runs_resumed or resumed.runs_caught_up:
                dispatch_now(agent)
            return (f"job {target!r} resumed; {resumed.runs_resumed} slot(s) claimed ahead run at their time"
                    + ("; the last slot it held is caught up now" if resumed.runs_caught_up else ""))
        if kind.name == "cancel":
            cancelled = cancel(agent, int(target), actor=actor)
            return f"run {cancelled.run_id} cancelled"
        if kind.name == "remove":
            removed = remove_job(agent.store(), target, now=agent.clock(), actor=actor)
            return (f"job {target!r} removed; {removed.skipped_runs} claimed slot(s) recorded skipped; its history "
                    "stays")
        requeued = requeue(agent, int(target), actor=actor)
        return f"poison message {requeued.poison_id}: run {requeued.run_id} requeued for one more attempt"


def result_page(outcome: Outcome, link: Callable[[str], str], hidden_form: Callable[[dict[str, str]], str]) -> str:
    """The body of the result (or confirmation) page."""
    css = {"Done": "result-done", "Refused": "error", "Confirm": "confirm"}.get(outcome.title, "error")
    back = f'<p><a class="back" href="{link(outcome.back)}">Back</a></p>'
    if outcome.confirm is not None:
        return (f"<h1>Confirm</h1>\n<p class=\"{css}\">{escape(outcome.message)}</p>\n"
                f"{hidden_form(outcome.confirm)}\n{back}\n")
    return f"<h1>{escape(outcome.title)}</h1>\n<p class=\"{css}\">{escape(outcome.message)}</p>\n{back}\n"
