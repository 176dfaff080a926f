"""What a job is: the job model, steps, schedules, targets, run statuses. Pure: imports only
``shared.errors``, ``shared.values`` and the standard library and schedule libraries (no database,
no queue, no Azure)."""
