"""The worker's handler pool, by ``EXECUTION``: threads (execution.py) or child processes
(processes.py, which runs its children's jobs with execution.py's ``run_handler``)."""

from .execution import ThreadPool


def make_pool(worker, mode, size, *, hung_limit):
    if mode == "process":
        from .processes import ProcessPool  # only a process-mode worker pays for the import

        pool = ProcessPool(worker, size, hung_limit=hung_limit)
        pool.kills_at_timeout = True  # its abandon() kills the child running the job
        return pool
    return ThreadPool(worker, size, hung_limit=hung_limit)
