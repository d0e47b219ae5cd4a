"""The peers' own virtual environments and databases for benchmarks/peers.py.

Each peer is installed, pinned, into ~/.cache/django-pgqueue-peers/NAME-VERSION/ (never
into the repository or our .venv), created on demand with the Python that runs the
benchmark, and driven by its script in benchmarks/peers/ through a JSON command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _common import ROOT

CACHE = Path.home() / ".cache" / "django-pgqueue-peers"
DRIVERS = ROOT / "benchmarks" / "peers"


class PeerFailed(Exception):
    """A peer could not be installed, or one of its driver's commands failed."""


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    # Pinned requirements: the peer and the fastest database driver it documents.
    requirements: tuple[str, ...]
    # The tuned setting: (driver option, value), the best of a sweep (benchmarks/README.md).
    tuned: tuple[str, int]

    @property
    def home(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"

    @property
    def python(self) -> Path:
        return self.home / "bin" / "python"


PEERS = (
    Peer(
        "pgqueuer",
        "1.6.0",
        ("pgqueuer==1.6.0", "asyncpg==0.32.0", "uvloop==0.23.0"),
        ("batch", 1000),
    ),
    Peer(
        "procrastinate",
        "3.10.0",
        ("procrastinate==3.10.0", "psycopg[binary]==3.3.9", "psycopg-pool==3.3.3"),
        ("concurrency", 100),
    ),
)


# The durable-execution engines of benchmarks/durable.py, each with its own database the
# same way. tuned: (driver option, value), the worker concurrency both sides run at.
DURABLE_PEERS = (
    Peer(
        "dbos",
        "3.4.0",
        ("dbos==3.4.0", "psycopg[binary]==3.3.9"),
        ("concurrency", 8),
    ),
    Peer(
        "django_absurd",
        "1.0.1",
        ("django-absurd==1.0.1", "absurd-sdk==0.5.0", "psycopg[binary]==3.3.9"),
        ("concurrency", 8),
    ),
)


def install(peer: Peer) -> None:
    """Create the peer's virtual environment unless it holds exactly its requirements."""
    stamp = peer.home / ".installed"
    wanted = "\n".join(peer.requirements)
    if stamp.exists() and stamp.read_text() == wanted and peer.python.exists():
        return
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [
        [base, "-m", "venv", "--clear", str(peer.home)],
        [str(peer.python), "-m", "pip", "install", "--quiet", *peer.requirements],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise PeerFailed(f"cannot install {peer.name} {peer.version}: {' / '.join(tail)}")
    stamp.write_text(wanted)


def prepare(
    peers: tuple[Peer, ...], url: str, names: str | None, script: str
) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[Peer, str]]]:
    """Install each of `peers` (those `names` lists, comma-separated; all by default) and
    set up its database: the `url` name with _NAME appended. Returns what the results
    say of each ({name: version, requirements, tuned, database or skipped}) and the
    peers that are ready ({name: (peer, its url)}); one that fails is skipped, the line
    printed (`script`: who prints it) saying why."""
    info: dict[str, dict[str, Any]] = {}
    runners: dict[str, tuple[Peer, str]] = {}
    wanted = None if not names else {name.strip() for name in names.split(",")}
    for peer in peers:
        if wanted is not None and peer.name not in wanted:
            continue
        info[peer.name] = {"version": peer.version, "requirements": list(peer.requirements)}
        info[peer.name]["tuned"] = dict([peer.tuned])
        try:
            install(peer)
            peer_url = database_url(url, peer.name)
            create_database(peer_url)
            call(peer, "setup", url=peer_url)
            runners[peer.name] = (peer, peer_url)
            info[peer.name]["database"] = peer_url.rsplit("/", 1)[-1]
        except PeerFailed as exc:
            info[peer.name]["skipped"] = str(exc)
            print(f"{script}: skipping {peer.name}: {exc}", flush=True)
    return info, runners


def call(peer: Peer, command: str, timeout: float = 900, **args: Any) -> dict[str, Any]:
    """Run one driver command with the peer's Python; return the JSON it prints last."""
    script = DRIVERS / f"{peer.name}_driver.py"
    argv = [str(peer.python), str(script), json.dumps({"cmd": command, **args})]
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise PeerFailed(f"{peer.name} {command}: no answer in {timeout:.0f} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise PeerFailed(f"{peer.name} {command} exited with {done.returncode}")
    try:
        return json.loads(lines[-1])
    except ValueError as exc:
        raise PeerFailed(f"{peer.name} {command} printed no JSON: {lines[-1][:200]!r}") from exc


def database_url(url: str, suffix: str) -> str:
    """`url` with `_SUFFIX` appended to its database name."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path}_{suffix}"))


def create_database(url: str) -> None:
    """Create the database of `url` on its server unless it exists."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    server = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
