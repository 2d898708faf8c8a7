"""A private PostgreSQL cluster started from the installed Debian server binaries.

Used by the test suite's ``postgres_url`` fixture and by the benchmarks. The cluster lives in a
temporary directory of its own, listens on 127.0.0.1 only and is removed afterwards, so it can
run next to another suite or benchmark on the same machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkops.testing.ports import free_port

PG_ROOT = Path("/usr/lib/postgresql")


def pg_bin(name: str) -> str:
    """The path of PostgreSQL server program ``name`` of the newest installed major version;
    RuntimeError if none is installed."""
    candidates = sorted(PG_ROOT.glob(f"*/bin/{name}"))
    if not candidates:
        raise RuntimeError("PostgreSQL server binaries are missing (Debian package postgresql)")
    return str(candidates[-1])


def postgres_version() -> str:
    """The installed server's version (e.g. ``"15.20 (Debian 15.20-0+deb12u1)"``), or
    "not installed"."""
    try:
        out = subprocess.run([pg_bin("postgres"), "--version"], capture_output=True, text=True)
    except RuntimeError:
        return "not installed"
    return out.stdout.strip().removeprefix("postgres (PostgreSQL) ")



def fresh_database(server_url: str, prefix: str) -> str:
    """A new, empty database ``<prefix>_<8 hex>`` in the cluster of ``server_url`` (a
    :func:`postgres_server` URL); its URL."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"

@contextmanager
def postgres_server(prefix: str = "sparkops-pg-") -> Iterator[str]:
    """A private PostgreSQL cluster on a free loopback port; yields the URL of its database
    ``sparkops``. RuntimeError if the binaries are missing.

    initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` user and
    lives in a fresh directory under the system temporary directory (that user cannot enter
    pytest's root-only temporary tree). Server settings are the defaults except ``fsync=off``:
    the data is thrown away afterwards, and fsync changes write speed, not results.
    """
    initdb = pg_bin("initdb")
    top = Path(tempfile.mkdtemp(prefix=prefix))
    datadir = top / "data"
    datadir.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(datadir, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    try:
        subprocess.run([*as_user, initdb, "-D", str(datadir), "-A", "trust", "-U", "postgres",
                        "--no-sync"], check=True, stdout=subprocess.DEVNULL)
        options = f"-p {port} -k {datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run([*as_user, pg_bin("pg_ctl"), "-D", str(datadir), "-o", options, "-w",
                        "-l", str(datadir / "log"), "start"], check=True,
                       stdout=subprocess.DEVNULL)
        try:
            subprocess.run([*as_user, pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port),
                            "-U", "postgres", "sparkops"], check=True)
            yield f"postgresql://postgres@127.0.0.1:{port}/sparkops"
        finally:
            subprocess.run([*as_user, pg_bin("pg_ctl"), "-D", str(datadir), "-m", "immediate",
                            "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        shutil.rmtree(top, ignore_errors=True)
