"""Timer trigger: one scheduler tick on AGENT_TICK_SCHEDULE (six-field NCRONTAB, UTC)."""

import azure.functions as func

bp = func.Blueprint()


# run_on_startup stays off: it would fire on every restart and scale-out. The tick is
# idempotent anyway (the unique run key arbitrates), so a double fire is harmless.
@bp.timer_trigger(arg_name="timer", schedule="%AGENT_TICK_SCHEDULE%", run_on_startup=False, use_monitor=True)
def agent_tick(timer: func.TimerRequest) -> None:
    from shared.engine.agent import run_timer_tick

    run_timer_tick(past_due=timer.past_due)
