"""A completion window, ``<N>h``: a batch's (OpenAI's ``completion_window``) or a job's. It is the job's
deadline in the claim order (worker/fair.py); a batch's also expires it."""

import re
from datetime import timedelta

MAX_WINDOW_HOURS = 168


def checked_window(window: str) -> str:
    match = re.fullmatch(r"([1-9][0-9]*)h", window)
    if match is None or int(match.group(1)) > MAX_WINDOW_HOURS:
        raise ValueError(f"completion_window must be '<N>h' with 1 <= N <= {MAX_WINDOW_HOURS}, e.g. '24h'")
    return window


def window_length(window: str) -> timedelta:
    return timedelta(hours=int(window.removesuffix("h")))
