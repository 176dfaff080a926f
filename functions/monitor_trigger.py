"""HTTP trigger: the Job Activity Monitor at /api/monitor/{*path} (docs/monitor.md): pages for
its readers, and the actions its operators POST (shared/web/actions.py).

Anonymous to the Functions host (no function key: people open it in a browser), because App
Service Authentication in front of the whole app (infra/functionapp.bicep, authsettingsV2) signs
them in with Entra ID and admits only the AGENT_MONITOR_ALLOWED_GROUP (readers) and
AGENT_MONITOR_OPERATOR_GROUP (operators) groups; the engine checks those groups again from the
principal the platform passes, and refuses everyone while the readers' setting is empty. Every
method reaches the engine, which answers anything but GET and HEAD (and an operator's POST to
actions/<name>) with 405.
"""

import azure.functions as func

bp = func.Blueprint()


@bp.route(route="monitor/{*path}", auth_level=func.AuthLevel.ANONYMOUS)
def agent_monitor(req: func.HttpRequest) -> func.HttpResponse:
    from shared.web.azure import handle_azure_request

    response = handle_azure_request(req.method, req.url, dict(req.headers), req.get_body() or b"")
    headers = {name: value for name, value in response.all_headers().items() if name != "Content-Type"}
    return func.HttpResponse(response.body, status_code=response.status, headers=headers,
                             mimetype=response.content_type.split(";")[0], charset="utf-8")
