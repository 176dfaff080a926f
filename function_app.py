"""Azure Functions entry point: registers the blueprints, nothing else.

Kept light on purpose: every scale-out cold-starts this import. The engine (and pyodbc,
azure-identity, azure-storage-queue, the telemetry exporter) loads at a trigger's first call.
"""

import azure.functions as func

from functions.monitor_trigger import bp as monitor_blueprint
from functions.queue_trigger import bp as queue_blueprint
from functions.timer_trigger import bp as timer_blueprint

app = func.FunctionApp()
app.register_functions(timer_blueprint)
app.register_functions(queue_blueprint)
app.register_functions(monitor_blueprint)
