"""The worker: claim, run with bounded concurrency, renew leases, finish with fencing.

Threads of one worker process, each with its own database connection:

- the dispatcher (the thread that calls `Worker.run`, `dispatcher.py`): claims
  batches, one queue per statement, sized to the free handler slots; writes outcomes
  in batches; sweeps expired leases; takes back unstarted jobs on shutdown;
- `concurrency` handler threads (`pool.py`) and one event loop for async handlers
  (`aio.py`): run handlers, outside any transaction;
- the heartbeat (`leases.py`): renews every held lease in one statement every
  HEARTBEAT_INTERVAL, so a busy handler cannot starve it;
- the listener (`listener.py`): LISTENs for enqueue notifications; polling covers for
  it when it is down;
- the periodic services (`services.py`): the features' and the core's work done now
  and then (schedules, the worker registry, index upkeep);
- the signal thread (`signals.py`, when the worker installs signal handlers): acts on
  SIGTERM/SIGINT, which the handler itself only queues.

A worker serves one database. `run_queue_worker` given queues on several databases
runs a worker process per database under a supervisor (`supervisor.py`).

The dispatcher's parts, each in its own module: `scheduler` (queue order, weights,
empty marks, resume keys), `intake` (claimed rows to the pools, or back), `capacity`
(the claimed jobs until their handlers ended: the one count that sizes every claim),
`leases` (held leases, heartbeat, sweep, hand-back), `writer` (outcome batches,
fenced writes, the read-back of writes in doubt), `pool` and `aio` (the handlers),
`timeouts`, `time_limits` (soft and hard limits; a hard one ends the process),
`recycling` (a process's share of jobs and memory), `report` (what a supervised
process tells its supervisor), and `observing` (the job-event observers and the run
middleware). They
report facts to the dispatcher and never call it back.

Every write about a claimed job is fenced by its lease version, so whatever this
process believes, it can never overwrite the state of a newer owner.
"""

from ..claimed import ClaimedJob
from ..worker_config import WorkerConfig
from .lifecycle import Worker
from .scheduler import RESUME_TTL, QueueScheduler

__all__ = [
    "RESUME_TTL",
    "ClaimedJob",
    "QueueScheduler",
    "Worker",
    "WorkerConfig",
]
