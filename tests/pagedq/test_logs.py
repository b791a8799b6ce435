"""Logs: JSON lines for machines, short lines for people, and no chatter from libraries."""

import json
import subprocess
import sys

import pytest

from tests.support.services import REPO

SCRIPT = """
import logging, sys
from pagedq.logs import configure_logging
configure_logging("INFO", sys.argv[1])
logging.getLogger("pagedq.worker").info("worker ready", extra={"device": "cpu", "kv_cache_blocks": 8})
logging.getLogger("alembic.runtime.migration").info("Running upgrade 0001 -> 0002")
logging.getLogger("celery.worker.strategy").info("Task pagedq.run_job received")
logging.getLogger("kombu.connection").warning("No hostname was supplied")
"""


def logged(log_format: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, log_format], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stderr.splitlines()


@pytest.mark.parametrize("log_format", ["json", "auto"])  # auto: stderr is a pipe here, not a terminal
def test_json_lines_keep_the_fields_and_drop_library_chatter(log_format: str) -> None:
    records = [json.loads(line) for line in logged(log_format)]
    assert [(r["name"], r["message"]) for r in records] == [
        ("pagedq.worker", "worker ready"),
        ("kombu.connection", "No hostname was supplied"),
    ]
    assert (records[0]["device"], records[0]["kv_cache_blocks"]) == ("cpu", 8)


def test_text_lines_are_short_and_carry_the_fields() -> None:
    first, second = logged("text")
    assert first.endswith(" worker ready  device=cpu  kv_cache_blocks=8")
    assert second.endswith(" WARNING No hostname was supplied")
