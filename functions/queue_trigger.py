"""Queue trigger: executes one run per message from AGENT_QUEUE_NAME.

Returning deletes the message; an exception (a transient job error) makes the host
deliver it again. Poison is decided by the engine from the dequeue count, so the host's
own ``<queue>-poison`` move (at host.json maxDequeueCount) is never reached.
"""

import azure.functions as func

bp = func.Blueprint()


@bp.queue_trigger(arg_name="message", queue_name="%AGENT_QUEUE_NAME%", connection="AzureWebJobsStorage")
def agent_execute(message: func.QueueMessage) -> None:
    from shared.agent import run_queue_message

    run_queue_message(body=message.get_body(), dequeue_count=message.dequeue_count or 1, message_id=message.id)
