"""Several worker processes under one supervisor: `run_queue_worker --processes N`.

The supervisor holds no job, no lease and no database connection. Each child is a full
`run_queue_worker` process in a fresh interpreter (subprocess, not fork: nothing of the
parent's Django state, threads or sockets is shared), which sets Django up itself.

Control: each child reads a pipe whose only write end the supervisor holds. A line
``stop`` asks for a graceful stop (what a first SIGTERM does), ``now`` for an immediate
one (a second SIGTERM); end of file means the supervisor is gone, even by SIGKILL, and
the child stops gracefully on its own. A stop request that finds the child already
stopping (systemd's default KillMode signals every process of the unit, so a child may
have had the SIGTERM itself) is not counted as a second one.

An operator's stop (``control_queue_workers stop``, the admin's Workers page) reaches a
child through the database; the child tells the supervisor at once (a ``stop_asked``
report), stops gracefully and exits EXIT_STOP_REQUESTED. Such a child is not restarted
however it ends (a handler past its hard time limit during the stop's grace, a
recycle): the supervisor exits 0 once every child stopped so.

Operators' drain, resume and concurrency reach each child through the database too; the
child tells the supervisor its state after each (a ``controls`` report), and a child
started in another's place (recycled, ended for a time limit, or dead) starts in the
state the worker is in: the last any of its children told.

Reports: each child writes events to a second pipe whose read end the supervisor
holds (`worker.report`). A child that ends for a handler's hard time limit leaves its
jobs to be written here once it is gone (the only writes the supervisor makes, each
from a thread of its own on a connection opened for them and closed after, so a
database slow to answer does not hold the supervision of the other children), and a
child recycled for
--max-jobs-per-process or --max-memory-per-process says so: both are started again at
once, neither counts as a death.

Listening: the children serving the same queues LISTEN one at a time, their turn a
lock on a file in a directory the supervisor makes for them and removes at its end
(`worker/listen_turn.py`), so that a NOTIFY wakes one idle child, not all of them.

Restarts: a child that exits without being asked to is started again after a backoff
(RESTART_DELAY doubling up to RESTART_DELAY_MAX while it keeps dying at once: before it
said it was up, or within QUICK_EXIT of that, however slow a loaded machine made its
start). When one child dies that quickly GIVE_UP_AFTER times in a row, the
supervisor stops the others and exits EXIT_GAVE_UP: a child that cannot start (a port
taken, a broken settings module) is not restarted for ever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue as queue_module
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import validators
from .exceptions import ConfigurationError
from .worker.report import CONTROLS, READY, RECYCLE, STOP_ASKED, TIME_LIMIT, read_events
from .worker.signals import queue_stop_signals
from .worker.time_limits import LastWords, write_last_words

logger = logging.getLogger(__name__)

MAX_PROCESSES = 256
# The supervisor's exit when a child kept dying right after its start (EX_SOFTWARE).
EXIT_GAVE_UP = 70
# A child's exit after an operator asked it to stop: not restarted.
EXIT_STOP_REQUESTED = 80
RESTART_DELAY = 0.5  # seconds before the first restart of a child
RESTART_DELAY_MAX = 30.0
QUICK_EXIT = 10.0  # a child that exits this soon after it is up died "at once"
GIVE_UP_AFTER = 5  # quick deaths in a row of one child before the supervisor gives up
TICK = 0.1  # how often the supervisor looks at its children

# What a child runs: the parent's sys.path first (the project may be importable only
# from the directory manage.py sits in), then Django's own command-line entry.
CHILD_BOOT = (
    "import json, sys; spec = json.loads(sys.argv[1]); sys.path[:] = spec['path']; "
    "from django.core.management import execute_from_command_line; "
    "execute_from_command_line(spec['argv'])"
)


def parse_processes(text: str | int) -> int:
    """The number of processes `--processes` asks for: a count, or 'auto' (the CPUs
    this process may run on)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return available_cpus()
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"--processes: expected a number of processes (1..{MAX_PROCESSES}) or 'auto', "
            f"got {text!r}."
        ) from None
    return validators.count(value, "--processes", 1, MAX_PROCESSES, error=ConfigurationError)


def available_cpus() -> int:
    """The CPUs this process may use (its affinity mask, e.g. a container's cpuset)."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counter is not None:
        count = counter()
    elif hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:
        count = os.cpu_count()
    return max(1, min(count or 1, MAX_PROCESSES))


def restart_delay(quick_deaths: int) -> float:
    """Seconds before restarting a child that died `quick_deaths` times in a row at once."""
    return min(RESTART_DELAY_MAX, RESTART_DELAY * 2 ** max(0, quick_deaths - 1))


def describe_exit(code: int) -> str:
    """'exit code 1', 'killed by SIGKILL': a Popen return code in words."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def exit_status(codes: Sequence[int]) -> int:
    """The supervisor's exit for its children's last exit codes: 0 when all were 0, else
    EXIT_UNREACHABLE's 69 if a child could not reach the database, else the first other
    failure (a child killed by a signal counts as 128 + the signal, like a shell)."""
    failed = [128 - code if code < 0 else code for code in codes if code]
    if not failed:
        return 0
    return 69 if 69 in failed else failed[0]


@dataclass
class Child:
    """One slot of the supervisor: the process in it now, and its restart history."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    control: int | None = None  # the write end of its control pipe
    started: float = 0.0
    up: float | None = None  # when it said it was up (None: not yet)
    generation: int = 0
    quick_deaths: int = 0
    restart_at: float | None = None
    last_code: int | None = None
    done: bool = False  # exited for good: asked to stop, or a burst child that finished
    report: int | None = None  # the read end of its report pipe
    unread: bytes = b""  # a report line not ended yet
    # What it said before it exited: recycled, or ended for a time limit (its jobs).
    recycled: bool = False
    last_words: LastWords | None = None
    stop_asked: bool = False  # an operator asked it to stop: not restarted


@dataclass
class Supervisor:
    """Runs `processes` children, each `child_argv(index, generation)`, until stopped."""

    processes: int
    child_argv: Callable[[int, int], list[str]]
    burst: bool = False
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.children = [Child(index) for index in range(self.processes)]
        self._signals: queue_module.SimpleQueue[int] = queue_module.SimpleQueue()
        self.stopping = False
        self.gave_up = False
        # What operators made of this worker (drained, a concurrency), as its children
        # last told: a child started in another's place starts in this state.
        self.draining = False
        self.concurrency: int | None = None
        # The writes of the jobs children ended for a time limit left (see _reaped).
        self.last_words_writes: list[threading.Thread] = []
        self.child_env = _child_environment()
        # Each child registers under it: the Workers page shows them as one worker.
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

    def run(self) -> int:
        """Start the children and supervise them; the exit code (see `exit_status`)."""
        restore = queue_stop_signals(self._signals.put)
        # The children's listen turns (see worker/listen_turn.py): lock files in here.
        self.listen_turns = tempfile.mkdtemp(prefix="pgqueue-turns-")
        try:
            logger.info("supervisor %d starting %d worker processes", os.getpid(), self.processes)
            for child in self.children:
                self._start(child)
            while not all(child.done for child in self.children):
                self._take_signals()
                now = time.monotonic()
                for child in self.children:
                    self._read_report(child)
                    if child.proc is not None and (code := child.proc.poll()) is not None:
                        self._reaped(child, code, now)
                    if (
                        child.proc is None
                        and not child.done
                        and child.restart_at is not None
                        and now >= child.restart_at
                    ):
                        self._start(child)
        finally:
            shutil.rmtree(self.listen_turns, ignore_errors=True)
            if restore:
                restore()
            for write in self.last_words_writes:
                write.join()  # each ends within the connection's connect_timeout
        if self.gave_up:
            return EXIT_GAVE_UP
        return exit_status([child.last_code or 0 for child in self.children])

    def stop(self, *, now: bool = False) -> None:
        """Ask every child to stop (gracefully, or at once); restart none of them."""
        self.stopping = True
        for child in self.children:
            if child.proc is None:
                # Waiting for a restart that will not come: a death already dealt with,
                # so not a failure of this stop.
                if not child.done:
                    child.last_code = None
                child.done = True
                child.restart_at = None
            else:
                self._tell(child, b"now\n" if now else b"stop\n")

    def _start(self, child: Child) -> None:
        child.generation += 1
        argv = self.child_argv(child.index, child.generation)
        read_end, write_end = os.pipe()  # both not inheritable; pass_fds opens read_end
        report_read, report_write = os.pipe()
        os.set_blocking(report_read, False)
        control = ["--control-fd", str(read_end), "--supervisor-id", self.id]
        control += ["--report-fd", str(report_write), "--listen-turns", self.listen_turns]
        control += self._controls_argv()
        spec = {"path": sys.path, "argv": [*argv, *control]}
        try:
            child.proc = subprocess.Popen(
                [sys.executable, "-c", CHILD_BOOT, json.dumps(spec)],
                env=self.child_env,
                stdin=subprocess.DEVNULL,
                pass_fds=(read_end, report_write),
            )
        except OSError as exc:
            os.close(write_end)
            os.close(report_read)
            logger.error("supervisor: cannot start child %d: %s", child.index, exc)
            self._died(child, 1, time.monotonic(), quick=True)
            return
        finally:
            os.close(read_end)
            os.close(report_write)
        child.report, child.unread = report_read, b""
        child.recycled, child.last_words, child.stop_asked = False, None, False
        child.control = write_end
        child.started, child.up = time.monotonic(), None
        child.restart_at = None
        logger.info("supervisor: child %d started (pid %d)", child.index, child.proc.pid)

    def _write_last_words(self, words: LastWords) -> None:
        self.last_words_writes = [t for t in self.last_words_writes if t.is_alive()]
        write = threading.Thread(
            target=write_last_words, args=(words,), name="pgqueue-last-words", daemon=True
        )
        write.start()
        self.last_words_writes.append(write)

    def _controls_argv(self) -> list[str]:
        """The options that start a child in the state operators put this worker in
        (after the command's own: a --concurrency given here wins)."""
        argv = [] if self.concurrency is None else ["--concurrency", str(self.concurrency)]
        return [*argv, "--drained"] if self.draining else argv

    def _reaped(self, child: Child, code: int, now: float) -> None:
        assert child.proc is not None
        pid = child.proc.pid
        child.proc = None
        if child.control is not None:
            os.close(child.control)
            child.control = None
        self._read_report(child)  # what it wrote before it exited
        if child.report is not None:
            os.close(child.report)
            child.report = None
        child.last_code = code
        if child.last_words is not None:
            # Its code is gone with it: its jobs may be written now, from a thread of
            # their own, so a database slow to answer (up to its connect_timeout)
            # does not keep this loop from its other children. Until written, the
            # jobs keep their rows and slots: the one hold.
            self._write_last_words(child.last_words)
        if code == EXIT_STOP_REQUESTED or child.stop_asked:
            child.done = True
            # Its stop ended in order when its handler's time limit ended it (its jobs
            # written above); another exit (a crash, a signal) is still a failure.
            if code == EXIT_STOP_REQUESTED or child.last_words is not None:
                child.last_code = 0
            logger.info(
                "supervisor: child %d (pid %d) stopped as an operator asked%s",
                child.index,
                pid,
                "" if code == EXIT_STOP_REQUESTED else f" ({_ended_for(child, code)})",
            )
            return
        if (child.recycled or child.last_words is not None) and not self.stopping:
            logger.info(
                "supervisor: child %d (pid %d) %s; starting a fresh one",
                child.index,
                pid,
                _ended_for(child, code),
            )
            child.quick_deaths = 0
            child.restart_at = now
            return
        if self.stopping or (self.burst and code == 0):
            child.done = True
            logger.info(
                "supervisor: child %d (pid %d) stopped: %s", child.index, pid, describe_exit(code)
            )
            return
        quick = child.up is None or now - child.up < QUICK_EXIT
        self._died(child, code, now, quick=quick, pid=pid)

    def _died(self, child: Child, code: int, now: float, *, quick: bool, pid: int = 0) -> None:
        child.last_code = code
        child.quick_deaths = child.quick_deaths + 1 if quick else 0
        if child.quick_deaths >= GIVE_UP_AFTER:
            logger.error(
                "supervisor: child %d died at its start (before it was up, or within %gs) "
                "%d times in a row "
                "(last: %s); giving up: stopping the other workers, exit %d",
                child.index,
                QUICK_EXIT,
                child.quick_deaths,
                describe_exit(code),
                EXIT_GAVE_UP,
            )
            child.done = True
            self.gave_up = True
            self.stop()
            return
        delay = restart_delay(child.quick_deaths)
        child.restart_at = now + delay
        logger.warning(
            "supervisor: child %d (pid %d) died: %s; restarting it in %gs",
            child.index,
            pid,
            describe_exit(code),
            delay,
        )

    def _read_report(self, child: Child) -> None:
        """Take in what `child` reported since the last look."""
        if child.report is None:
            return
        data = child.unread
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(child.report, 65536):
                data += chunk
        events, child.unread = read_events(data)
        for event in events:
            if event["event"] == READY:
                child.up = time.monotonic()
            elif event["event"] == CONTROLS:
                self.draining = bool(event["draining"])
                self.concurrency = int(event["concurrency"])
            elif event["event"] == STOP_ASKED:
                child.stop_asked = True
            elif event["event"] == RECYCLE:
                child.recycled = True
            elif event["event"] == TIME_LIMIT:
                child.last_words = LastWords.from_json(event["last_words"])
                if child.proc is not None:  # it ends itself; this makes sure of it
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()

    def _tell(self, child: Child, message: bytes) -> None:
        if child.control is None:
            return
        # An OSError: it has just exited, and the poll that follows reaps it.
        with contextlib.suppress(OSError):
            os.write(child.control, message)

    def _take_signals(self) -> None:
        try:
            signum = self._signals.get(timeout=TICK)
        except queue_module.Empty:
            return
        name = signal.Signals(signum).name
        if self.stopping and not self.gave_up:
            logger.warning("supervisor: second %s: the workers stop now", name)
            self.stop(now=True)
        else:
            logger.warning("supervisor: %s: stopping the workers gracefully", name)
            self.stop()


def _ended_for(child: Child, code: int) -> str:
    """How `child` ended, in words: recycled, ended for a time limit, or its exit."""
    if child.last_words is not None:
        return "ended for a hard time limit"
    return "recycled" if child.recycled else describe_exit(code)


def _child_environment() -> dict[str, str]:
    """The children's environment: this one, with the settings module this process uses."""
    # Local: the supervisor is imported by the command, after Django is set up.
    from django.conf import settings

    if os.name != "posix":
        raise ConfigurationError(
            "--processes needs a POSIX system: the children are controlled through "
            "inherited pipes. Run one run_queue_worker per core instead."
        )
    module = settings.SETTINGS_MODULE
    if not module:
        raise ConfigurationError(
            "--processes needs a settings module (DJANGO_SETTINGS_MODULE or --settings): "
            "each worker process sets Django up from it; settings.configure() cannot be "
            "handed to another process."
        )
    return {**os.environ, "DJANGO_SETTINGS_MODULE": module}
