"""procrastinate's side of bench_vs_procrastinate.py (runs in .bench-venv): N no-op tasks
deferred in one batch, then one worker at concurrency C until the queue is empty. Prints the
seconds the worker took (deferring is not timed, as on the agent's side)."""

import asyncio
import sys
import time

import procrastinate

conninfo, tasks, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))


@app.task(name="noop")
async def noop() -> None:
    return None


async def main() -> None:
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await noop.batch_defer_async(*([{}] * tasks))
        started = time.perf_counter()
        await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)
        print(time.perf_counter() - started)


asyncio.run(main())
