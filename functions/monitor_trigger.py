"""HTTP trigger: the read-only Job Activity Monitor at /api/monitor/{*path} (docs/monitor.md).

Anonymous to the Functions host (no function key: people open it in a browser), because App
Service Authentication in front of the whole app (infra/functionapp.bicep, authsettingsV2) signs
them in with Entra ID and admits only the AGENT_MONITOR_ALLOWED_GROUP group; the engine checks
that group again from the principal the platform passes, and refuses everyone while the setting
is empty. Every method reaches the engine, which answers anything but GET and HEAD with 405.
"""

import azure.functions as func

bp = func.Blueprint()


@bp.route(route="monitor/{*path}", auth_level=func.AuthLevel.ANONYMOUS)
def agent_monitor(req: func.HttpRequest) -> func.HttpResponse:
    from shared.web.azure import handle_azure_request

    response = handle_azure_request(req.method, req.url, dict(req.headers))
    headers = {name: value for name, value in response.all_headers().items() if name != "Content-Type"}
    return func.HttpResponse(response.body, status_code=response.status, headers=headers,
                             mimetype=response.content_type.split(";")[0], charset="utf-8")
