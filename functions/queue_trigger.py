"""Queue trigger: executes one run per message from AGENT_QUEUE_NAME.

Returning deletes the message; an exception (a transient job error) makes the host deliver it
again after host.json visibilityTimeout. The engine decides poison from the dequeue count: it
records the message in its poison table (body, every error, the run) and returns normally, so
the host deletes it. That covers malformed messages and transient failures at
AGENT_MAX_DEQUEUE_COUNT, which is at most host.json maxDequeueCount.

The host's own move to ``<queue>-poison`` is still reached when the engine never ran, or could not
return, on the last delivery the host allows (maxDequeueCount):

1. the body is not valid base64 (host.json messageEncoding): moved on its first receive, before
   this function runs;
2. this function raises on that delivery because the engine cannot reach a verdict: the control
   database is unreachable (so the poison table is too), or the engine cannot start (an invalid
   engine-wide setting);
3. the invocation fails without returning on that delivery: its worker process crashed, or
   host.json functionTimeout ended it;
4. the message arrives with a dequeue count above maxDequeueCount (its earlier deliveries ended
   with no verdict, e.g. the instance died mid-run): moved before this function runs.

The run behind such a message is not lost: its lease lapses and a tick dispatches it again.
docs/queue.md ("Poison: the engine's table or the host's queue") lists the tests for each case.
"""

import azure.functions as func

bp = func.Blueprint()


@bp.queue_trigger(arg_name="message", queue_name="%AGENT_QUEUE_NAME%", connection="AzureWebJobsStorage")
def agent_execute(message: func.QueueMessage) -> None:
    from shared.engine.agent import run_queue_message

    run_queue_message(body=message.get_body(), dequeue_count=message.dequeue_count or 1, message_id=message.id)
