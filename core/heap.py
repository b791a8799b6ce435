"""What a process made at startup, kept out of the garbage collector's walks."""

import gc


def freeze_startup_heap() -> None:
    """Move what startup made (the tokenizer, torch, every module: hundreds of thousands of objects, millions
    with a model) out of the collector's reach. A full collection holds the GIL for as long as it walks the
    heap: 0.15-0.5 s here, and work that keeps many objects alive for a while (a batch's slice of lines, a
    step's outputs) sets one off every few hundred milliseconds."""
    gc.collect()
    gc.freeze()
