"""testproject/embedded_pg.py: DATABASE_URL, then a local server, then the embedded one."""

from __future__ import annotations

import os
import socket

import pytest
from embedded_pg import EmbeddedError, _is_our_postgres, choose, local_probe


def test_database_url_wins(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://u@db.example:6543/app")
    monkeypatch.setenv("PGQUEUE_LOCAL_PROBE", "off")
    assert choose().url == "postgres://u@db.example:6543/app"
    assert choose().origin == "DATABASE_URL"


def test_a_server_answering_on_the_probed_address_is_used(monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        monkeypatch.delenv("DATABASE_URL", raising=False)
        monkeypatch.setenv("PGQUEUE_LOCAL_PROBE", f"127.0.0.1:{port}")
        choice = choose()
    assert choice.url == f"postgres://postgres@127.0.0.1:{port}/pgqueue"
    assert choice.origin == f"the local server on 127.0.0.1:{port}"


@pytest.mark.parametrize("value", ["5432", "localhost:", "host:port"])
def test_a_malformed_probe_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("PGQUEUE_LOCAL_PROBE", value)
    with pytest.raises(EmbeddedError, match="PGQUEUE_LOCAL_PROBE must be host:port"):
        local_probe()


def test_the_probe_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("PGQUEUE_LOCAL_PROBE", "off")
    assert local_probe() is None


def test_a_pid_file_naming_another_process_is_stale():
    # This process, and pid 1, are alive but not the cluster's postgres.
    assert not _is_our_postgres(os.getpid())
    assert not _is_our_postgres(1)
