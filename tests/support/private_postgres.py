"""A PostgreSQL cluster of a test's own (``initdb`` + ``pg_ctl`` on a free port), to stop and start at will:
the machine's shared server must stay up for every other test.

``initdb`` refuses to run as root, so as root the cluster belongs to the ``postgres`` system user. Missing
binaries skip the test on a laptop and fail it under ``CI=true``.
"""

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg

from core.settings import Settings
from tests.support.services import free_port, unavailable


def postgres_bin() -> Path | None:
    """The newest server's binaries (Debian keeps them out of PATH), else whatever PATH has."""
    installed = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "initdb").exists()]
    if installed:
        return max(installed, key=lambda path: int(path.parent.name))
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class PrivatePostgres:
    def __init__(self, root: Path, binaries: Path) -> None:
        self.root, self.binaries, self.port = root, binaries, free_port()
        self.data = root / "data"
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _pg(self, *args: str) -> None:
        command = [*self.run_as, str(self.binaries / args[0]), *args[1:]]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}\n{log[-2000:]}")

    def init(self) -> None:
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.root / "server.log")
        self._pg("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: as a crash would, cutting every connection mid-transaction."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres", driver: str = "postgresql") -> str:
        return f"{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def create_migrated_database(self, name: str = "pagedq") -> str:
        """A database at the latest revision; returns its SQLAlchemy URL."""
        from migrations import upgrade

        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name, driver="postgresql+psycopg")
        upgrade(Settings(database_url=url))
        return url


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started cluster, stopped and deleted at the end."""
    binaries = postgres_bin()
    if binaries is None:
        unavailable("initdb/pg_ctl (a PostgreSQL server install)", FileNotFoundError("no initdb found"))
        raise AssertionError("unreachable")
    root = Path(tempfile.mkdtemp(prefix="pagedq-pg-"))  # not under pytest's tmp_path: root-only, mode 700
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = PrivatePostgres(root, binaries)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with suppress(RuntimeError):  # already stopped
            server.stop("fast")
        shutil.rmtree(root, ignore_errors=True)
