"""Private PostgreSQL clusters on free ports, run by the `postgres` user (initdb refuses
root): the fault script's database, and a primary with a streaming replica for the replica
router's test (tests/test_replica.py). Run as root, on a machine with PostgreSQL's server
binaries (Debian's postgresql package puts them under /usr/lib/postgresql/<version>/bin).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import psycopg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin(name: str) -> str:
    """A PostgreSQL server binary: the newest under /usr/lib/postgresql, else on PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    located = shutil.which(name)
    if located is None:
        raise SystemExit(f"no {name}: install PostgreSQL's server binaries")
    return located


class Postgres:
    """A private cluster in `folder`, run by the `postgres` user, on a free port: a new one
    (initdb), or with `replica_of`, a streaming replica of a running one (pg_basebackup)."""

    def __init__(self, folder: Path, *, replica_of: Postgres | None = None) -> None:
        self.data = folder / "pgdata"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/tallybook"
        user = pwd.getpwnam("postgres")
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, user.pw_uid, user.pw_gid)
        if replica_of is None:
            # --no-sync: a new cluster's files are flushed by its first checkpoint.
            self._as_postgres(
                pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                "--no-sync",
            )  # fmt: skip
        else:
            # -R writes primary_conninfo and standby.signal: it starts as a hot standby
            # that streams the primary's WAL. --checkpoint fast: not spread over minutes.
            self._as_postgres(
                pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(replica_of.port),
                "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream",
                "--checkpoint", "fast", "--no-sync",
            )  # fmt: skip

    def _as_postgres(self, *command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], check=True, stdout=subprocess.DEVNULL
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        log = str(self.data / "server.log")
        self._as_postgres(
            pg_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start"
        )

    def stop(self, mode: str) -> None:
        self._as_postgres(pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_database(self) -> None:
        admin = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE tallybook")
