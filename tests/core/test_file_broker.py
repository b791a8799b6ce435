"""The embedded mode's broker (core/file_broker.py) shows a message to its consumer only once it is
written whole. With kombu's own filesystem transport a consumer could take a message file before its
producer had written it, and the Celery worker stopped on the empty JSON."""

import contextlib
import threading
from pathlib import Path

from kombu.transport import resolve_transport

from core import file_broker
from core.queue import make_celery
from core.settings import Settings

QUEUE = "pagedq.jobs.test"  # each test its own (kombu keeps a queue's bindings per process): QUEUE + a suffix


def test_the_embedded_broker_writes_messages_whole(tmp_path: Path) -> None:
    app = make_celery(Settings(data_dir=tmp_path))
    with app.connection_for_write() as connection:
        assert type(connection.transport) is file_broker.Transport
    assert resolve_transport(file_broker.SCHEME) is file_broker.Transport


def test_a_message_file_appears_only_whole(tmp_path: Path) -> None:
    """A 32 MB message takes a while to write: a folder watcher must never see it under the name the
    consumer takes (kombu's own transport showed it growing there from empty)."""
    app, name = make_celery(Settings(data_dir=tmp_path)), f"{QUEUE}-whole"
    folder, body, seen = tmp_path / "broker" / "queue", "x" * (32 << 20), set[int]()
    with app.connection_for_write() as connection, connection.SimpleQueue(name) as queue:
        writer = threading.Thread(target=queue.put, args=(body,))
        writer.start()
        while writer.is_alive() or not seen:
            for path in folder.glob(f"*.{name}.msg"):
                with contextlib.suppress(FileNotFoundError):
                    seen.add(path.stat().st_size)
        writer.join()
        assert len(seen) == 1 and min(seen) > len(body), seen  # only ever its whole size
        assert queue.get(timeout=10).payload == body
    assert not list(folder.glob(".*.partial"))


def test_a_message_file_that_is_not_json_is_passed_over(tmp_path: Path) -> None:
    """A file cut short (a full disk, a copy by hand) costs its one message, which the reconciler
    republishes, not the worker: the consumer goes on to the next."""
    app, name = make_celery(Settings(data_dir=tmp_path)), f"{QUEUE}-cut"
    with app.connection_for_write() as connection, connection.SimpleQueue(name) as queue:
        (tmp_path / "broker" / "queue" / f"0_cut.{name}.msg").write_text('{"body": "eyJh')
        queue.put("after it")
        assert queue.get(timeout=10).payload == "after it"
