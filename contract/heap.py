"""What a process made before its work, kept out of the garbage collector's walks.

A full collection walks every tracked object while it holds the GIL: with torch, transformers and a
tokenizer loaded that is millions of objects, 0.15-0.5 s at a time, and work that keeps many objects
alive for a while (a batch's slice of lines, the outputs of a step of 256 rows) sets one off every few
hundred milliseconds: an engine step that waits for it waits that long.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_startup_heap() -> None:
    """For a long-lived process (the API, a worker, a batch checker), once its startup is done: what it
    made is out of the collector's reach for good."""
    gc.collect()
    gc.freeze()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """For one run of work in a process that froze nothing (the offline ``LLM``'s ``generate``): what
    exists as it starts is out of the collector's walks until it ends, then back in, so that what the
    caller drops afterwards is collected as usual. A process that froze its heap already keeps it so."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
