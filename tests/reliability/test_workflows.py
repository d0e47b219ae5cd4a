"""Scenario 14: chords and chains run by 4 worker processes under SIGKILLs, a SIGSTOP
and a database restart, on a throwaway PostgreSQL this module starts itself.

Every step is a `qa.ledger` job (the ledger records each handler start on its own
connection). A random worker is SIGKILLed every ~2 s; once, the database is restarted
mid-run; once, a worker holding running steps is SIGSTOPped until the sweep has taken
them all, then SIGCONTed: its late writes must be refused by fencing and settle
nothing. Whatever the faults interrupt, each fan-in must count every member once:
0 callbacks made pending twice or run twice to success, 0 never fired, 0 steps started
before all their dependencies completed, 0 jobs lost. A trigger records every committed
move of a step out of waiting, so "made pending twice" is read, not inferred.

What the frozen worker held is read from the database, on the database's clock (see
`Freeze`): the attempts it had open when it stopped, each ended while it was frozen,
by the sweep (what it held) or by a write of its own already on the wire. Its late
writes are the refusals it logs after the SIGCONT.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.reliability.conftest import ledger_counts, outcome, size
from tests.reliability.pgserver import PgServer, pg_server  # noqa: F401 (a fixture)
from tests.reliability.test_database_faults import FaultWorker, job_ids, stop_all, wait_for

WORKERS = 4
SESSIONS = ("worker", "heartbeat", "listener")
LEASE = 2.0
OPTIONS = (
    "--lease", str(LEASE),
    "--heartbeat-interval", "0.6",
    "--sweep-interval", "1",
    "--concurrency", "4",
    "--batch-size", "5",
    "--poll-interval", "0.5",
)  # fmt: skip
Q = "flows"
# The frozen worker's refused writes, as its log tells them (writer._stale).
STALE_RE = re.compile(r"stale write rejected: (.+?) of job (\d+) with lease_version (\d+)")

# Every committed move of a step out of waiting (a rolled-back one leaves no row).
PROMOTIONS_AUDIT = """
CREATE TABLE IF NOT EXISTS qa_promotions (
    job_id bigint NOT NULL, status text NOT NULL, at timestamptz NOT NULL
);
CREATE OR REPLACE FUNCTION qa_promoted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO qa_promotions VALUES (NEW.job_id, NEW.status, clock_timestamp());
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS qa_promoted ON queue_job_state;
CREATE TRIGGER qa_promoted AFTER UPDATE ON queue_job_state
    FOR EACH ROW WHEN (OLD.status = 'waiting' AND NEW.status <> 'waiting')
    EXECUTE FUNCTION qa_promoted();
"""

FLOWS = """
import json
from django_pgqueue import chain, chord, group, step
def s():
    return step("qa.ledger", {"seconds": SECONDS}, queue=QUEUE)
callbacks = []
for _ in range(CHORDS):
    run = chord(group(*(s() for _ in range(MEMBERS))), s()).enqueue()
    callbacks.append(list(run.jobs.values())[-1])
for _ in range(CHAINS):
    chain(*(s() for _ in range(5))).enqueue()
print("callbacks:", json.dumps(callbacks))
"""


def enqueue_workflows(server: PgServer, chords: int, members: int, chains: int, seconds: float):
    """The chords and chains, enqueued through the product's canvas; the callbacks' ids."""
    code = (
        f"QUEUE = {Q!r}\nSECONDS = {seconds!r}\nCHORDS = {chords}\nMEMBERS = {members}\n"
        f"CHAINS = {chains}\n{FLOWS}"
    )
    out = server.manage("shell", "-v", "0", "-c", code, timeout=600)
    (line,) = [line for line in out.splitlines() if line.startswith("callbacks: ")]
    return json.loads(line.removeprefix("callbacks: "))


def completed(server: PgServer) -> int:
    return int(
        server.sql(
            "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'completed'", [Q]
        )[0][0]
    )


class Slots:
    """`count` run_queue_worker processes of `queue` (with `options`), each slot restarted
    under a new id when killed."""

    def __init__(
        self,
        server: PgServer,
        queue: str = Q,
        options: tuple[str, ...] = OPTIONS,
        count: int = WORKERS,
    ) -> None:
        self.server = server
        self.queue, self.options = queue, options
        self.generation = 0
        self.started: list[FaultWorker] = []
        self.slots: list[tuple[str, FaultWorker]] = [self.start(slot) for slot in range(count)]

    def start(self, slot: int) -> tuple[str, FaultWorker]:
        self.generation += 1
        worker_id = f"{self.queue}-{slot}-{self.generation}"
        worker = FaultWorker(self.server, self.queue, "--worker-id", worker_id, *self.options)
        self.started.append(worker)
        return worker_id, worker

    def kill(self, slot: int) -> None:
        """SIGKILL the slot's worker, wait until its sessions are gone, start another."""
        worker_id, victim = self.slots[slot]
        victim.proc.kill()
        victim.proc.wait(30)
        wait_for(
            self.server,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY (ARRAY["
            + ", ".join(f"'pgqueue {role} {worker_id}'" for role in SESSIONS)
            + "])",
            lambda n: n == 0,
            timeout=30,
        )
        self.slots[slot] = self.start(slot)

    def stop(self) -> list[str]:
        """SIGTERM every slot's worker once it is up (the last ones started may still be
        booting) and require a clean exit; their outputs."""
        wait_for(
            self.server,
            "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
            "WHERE application_name = ANY (ARRAY["
            + ", ".join(f"'pgqueue worker {worker_id}'" for worker_id, _ in self.slots)
            + "])",
            lambda n: n == len(self.slots),
        )
        return stop_all([worker for _, worker in self.slots])

    def close(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(10)
            worker.log.close()


def claimed_since(server: PgServer, worker_id: str, since: float) -> bool:
    """Whether `worker_id` runs steps and claimed them all after `since` (Unix time).

    Only which worker to freeze: one reconnected since the restart and claiming again
    knows every attempt it holds (a claim whose answer the restart lost was handed
    back at its reconnect), so each gets a write once it resumes.
    """
    rows = server.sql(
        "SELECT started_at > to_timestamp(%s) FROM queue_attempts "
        "WHERE worker_id = %s AND status = 'running'",
        [since, worker_id],
    )
    return bool(rows) and all(after for (after,) in rows)


Attempt = tuple[int, int]  # (job_id, lease_version)


def client_ports(pid: int) -> list[int]:
    """The local ports of process `pid`'s TCP sockets: its database sessions' client_port
    (the workers reach the server on 127.0.0.1), read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if path.exists():
            for line in path.read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Freeze:
    """One worker SIGSTOPped until the sweep has taken what it held, then SIGCONTed.

    What it held is read from the database, on the clock its attempts' started_at
    (the claim's clock) and finished_at (the ending transaction's now()) are read on:
    `stopped_at` is read once every thread of the worker has stopped, so a
    transaction of it that begins later was sent before the stop;
    `resumed_at` once no statement of it runs and none of its attempts is running,
    just before the SIGCONT. The attempts it had open when it stopped are those claimed
    before `resumed_at` (a claim already on the wire counts) and not ended before
    `stopped_at`; each ended while it was frozen, taken by the sweep (`held`) or
    written by a statement of its own already on the wire (`written`).
    """

    def __init__(self, server: PgServer, slot: int, worker_id: str, worker: FaultWorker) -> None:
        self.server = server
        self.slot = slot
        self.worker_id = worker_id
        self.worker = worker
        self.sessions = [f"pgqueue {role} {worker_id}" for role in SESSIONS]
        worker.proc.send_signal(signal.SIGSTOP)
        # Reported to the parent once every thread of the process has stopped.
        _, status = os.waitpid(worker.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"{worker_id} ended instead of stopping ({status})"
        # Its handlers' sessions have no name of the worker's: known by their ports.
        self.ports = client_ports(worker.proc.pid)
        self.at = time.monotonic()
        self.stopped_at: dt.datetime = server.sql("SELECT now()")[0][0]
        self.resumed_at: dt.datetime | None = None
        self.resumed: float | None = None
        self.log_cut = 0  # its output up to here was written before the SIGSTOP
        self.open_at_stop: dict[Attempt, tuple[str, bool]] = {}
        self.held: set[Attempt] = set()
        self.written: set[Attempt] = set()

    def attempts_open_at_stop(self) -> dict[Attempt, tuple[str, bool]]:
        """Its attempts claimed before `resumed_at` and not ended before `stopped_at`:
        each one's status and whether it ended before `resumed_at`."""
        rows = self.server.sql(
            "SELECT job_id, lease_version, status, finished_at < %(resumed)s IS TRUE "
            "FROM queue_attempts WHERE worker_id = %(worker)s AND started_at < %(resumed)s "
            "AND (finished_at IS NULL OR finished_at >= %(stopped)s)",
            {"worker": self.worker_id, "resumed": self.resumed_at, "stopped": self.stopped_at},
        )
        return {(int(job), int(version)): (status, ended) for job, version, status, ended in rows}

    def inside_a_transaction(self) -> bool:
        """Whether it stopped inside a transaction: a session of it holds one open and
        waits for its next message (a pipeline is one transaction until its Sync).

        Then the rows that transaction wrote or claimed stay locked while it is frozen,
        and the sweep passes over locked rows: none of their leases can be taken from
        it. (PostgreSQL's idle_in_transaction_session_timeout is armed only once a Sync
        came, so it does not end such a session either.)
        """
        return bool(
            self.server.sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE (application_name = ANY (%s) OR client_port = ANY (%s)) "
                "AND xact_start IS NOT NULL AND wait_event = 'ClientRead'",
                [self.sessions, self.ports],
            )[0][0]
        )

    def resume_if_swept(self) -> bool:
        """SIGCONT it once no statement of it runs and no attempt of it is running (the
        sweep took them), and record what it held; False while it is not yet so."""
        busy = self.server.sql(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE (application_name = ANY (%s) OR client_port = ANY (%s)) AND state <> 'idle'",
            [self.sessions, self.ports],
        )[0][0]
        if busy:
            return False
        # Read after the look at its sessions: none of its transactions was open then.
        resumed_at, running = self.server.sql(
            "SELECT now(), count(*) FROM queue_attempts WHERE worker_id = %s "
            "AND status = 'running'",
            [self.worker_id],
        )[0]
        if running:
            return False
        self.resumed_at = resumed_at
        self.open_at_stop = self.attempts_open_at_stop()
        self.held = {key for key, (status, _) in self.open_at_stop.items() if status == "lost"}
        self.written = set(self.open_at_stop) - self.held
        self.log_cut = self.worker.output().rfind("\n") + 1
        self.worker.proc.send_signal(signal.SIGCONT)
        self.resumed = time.monotonic()
        return True

    def refusals(self) -> tuple[set[tuple[str, int, int]], set[tuple[str, int, int]]]:
        """The refused writes it logged (kind, job_id, lease_version): before the
        SIGSTOP, and after the SIGCONT (its late writes)."""
        output = self.worker.output()

        def found(text: str) -> set[tuple[str, int, int]]:
            return {(kind, int(job), int(version)) for kind, job, version in STALE_RE.findall(text)}

        return found(output[: self.log_cut]), found(output[self.log_cut :])

    def history(self) -> dict[Attempt, tuple[str, bool, bool]]:
        """Each of its attempts: its status, whether it was claimed before `resumed_at`,
        and whether it ended before `stopped_at`."""
        rows = self.server.sql(
            "SELECT job_id, lease_version, status, started_at < %(resumed)s, "
            "finished_at < %(stopped)s IS TRUE FROM queue_attempts WHERE worker_id = %(worker)s",
            {"worker": self.worker_id, "resumed": self.resumed_at, "stopped": self.stopped_at},
        )
        return {
            (int(job), int(version)): (status, claimed, ended)
            for job, version, status, claimed, ended in rows
        }


class RestartThenFreeze:
    """The two one-off faults of a scenario under SIGKILLs, one turn of its loop at a
    time: a database restart once `restart_at` jobs completed, then, once jobs complete
    again, a worker holding running attempts claimed since the restart SIGSTOPped until
    the sweep has taken them all (`Freeze`). A freeze is given up for another if the
    worker stopped inside a transaction (its locks keep the sweep off those rows:
    resumed at once) or held nothing the sweep took (its own writes on the wire ended
    every attempt it had)."""

    def __init__(
        self, server: PgServer, workers: Slots, rng: random.Random, restart_at: int
    ) -> None:
        self.server, self.workers, self.rng = server, workers, rng
        self.restart_at = restart_at
        self.restart: dict[str, float] = {}  # done_before, at (Unix time), back
        self.frozen: Freeze | None = None
        self.retried = {"inside a transaction": 0, "holding nothing": 0}  # given up

    @property
    def over(self) -> bool:
        """Whether the restart and a freeze that held something are behind."""
        return self.frozen is not None and self.frozen.resumed is not None

    @property
    def spared(self) -> int | None:
        """The slot of the frozen worker: never killed, its late writes are the point."""
        return self.frozen.slot if self.frozen is not None else None

    def turn(self, done: int, completed: Callable[[], int]) -> None:
        """One step of the faults, `done` jobs completed (`completed` reads it again)."""
        restart, frozen = self.restart, self.frozen
        if not restart and done >= self.restart_at:
            # One database restart mid-run: the workers reconnect, lose nothing.
            restart["done_before"] = done
            restart["at"] = time.time()
            restart["back"] = self.server.restart("fast")
        elif restart and frozen is None and completed() > restart["done_before"]:
            # Back after the restart: freeze a worker that holds running attempts.
            count = len(self.workers.slots)
            for slot in self.rng.sample(range(count), count):
                worker_id, worker = self.workers.slots[slot]
                if claimed_since(self.server, worker_id, restart["back"]):
                    self.frozen = Freeze(self.server, slot, worker_id, worker)
                    break
        elif frozen is not None and frozen.resumed is None:
            # Past its lease: resumed once the sweep has taken every attempt it held.
            if frozen.inside_a_transaction():
                frozen.worker.proc.send_signal(signal.SIGCONT)
                self.retried["inside a transaction"] += 1
                self.frozen = None
            elif frozen.resume_if_swept() and not frozen.held:
                self.retried["holding nothing"] += 1
                self.frozen = None


def test_chords_and_chains_under_sigkills_a_sigstop_and_a_restart(pg_server, report):  # noqa: F811
    """14. Workflows under SIGKILL, a SIGSTOP past the lease and a database restart"""
    server = pg_server
    server.sql(PROMOTIONS_AUDIT)
    chords, members, chains = size(16, 200), size(10, 50), size(16, 200)
    seconds = size(200, 20) / 1000  # long enough in CI for every fault to land mid-run
    callbacks = enqueue_workflows(server, chords, members, chains, seconds)
    jobs = chords * (members + 1) + chains * 5

    rng = random.Random()
    workers = Slots(server)
    faults = RestartThenFreeze(server, workers, rng, restart_at=jobs // 20)
    try:
        started = time.monotonic()
        deadline = started + size(300, 1800)
        kills = 0
        next_kill = started + rng.uniform(0.5, 1.0)  # the first kill early: CI drains fast
        while True:
            done = completed(server)
            if done == jobs and faults.over:
                break
            assert time.monotonic() < deadline, f"not drained in time ({done}/{jobs})"
            assert done < jobs or faults.frozen is not None, (
                "the workflows finished before the SIGSTOP"
            )
            faults.turn(done, lambda: completed(server))
            if time.monotonic() >= next_kill and done < jobs:
                slot = rng.choice([s for s in range(WORKERS) if s != faults.spared])
                workers.kill(slot)
                kills += 1
                next_kill = time.monotonic() + rng.uniform(1.5, 2.5)
            time.sleep(0.05)
        drain_s = time.monotonic() - started
        frozen, restart, retried = faults.frozen, faults.restart, faults.retried
        assert frozen is not None
        assert frozen.resumed is not None
        # The frozen worker's handlers end and write with the tokens the sweep retired:
        # one late write for each step it held.
        guard = time.monotonic() + 60
        while time.monotonic() < guard:
            if frozen.held <= {(job, version) for _, job, version in frozen.refusals()[1]}:
                break
            time.sleep(0.2)
        outputs = workers.stop()
        refused_before, late = frozen.refusals()  # its log is gone once closed
    finally:
        workers.close()

    counts = ledger_counts(job_ids(Q), run=server.sql)
    assert counts["jobs"] == jobs
    assert counts["lost"] == 0, counts
    assert counts["completed_twice"] == 0, counts
    assert counts["completed_without_success"] == 0, counts
    assert kills >= 1, "the workflows finished before the chaos started"
    assert restart["done_before"] < jobs, "the restart was not mid-run"
    # The frozen worker. Every attempt it had open when it stopped ended while it was
    # frozen: taken by the sweep (what it held) or written by a statement of its own
    # already on the wire. At the end the database says of each what it said at the
    # SIGCONT: no late write changed one (it may have claimed some of those steps
    # again once resumed: a new attempt).
    held = frozen.held
    assert held, "the sweep took nothing from the frozen worker"
    assert frozen.attempts_open_at_stop() == frozen.open_at_stop
    assert all(ended for _, ended in frozen.open_at_stop.values()), frozen.open_at_stop
    # Each write of it that was refused, whenever, named an attempt the sweep had
    # taken from it.
    history = frozen.history()
    lost = {key for key, (status, _, _) in history.items() if status == "lost"}
    refused_early = {(job, version) for _, job, version in refused_before}
    refused_after = {(job, version) for _, job, version in late}
    assert refused_early | refused_after <= lost, (refused_early | refused_after) - lost
    kinds = {kind for kind, _, _ in refused_before | late}
    assert kinds <= {"complete", "fail", "write after reconnect"}, kinds
    # Its late writes: the refusals after the SIGCONT about attempts claimed before it
    # (one claimed later and lost later is another loss, its refusal checked above).
    # Each step it held got one. Any other was about an attempt it still had in hand
    # when it stopped (no write of it refused yet) whose lease the sweep had taken
    # before: its heartbeat cut off, as by the restart.
    refused_late = {key for key in refused_after if history[key][1]}
    assert held <= refused_late, (held - refused_late, outputs[frozen.slot][-3000:])
    in_hand = {key for key in lost if history[key][1] and history[key][2]} - refused_early
    assert refused_late - held <= in_hand, (refused_late - held, in_hand)
    # Each finished dependency counted once: no step waits for anything, none failed.
    assert server.sql(
        "SELECT count(*) FROM queue_workflow_steps s JOIN queue_jobs j ON j.id = s.job_id "
        "WHERE j.queue = %s AND (s.waiting_for <> 0 OR s.failed <> 0)",
        [Q],
    ) == [(0,)]
    # Every step with dependencies moved out of waiting exactly once, to pending.
    moves = server.sql(
        "SELECT count(*) FILTER (WHERE moved <> 1), count(*) FILTER (WHERE NOT pending) "
        "FROM (SELECT d.job_id, (SELECT count(*) FROM qa_promotions p "
        "                        WHERE p.job_id = d.job_id) AS moved, "
        "      (SELECT bool_and(p.status = 'pending') FROM qa_promotions p "
        "       WHERE p.job_id = d.job_id) IS NOT FALSE AS pending "
        "      FROM (SELECT DISTINCT job_id FROM queue_job_deps) AS d) AS steps"
    )[0]
    promoted_twice_or_never, promoted_not_pending = moves
    assert promoted_twice_or_never == 0
    assert promoted_not_pending == 0
    # 0 callbacks never fired, 0 fired twice: each ran to success exactly once.
    fired = dict(
        server.sql(
            "SELECT job_id, count(*) FILTER (WHERE status = 'succeeded') FROM queue_attempts "
            "WHERE job_id = ANY (%s) GROUP BY job_id",
            [callbacks],
        )
    )
    never = len(set(callbacks) - set(fired))
    twice = sum(1 for n in fired.values() if n > 1)
    assert never == 0
    assert set(fired.values()) == {1}
    # 0 steps started before all their dependencies completed: every handler start of
    # a step (the ledger, on the handler's connection) and every claim of it came after
    # the transaction that completed each of its dependencies began.
    early = server.sql(
        """
        SELECT count(*) FROM queue_job_deps AS dep
        JOIN queue_attempts AS parent
          ON parent.job_id = dep.depends_on AND parent.status = 'succeeded'
        WHERE EXISTS (
            SELECT FROM queue_attempts AS child
            WHERE child.job_id = dep.job_id AND child.started_at < parent.finished_at
        ) OR EXISTS (
            SELECT FROM qa_ledger AS run
            WHERE run.job_id = dep.job_id AND run.started_at < parent.finished_at
        )
        """
    )[0][0]
    assert early == 0
    edges = server.sql("SELECT count(*) FROM queue_job_deps")[0][0]
    first_after = server.sql(
        "SELECT extract(epoch FROM min(finished_at)) FROM queue_attempts "
        "WHERE status = 'succeeded' AND finished_at > to_timestamp(%s)",
        [restart["back"]],
    )[0][0]
    report(
        size=f"{chords} chords of {members} + {chains} chains of 5 ({jobs:,} jobs, "
        f"{edges:,} edges), {WORKERS} processes x 4 threads",
        **outcome(counts),
        recovery_s=round(float(first_after) - restart["at"], 2),
        callbacks_fired_twice=twice,
        callbacks_never_fired=never,
        promoted_twice_or_never=promoted_twice_or_never,
        started_early=early,
        kills=kills,
        completed_before_restart=restart["done_before"],
        frozen_steps_swept=len(held),
        frozen_steps_written_on_the_wire=len(frozen.written),
        frozen_for_s=round(frozen.resumed - frozen.at, 1),
        late_writes_refused=len(refused_late),
        late_writes_already_lost_when_frozen=len(refused_late - held),
        leases_lost_after_it_resumed=len(refused_after - refused_late),
        freezes_given_up=retried,
        drain_s=round(drain_s, 1),
        notes=f"a random worker SIGKILLed every ~2 s (lease {LEASE:g} s, sweep 1 s); one "
        "database restart (pg_ctl stop -m fast, start) mid-run; one worker SIGSTOPped "
        "until the sweep took every step it held (its attempts open when it stopped, "
        "read on the database's clock, a claim still on the wire included), then "
        "SIGCONTed: each step it held got a late write, refused, settling nothing; each "
        "settle counted once (every step's counters end at 0, each step moved out of "
        "waiting once); recovery: restart to the first completion after it",
    )
