"""A Redis server of a test's own (``redis-server`` on a free port, no persistence), to stop and start at
will: the machine's shared server must stay up for every other test. A missing binary skips the test on
a laptop and fails it under ``CI=true``."""

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.support.services import free_port, unavailable, wait_for


class PrivateRedis:
    def __init__(self, binary: str, root: Path) -> None:
        self.binary, self.root, self.port = binary, root, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        options = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.root / "redis.log", "ab") as log:
            command = [self.binary, *options, "--dir", str(self.root)]
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._answers, 30, "the private redis-server to answer")

    def stop(self) -> None:
        """As a crash would: every connection cut at once."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())
        except redis.ConnectionError:
            return False


@contextmanager
def private_redis(root: Path) -> Iterator[PrivateRedis]:
    """A started server, killed at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server", FileNotFoundError("no redis-server on PATH"))
        raise AssertionError("unreachable")
    server = PrivateRedis(binary, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
