"""The `Worker`: builds the parts, starts the threads, runs the dispatcher, shuts down.

Shutdown, in order: hand back the jobs no handler started; give the handlers still
executing (a timed-out one included: its code still runs) SHUTDOWN_GRACE to end while
their outcomes are written; record the ones still executing then as interrupted (their
attempts given back), their rows held until the handlers returned or the process is
gone (`store.hold`): the one hold of `claimed.ClaimedJob`; write what is left; stop the
other threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from .. import extensions
from ..claimed import ClaimedJob
from ..conf import get_settings
from ..exceptions import DatabaseUnavailable
from ..extensions import Extension, JobObserver, WorkerParts
from ..index_upkeep import IndexUpkeep
from ..lifecycle_signals import LifecycleSignals
from ..outcomes import Failure, InterruptedRunning
from ..registry import Registry
from ..registry import registry as default_registry
from ..store.hold import RowHold
from ..worker_config import WorkerConfig
from . import inspection
from .dispatcher import Dispatcher
from .leases import Heartbeat
from .listen_turn import ListenTurn
from .listener import Listener
from .report import CONTROLS, READY, STOP_ASKED, SupervisorReport
from .services import ServiceThread, service_threads
from .signals import SignalRelay, StopSwitch
from .wake import Wake

logger = logging.getLogger(__name__)

# The exit code of a worker that stopped while it could not reach the database
# (sysexits' EX_UNAVAILABLE): its outcomes not written are left to the sweep.
EXIT_UNREACHABLE = 69


class Worker:
    """Runs jobs from one or more queues until stopped (or, in burst mode, until idle).

    Its parts: the core's (the lifecycle signals, the index upkeep) and those of
    `extensions` (default: PGQUEUE["EXTENSIONS"]'s), and the observers added before it
    runs (`add_observer`: the metrics server's counters). The core's middleware runs
    innermost, its observers and services first.
    """

    def __init__(
        self,
        queues: Iterable[str],
        *,
        registry: Registry | None = None,
        install_signal_handlers: bool = True,
        extensions: Iterable[Extension] | None = None,
        supervisor: str | None = None,
        report_fd: int | None = None,
        listen_turns: str | None = None,
        drained: bool = False,
        **options: Any,
    ) -> None:
        self.config = cfg = WorkerConfig.build(queues, **options)
        self.supervisor = supervisor  # the id of the supervisor whose child this is
        self.registry = registry or default_registry
        self.install_signal_handlers = install_signal_handlers
        self.stats: Counter[str] = Counter()
        self._wake = Wake()  # its waits hear the listener's NOTIFYs too
        self._switch = StopSwitch(self._wake)
        self._unreachable = False  # it stopped without reaching the database
        self._service_stop = threading.Event()  # ends the heartbeat and the listener
        self._services_stop = threading.Event()  # ends the periodic services
        self._threads: list[threading.Thread] = []  # signals, heartbeat, listener
        self._heartbeat_thread: threading.Thread | None = None
        self._held: threading.Thread | None = None  # writes the jobs held at shutdown
        core, added = self._core_parts(), extensions_parts(cfg, self, extensions)
        # The core's middleware innermost: job_started is sent inside a feature's span.
        self.parts = WorkerParts(
            observers=core.observers + added.observers,
            middleware=added.middleware + core.middleware,
            services=core.services + added.services,
        )
        # Under a supervisor (`report_fd`, its pipe): recycling and hard time limits
        # are told to it.
        self._report = report = None if report_fd is None else SupervisorReport(report_fd)
        self._dispatcher = dispatcher = Dispatcher(
            cfg, self.registry, self._switch, self.stats, self.parts, report
        )
        if drained:  # its supervisor's worker was drained: the process it replaces was
            dispatcher.controls.drain()
        self._store = dispatcher.store
        self._capacity = dispatcher.capacity
        self._writer = dispatcher.writer
        self._pool = dispatcher.pool
        self._heartbeat = Heartbeat(
            cfg, dispatcher.leases, self._service_stop, self.stats, self._wake
        )
        self._services: list[ServiceThread] = service_threads(
            cfg, self.parts.services, self._services_stop
        )
        self.heartbeat_gaps = self._heartbeat.gaps
        # Under a supervisor (`listen_turns`, its directory): one child at a time listens
        # for the queues its siblings serve too.
        turn = None if listen_turns is None else ListenTurn(listen_turns, cfg.database, cfg.queues)
        self._listener = Listener(
            cfg, dispatcher.claims, self._wake, self._service_stop, turn, dispatcher.taking
        )
        self._wake.lender = self._listener
        if turn is not None:
            dispatcher.on_full = self._listener.full
        self._signals = SignalRelay(self._switch, cfg.shutdown_grace)

    def _core_parts(self) -> WorkerParts:
        """What every worker has: the lifecycle signals, and the index upkeep unless it
        is off (PGQUEUE["INDEX_UPKEEP_INTERVAL"] None) or the worker works in bursts."""
        signals = LifecycleSignals()
        upkeep = get_settings().INDEX_UPKEEP_INTERVAL
        services = (IndexUpkeep(upkeep),) if upkeep is not None and not self.config.burst else ()
        return WorkerParts(observers=(signals,), middleware=(signals,), services=services)

    def add_observer(self, observer: JobObserver) -> None:
        """Tell `observer` too of the jobs' events (before `run`)."""
        self._dispatcher.observers.add(observer)

    def running(self) -> int:
        """How many jobs this worker holds now (their leases; for the registry)."""
        return len(self._dispatcher.leases.held())

    def inspect(self) -> dict[str, Any]:
        """This process's account now: its jobs, queues, handlers, counters, memory,
        code (see `inspection.report`)."""
        controls, stopping = self._dispatcher.controls, self._switch.stopping.is_set()
        return inspection.report(
            self.config, self.registry, controls, self._capacity, self.stats, stopping
        )

    def obey(self, action: str, concurrency: int | None = None) -> str:
        """Do what an operator asked (stop, drain, resume, concurrency); what was done,
        in words (see `controls.Controls.obey`)."""
        controls = self._dispatcher.controls
        answer = controls.obey(action, concurrency, self._stop_on_request)
        if self._report is not None and action != "stop":
            # The process its supervisor starts in its place starts in this state.
            self._report.send(CONTROLS, **controls.state())
        return answer

    def _stop_on_request(self) -> None:
        """An operator's stop: the supervisor hears of it first (it restarts this process
        no more, however it ends), then the graceful stop."""
        if self._report is not None:
            self._report.send(STOP_ASKED)
        self.stop_gracefully()

    @property
    def stopped_on_request(self) -> bool:
        """An operator asked this process to stop (its supervisor must not restart it)."""
        return self._dispatcher.controls.stop_asked

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    @property
    def event_loop(self) -> Any:
        """The event loop of async handlers (an `AsyncPool`: lag, blocked, in flight)."""
        return self._dispatcher.aio

    @property
    def exit_code(self) -> int:
        """The process exit code: 1 once too many handlers were stuck; EXIT_UNREACHABLE
        when the worker stopped without reaching the database; else 0."""
        if self._dispatcher.exit_code:
            return self._dispatcher.exit_code
        return EXIT_UNREACHABLE if self._unreachable else 0

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down; force skips the grace period for running handlers."""
        self._switch.request(force=force)

    def stop_gracefully(self) -> None:
        """Stop claiming and give running handlers the grace period, however often it is
        called and whatever other request came before or after it (a supervisor's)."""
        self._switch.request_graceful()

    def run(self) -> int:
        """Run until stopped; return the process exit code (0 after a graceful stop)."""
        cfg = self.config
        self.registry.autodiscover()
        restore = self._signals.install() if self.install_signal_handlers else None
        if restore:
            self._start_service(self._signals.run, "signals")
        logger.info(
            "worker %s starting: queues=%s concurrency=%d batch=%d lease=%gs heartbeat=%gs",
            cfg.worker_id,
            ",".join(cfg.queues),
            cfg.concurrency,
            cfg.batch_size,
            cfg.lease,
            cfg.heartbeat_interval,
        )
        for services in self._services:
            services.begin()  # e.g. PGQUEUE["QUEUES"] into queue_controls, before a claim
        self._pool.start()
        self._heartbeat_thread = self._start_service(self._heartbeat.run, "heartbeat")
        self._start_service(self._listener.run, "listener")
        for services in self._services:
            services.start()
        if self._report is not None:
            self._report.send(READY)
        try:
            self._dispatcher.run()
        finally:
            try:
                self._shutdown()
            finally:
                if restore:
                    restore()
        aio = self._dispatcher.aio
        if aio.blocked or aio.ignored_cancel:
            self.stats["event_loop_blocked"] = aio.blocked
            self.stats["async_cancel_ignored"] = aio.ignored_cancel
        logger.info("worker %s stopped: %s", cfg.worker_id, dict(self.stats))
        return self.exit_code

    def wait_for_held(self, timeout: float | None = None) -> bool:
        """After `run` returned: wait until the jobs held at shutdown (their handlers
        still ran) were written, their handlers having ended; False if they still
        run after `timeout` seconds. A process that exits needs not wait: its end lets
        go of them (the sweep takes them back)."""
        if self._held is not None:
            self._held.join(timeout)
            return not self._held.is_alive()
        return True

    def _start_service(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"pgqueue-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _busy(self) -> bool:
        """Jobs still run, or outcomes wait to be written or read back."""
        return bool(self._capacity) or self._writer.pending or self._writer.in_doubt

    def _shutdown(self) -> None:
        cfg = self.config
        dispatcher = self._dispatcher
        # It takes no job any more: a sibling listens while its handlers finish.
        self._listener.full()
        unstarted = self._pool.stop() + dispatcher.aio.stop_taking()
        for item in unstarted:
            item.resolved = True
            self._capacity.drop(item)
        if unstarted:
            dispatcher.intake.release(
                [(item.ctx.job_id, item.ctx.lease_version, item.attempt_id) for item in unstarted]
            )

        deadline = time.monotonic() + cfg.shutdown_grace
        # Handlers still run, or outcomes wait and the database answers: give them the
        # grace period. With no handler running and the database gone, stop now.
        while self._capacity or (self._busy() and self._store.connected):
            if self._switch.force.is_set() or time.monotonic() >= deadline:
                break
            self._wake.wait(0.05)
            self._wake.clear()
            dispatcher.collect_outcomes()
            dispatcher.check_timeouts()
            try:
                if not self._store.connected:
                    dispatcher.reconnect(deadline)
                dispatcher.write_outcomes()
            except DatabaseUnavailable as exc:
                logger.warning("shutdown: %s", exc)
                self._store.close()
                self._switch.force.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            except psycopg.Error as exc:  # a refused statement: the session is usable
                logger.warning("shutdown: %s", exc)
                self._switch.force.wait(min(0.5, max(0.0, deadline - time.monotonic())))

        # Async handlers still running are cancelled now: their tasks' finally blocks
        # run, their outcomes say so.
        dispatcher.aio.stop()
        dispatcher.collect_outcomes()
        executing = [item for item in self._capacity if not item.resolved]
        hold = self._hold(executing)
        # The one decision: a handler that handed its outcome over since the look above
        # (the hold takes a while) has it written; only the others are interrupted.
        # The hold keeps its row locked all the same until the hold ends: its own
        # write passes (FOR KEY SHARE), but a claim skips it meanwhile if it is due again.
        executing = _give_up(dispatcher, executing)
        # A handler past its timeout has its verdict: written once it returned (on the
        # hold), or by the sweep once the process is gone (the attempt lost, spent as
        # the timeout would have spent it), never now. The others are interrupted:
        # their attempts closed now, given back, their rows left running. On the hold
        # the jobs are given back once the handlers returned; without one (the database
        # refused its connection, or the dispatcher's was cut) their leases are kept,
        # run out once this process ended (the heartbeat has stopped), and the sweep
        # gives them back. Never is a job whose handler may still run let go by a write.
        timed = [item for item in executing if item.verdict is not None]
        interrupted = [item for item in executing if item.verdict is None]
        for item in interrupted:
            self._writer.add([(item, _interrupted(cfg.worker_id, held=hold is not None))])
        self._capacity.clear()
        if executing:
            logger.warning(
                "shutdown: %d handler(s) still running (%d past their timeout); %s",
                len(executing),
                len(timed),
                "their jobs are held until the handlers returned, then given back or, "
                "past their timeout, failed"
                if hold
                else "their rows could not be held: they stay running until this "
                "process ended and their leases ran out, then the sweep takes them back",
            )
        try:
            if not self._store.connected:
                self._store.connect()
            self._writer.resolve_uncertain()
            dispatcher.write_outcomes()
        except (DatabaseUnavailable, psycopg.Error) as exc:
            if isinstance(exc, DatabaseUnavailable):
                self._unreachable = True
            logger.warning(
                "shutdown: could not write %d outcome(s) (%s); their leases will expire and "
                "the sweep will requeue them",
                self._writer.backlog(),
                exc,
            )
        if hold is not None:
            self._held = threading.Thread(
                target=_finish_when_returned,
                args=(hold, interrupted, timed, _interrupted(cfg.worker_id, held=True)),
                name="pgqueue-hold",
                daemon=True,
            )
            self._held.start()
        self._service_stop.set()
        self._services_stop.set()  # last: the registry's last word follows every write
        self._listener.interrupt()
        self._signals.close()
        for thread in self._threads:
            thread.join(timeout=5)
        # A long service (an index rebuild) is not waited for: a rebuild the exit
        # interrupts leaves a copy that the next look, here or in another worker, drops.
        for services in self._services:
            if not any(service.runs_long for service in services.services):
                services.thread.join(timeout=5)
        self._store.close()
        self._wake.lender = None
        self._wake.close()

    def _hold(self, interrupted: list[ClaimedJob]) -> RowHold | None:
        """Hold the rows of the jobs whose handlers still run (see `store.hold`); None
        when there are none, the database is out of reach (the dispatcher's connection
        is down: a new one would wait for its connect timeout), or the hold could not
        be had.

        The heartbeat stops first: a renewal landing after the interruption would
        stretch the lease the sweep waits for once the process is gone.
        """
        if not interrupted or not self._store.connected:
            return None
        self._service_stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=5)
        hold = RowHold(self.config.database, f"pgqueue hold {self.config.worker_id}")
        rows = [(item.ctx.job_id, item.ctx.lease_version) for item in interrupted]
        return hold if hold.take(rows) else None


def extensions_parts(
    config: WorkerConfig, worker: Worker, chosen: Iterable[Extension] | None
) -> WorkerParts:
    """The parts the extensions add to `worker` (PGQUEUE["EXTENSIONS"]'s by default)."""
    return extensions.worker_parts(config, worker, None if chosen is None else tuple(chosen))


def _finish_when_returned(
    hold: RowHold, interrupted: list[ClaimedJob], timed: list[ClaimedJob], why: Failure
) -> None:
    """Once every held job's handler ended (returned, or its thread is gone), give the
    interrupted jobs back and write the timed-out ones' verdicts. A process that exits
    first ends this thread and the hold."""
    while not all(item.ended for item in (*interrupted, *timed)):
        time.sleep(0.05)
    rows = [(item.ctx.job_id, item.ctx.lease_version, item.attempt_id) for item in interrupted]
    failed = [
        (item.ctx.job_id, item.ctx.lease_version, item.attempt_id, item.verdict)
        for item in timed
        if isinstance(item.verdict, Failure)
    ]
    written = hold.finish(rows, failed, why.message, why.error_class)
    logger.info("shutdown: %d held job(s) written, due again now or failed", written)


def _give_up(dispatcher: Dispatcher, items: list[ClaimedJob]) -> list[ClaimedJob]:
    """The shutdown's decision on `items`, the jobs it found executing: those whose
    handlers still have not handed their outcomes over, which it records from now on
    (an outcome of theirs that comes later is dropped); the others' outcomes, handed
    over since it looked, are collected and written like any other."""
    tasks = [item for item in items if item.kind == "async"]
    threads = [item for item in items if item.kind != "async"]
    running = dispatcher.pool.give_up(threads) + dispatcher.aio.give_up(tasks)
    dispatcher.collect_outcomes()
    return running


def _interrupted(worker_id: str, *, held: bool) -> InterruptedRunning:
    """The end of a job whose handler still ran when the worker stopped (see
    `InterruptedRunning`: `held`, the worker holds its row)."""
    return InterruptedRunning(
        "django_pgqueue.WorkerShutdown",
        f"worker {worker_id} stopped before the handler finished",
        held=held,
    )
