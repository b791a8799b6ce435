"""The embedded mode's broker: kombu's filesystem transport, with each message written whole.

Kombu creates a message file under its final name and then writes it, so a consumer listing the folder
in between takes the file empty, fails to decode it and stops the Celery worker (celery/kombu#1551); the
message is lost with it. Here a message is written under a name the consumer skips, then renamed into
place, which is atomic on one filesystem; and a message file that is no JSON all the same is passed over.
"""

import logging
import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps

SCHEME = "pagedqfs"
logger = logging.getLogger("pagedq.broker")


class Channel(filesystem.Channel):
    def _get(self, queue: str) -> Any:
        """The next message; one whose file is not JSON (cut short, or put there by hand) is logged and
        passed over rather than stopping the worker, and its job republished by the reconciler."""
        while True:
            try:
                return super()._get(queue)
            except ValueError as error:
                logger.error(
                    "a message file was not JSON; passed over", extra={"queue": queue, "error": str(error)}
                )

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's name: creation order first, so that a queue is read first in, first out
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as out:
                out.write(dumps(payload).encode())
            os.replace(partial, final)
        except OSError as error:
            raise ChannelError(f"cannot add the message file {final!r}: {error}") from error


class Transport(filesystem.Transport):
    Channel = Channel


TRANSPORT_ALIASES[SCHEME] = f"{__name__}:Transport"
