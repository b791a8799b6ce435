"""A worker whose Celery consumer fails exits with Celery's failure status, not 0: `pagedq up` (or a
supervisor) takes a 0 for a worker that drained on a signal, and went on serving with none."""

import subprocess
import sys
from pathlib import Path

from celery.bootsteps import StartStopStep

from core.queue import make_celery
from core.settings import Settings
from worker.main import consume

REPO = Path(__file__).resolve().parents[2]


class BrokenConsumer(StartStopStep):
    """A consumer step that fails as it starts, as Kombu's transport did on an empty message file."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: object) -> None:
        raise RuntimeError("the consumer broke")


def consume_with_a_broken_consumer(data_dir: str) -> int:
    settings = Settings(data_dir=Path(data_dir))
    app = make_celery(settings)
    app.steps["consumer"].add(BrokenConsumer)
    return consume(app, settings, "pagedq.jobs.test", 1)


def test_a_failed_consumer_is_the_worker_s_exit_status(tmp_path: Path) -> None:
    # A process of its own: Celery's worker installs signal handlers and logging for its process.
    code = "import sys; from tests.worker.test_consume_status import consume_with_a_broken_consumer as c; "
    code += f"sys.exit(c({str(tmp_path)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the consumer broke" in done.stderr
