"""manage.py run_queue_worker QUEUE [QUEUE ...]: run a worker in this process, or
several under a supervisor (django_pgqueue.supervisor): `--processes N` of them, and
one (or N) per database when the queues live on several (PGQUEUE["QUEUE_DATABASES"])."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from django_pgqueue import supervisor, validators
from django_pgqueue.checks import TAG as CHECK_TAG
from django_pgqueue.checks import autovacuum_problem
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.management.supervision import needs_supervisor
from django_pgqueue.store.operator import missing_tables
from django_pgqueue.worker import Worker, WorkerConfig
from django_pgqueue.worker.control_pipe import follow_supervisor
from django_pgqueue.worker_config import MAX_JOBS_PER_PROCESS, MAX_MEMORY_MIB, queues_by_database


def parse_weights(text: str) -> dict[str, int]:
    """Parse 'payments=3,email=1' into {'payments': 3, 'email': 1}."""
    weights: dict[str, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, sep, value = (piece.strip() for piece in part.partition("="))
        try:
            weight = int(value) if sep and name else None
        except ValueError:
            weight = None
        if weight is None:
            raise CommandError(
                f"--weights: {part!r} is not QUEUE=WEIGHT (e.g. --weights payments=3,email=1)."
            )
        if name in weights:
            raise CommandError(f"--weights: {name!r} is given twice.")
        weights[name] = validators.count(
            weight,
            f"--weights: the weight of {name!r}",
            1,
            validators.MAX_WEIGHT,
            error=CommandError,
        )
    return weights


# The command's numeric options: checked here so that an error names the option.
SECONDS_OPTIONS = ("lease", "heartbeat_interval", "sweep_interval", "job_timeout", "poll_interval")
COUNT_OPTIONS = {
    "concurrency": validators.MAX_CONCURRENCY,
    "max_jobs_per_process": MAX_JOBS_PER_PROCESS,
    "max_memory_per_process": MAX_MEMORY_MIB,
    "async_concurrency": validators.MAX_ASYNC_CONCURRENCY,
    "batch_size": validators.MAX_BATCH_SIZE,
}


def check_options(options: dict[str, Any]) -> None:
    """Raise CommandError naming the first option whose value is out of range."""
    for key in SECONDS_OPTIONS:
        if options[key] is not None:
            validators.seconds(options[key], _flag(key), error=CommandError)
    if options["shutdown_grace"] is not None:
        validators.seconds(
            options["shutdown_grace"], "--shutdown-grace", allow_zero=True, error=CommandError
        )
    for key, high in COUNT_OPTIONS.items():
        if options[key] is not None:
            validators.count(options[key], _flag(key), 1, high, error=CommandError)
    if options.get("max_memory_per_child") is not None:
        kib = options["max_memory_per_child"]
        raise CommandError(
            f"--max-memory-per-child is Celery's, in KiB; here it is "
            f"--max-memory-per-process, in MiB (--max-memory-per-process "
            f"{max(1, round(kib / 1024))} for {kib} KiB)."
        )
    if options.get("metrics_port") is not None:  # 0: any free port
        validators.count(options["metrics_port"], "--metrics-port", 0, 65535, error=CommandError)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


class Command(BaseCommand):
    help = (
        "Run a job queue worker for the given queues until SIGTERM/SIGINT "
        "(or, with --burst, until the queues are empty)."
    )
    # The queue's own checks (settings, schedules, the database): a worker's start is on
    # the path of every deploy and scale-up, and the project's others (admin, URLs,
    # templates) say nothing about it; `manage.py check` runs them all.
    requires_system_checks = [CHECK_TAG]

    def check(self, *args: Any, **kwargs: Any) -> None:
        # Only the static checks: Django runs tagged checks against every database unless
        # told none, and the worker reports the database's problems itself once connected
        # (a supervisor of --processes holds no connection at all).
        kwargs["databases"] = []
        super().check(*args, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="Queue(s) to work on.")
        parser.add_argument(
            "-c",
            "--concurrency",
            type=int,
            help="Handler threads (default: PGQUEUE CONCURRENCY).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=int,
            help="Async handlers in flight on the event loop (default: PGQUEUE ASYNC_CONCURRENCY).",
        )
        parser.add_argument(
            "--batch-size", type=int, help="Most jobs per claim (default: PGQUEUE BATCH_SIZE)."
        )
        parser.add_argument(
            "--lease", type=float, help="Lease length in seconds (default: PGQUEUE LEASE)."
        )
        parser.add_argument(
            "--heartbeat-interval",
            type=float,
            help="Seconds between lease renewals (default: PGQUEUE HEARTBEAT_INTERVAL, "
            "else a third of the lease).",
        )
        parser.add_argument(
            "--sweep-interval",
            type=float,
            help="Seconds between sweeps of expired leases (default: PGQUEUE SWEEP_INTERVAL).",
        )
        parser.add_argument(
            "--job-timeout",
            type=float,
            help="Seconds a handler may run before its attempt fails "
            "(default: PGQUEUE JOB_TIMEOUT, no limit).",
        )
        parser.add_argument(
            "--weights",
            help="Claim turns per queue, e.g. payments=3,email=1 (default: equal turns).",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            help="Seconds between polls when no NOTIFY arrives (default: PGQUEUE POLL_INTERVAL).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit once no job in the queues is due."
        )
        parser.add_argument(
            "--worker-id",
            help="Identity shown in locked_by and attempts (default: host:pid:random).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            help="Serve Prometheus metrics on http://ADDR:PORT/metrics "
            "(needs the prometheus extra; default: off).",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            help="Address --metrics-port listens on (default: 127.0.0.1, this machine "
            "only; 0.0.0.0 for every interface, e.g. in a container).",
        )
        parser.add_argument(
            "--shutdown-grace",
            type=float,
            help="Seconds running handlers get after SIGTERM (default: PGQUEUE SHUTDOWN_GRACE).",
        )
        parser.add_argument(
            "--processes",
            default="1",
            help="Worker processes to run under a supervisor that restarts them, a number "
            "or 'auto' (the CPUs available; default: 1, this process only).",
        )
        parser.add_argument(
            "--max-jobs-per-process",
            "--max-tasks-per-child",
            type=int,
            metavar="N",
            help="Replace a worker process once it ran N jobs: it takes no new job, lets "
            "its handlers end and exits, and its supervisor starts a fresh one (runs "
            "the worker under a supervisor; Celery's --max-tasks-per-child).",
        )
        parser.add_argument(
            "--max-memory-per-process",
            type=int,
            metavar="MIB",
            help="Replace a worker process once its resident memory passes MIB MiB, "
            "looked at after each job, the same way (Celery's --max-memory-per-child, "
            "which counts KiB).",
        )
        parser.add_argument("--max-memory-per-child", type=int, help=argparse.SUPPRESS)
        # Set by the supervisor on the command lines of its children.
        parser.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)
        parser.add_argument("--control-fd", type=int, help=argparse.SUPPRESS)
        parser.add_argument("--child-index", type=int, help=argparse.SUPPRESS)
        parser.add_argument("--supervisor-id", help=argparse.SUPPRESS)
        parser.add_argument("--listen-turns", help=argparse.SUPPRESS)
        parser.add_argument("--drained", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        _configure_logging(options["verbosity"], options["child_index"])
        # Parsed here, not by argparse: a CommandError raised while argparse parses
        # escapes Django's handling and prints a traceback.
        weights = parse_weights(options["weights"]) if options["weights"] else {}
        check_options(options)
        try:
            processes = supervisor.parse_processes(options["processes"])
            config = _worker_options(options, weights)
            placed = queues_by_database(options["queues"])
            _check_weights(weights, options["queues"])
            supervised = processes > 1 or len(placed) > 1 or needs_supervisor(options)
            if supervised and options["control_fd"] is None:
                # Bad options refused once, here, not by every child.
                for alias, queues in placed.items():
                    WorkerConfig.build(queues, **_own_weights(config, queues), database=alias)
                code = _supervise(processes, options, placed)
            else:
                code = self._run_worker(options, config)
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        if code:
            sys.exit(code)

    def _run_worker(self, options: dict[str, Any], config: dict[str, Any]) -> int:
        """Run one worker in this process; its exit code."""
        worker = Worker(
            options["queues"],
            supervisor=options["supervisor_id"],
            report_fd=options["report_fd"],
            listen_turns=options["listen_turns"],
            drained=options["drained"],
            **config,
        )
        if options["child_index"] is None:  # a supervisor's children were checked by it
            _check_database(worker.config.database)
        if options["metrics_port"] is not None:
            _serve_metrics(worker, options["metrics_port"], options["metrics_addr"])
        if options["control_fd"] is not None:

            def stop(force: bool) -> None:
                # A child the signal reached too counts the two as one stop.
                if force:
                    worker.stop(force=True)
                else:
                    worker.stop_gracefully()

            follow_supervisor(options["control_fd"], stop)
        code = worker.run()
        if not code and worker.stopped_on_request and options["control_fd"] is not None:
            return supervisor.EXIT_STOP_REQUESTED  # its supervisor must not restart it
        return code


def _worker_options(options: dict[str, Any], weights: dict[str, int]) -> dict[str, Any]:
    """The Worker's keyword arguments from the command's options."""
    return {
        "concurrency": options["concurrency"],
        "async_concurrency": options["async_concurrency"],
        "batch_size": options["batch_size"],
        "lease": options["lease"],
        "heartbeat_interval": options["heartbeat_interval"],
        "sweep_interval": options["sweep_interval"],
        "job_timeout": options["job_timeout"],
        "weights": weights,
        "poll_interval": options["poll_interval"],
        "burst": options["burst"],
        "worker_id": options["worker_id"],
        "shutdown_grace": options["shutdown_grace"],
        "max_jobs_per_process": options["max_jobs_per_process"],
        "max_memory_per_process": options["max_memory_per_process"],
    }


# The options a child gets as they were given to the supervisor (its queues, and their
# weights, are its database's).
CHILD_OPTIONS = (
    "concurrency",
    "async_concurrency",
    "batch_size",
    "lease",
    "heartbeat_interval",
    "sweep_interval",
    "job_timeout",
    "poll_interval",
    "shutdown_grace",
    "metrics_addr",
    "max_jobs_per_process",
    "max_memory_per_process",
)


def _check_weights(weights: dict[str, int], queues: list[str]) -> None:
    """Refuse a weight given for a queue the worker does not serve."""
    for name in weights:
        if name not in queues:
            raise CommandError(
                f"--weights: weight given for {name!r}, which is not one of the worker's "
                f"queues ({', '.join(queues)})."
            )


def _own_weights(config: dict[str, Any], queues: tuple[str, ...]) -> dict[str, Any]:
    """`config` with only the weights of `queues` (one database's)."""
    weights = {queue: weight for queue, weight in config["weights"].items() if queue in queues}
    return {**config, "weights": weights}


def _supervise(processes: int, options: dict[str, Any], placed: dict[str, tuple[str, ...]]) -> int:
    """Run this command's workers as children of a supervisor; its exit code.

    `processes` children per database, each serving that database's queues with its own
    `--concurrency` (a worker process serves one database). Bad options and a database
    never migrated are refused here, once, not by every child.
    """
    groups = [queues for queues in placed.values() for _ in range(processes)]
    children = len(groups)
    port = options["metrics_port"]
    if port is not None:
        if port and port + children - 1 > 65535:
            raise CommandError(
                f"--metrics-port: child {children - 1} would listen on port "
                f"{port + children - 1}; with {children} worker processes the port is at "
                f"most {65536 - children}."
            )
        try:
            # Local: the optional extra; refused here once rather than by every child.
            import prometheus_client  # noqa: F401
        except ImportError:
            raise CommandError(
                "--metrics-port needs prometheus-client: "
                "pip install 'django-pgqueue-jobs[prometheus]'."
            ) from None
    common = []
    for key in CHILD_OPTIONS:
        if options[key] is not None:
            common += [_flag(key), str(options[key])]
    if options["burst"]:
        common.append("--burst")
    common += ["--verbosity", str(options["verbosity"]), "--skip-checks"]
    common += [
        flag
        for flag in ("--traceback", "--no-color", "--force-color")
        if options.get(flag[2:].replace("-", "_"))
    ]

    weights = parse_weights(options["weights"]) if options["weights"] else {}

    def child_argv(index: int, generation: int) -> list[str]:
        queues = groups[index]
        argv = ["manage.py", "run_queue_worker", *queues, *common, "--child-index", str(index)]
        own = [f"{queue}={weights[queue]}" for queue in queues if queue in weights]
        if own:
            argv += ["--weights", ",".join(own)]
        if options["worker_id"]:  # unique per process: the child and its restart count
            argv += ["--worker-id", f"{options['worker_id']}-{index}.{generation}"]
        if port is not None:  # child i on port + i (0: each on a free port)
            argv += ["--metrics-port", str(port + index if port else 0)]
        return argv

    supervising = supervisor.Supervisor(children, child_argv, burst=options["burst"])
    for alias in placed:
        _check_database(alias)
    return supervising.run()


def _serve_metrics(worker: Worker, port: int, addr: str) -> None:
    """Start the /metrics server in this process, or refuse clearly."""
    try:
        # Local: prometheus-client is an optional extra, imported only when asked for.
        from django_pgqueue.metrics.server import serve
    except ImportError:
        raise CommandError(
            "--metrics-port needs prometheus-client: pip install 'django-pgqueue-jobs[prometheus]'."
        ) from None
    try:
        server = serve(worker, port, addr)
    except OSError as exc:
        raise CommandError(f"--metrics-port: cannot listen on {addr}:{port}: {exc}") from None
    logging.getLogger("django_pgqueue.worker").info(
        "serving metrics on http://%s:%d/metrics", addr, server.server_port
    )


def _check_database(alias: str) -> None:
    """Refuse to start on a database without the queue's tables (CommandError); log
    pgqueue.W001 (see checks.py) if autovacuum is off, and run regardless. A database
    out of reach is the worker's to report and wait for."""
    tables = [model._meta.db_table for model in apps.get_app_config("django_pgqueue").get_models()]
    try:
        missing = missing_tables(alias, tables)
        problem = None if missing else autovacuum_problem(alias)
    except DatabaseError:
        return
    finally:
        connections[alias].close()
    if missing:
        where = "" if alias == DEFAULT_DB_ALIAS else f" --database {alias}"
        what = (
            "none of the queue's tables"
            if len(missing) == len(tables)
            else f"not all of the queue's tables (no {', '.join(missing)})"
        )
        raise CommandError(
            f"The database {alias!r} has {what}: run manage.py migrate{where} before "
            "starting a worker."
        )
    if problem:
        logging.getLogger("django_pgqueue.worker").warning(
            "%s: dead rows in queue_job_state are not cleaned up, so claims slow down "
            "as they pile up; turn it on or VACUUM the table regularly (pgqueue.W001)",
            problem,
        )


def _configure_logging(verbosity: int, child: int | None = None) -> None:
    """Show the worker's log lines when the project has not configured that logger; a
    supervisor's child says which one it is."""
    logger = logging.getLogger("django_pgqueue")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    who = "" if child is None else f"[child {child}, pid %(process)d] "
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
