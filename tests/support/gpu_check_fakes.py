"""Steps that misbehave, for tests/bench/test_gpu_check.py: the runner must record each and go on."""

import os
import time

from bench.gpu_check.outcome import PASS, Context, Outcome


def slow(ctx: Context) -> Outcome:
    ctx.report(Outcome(PASS, "measured before the cut", "half the work"))
    time.sleep(600)
    return Outcome(PASS, "never reached")


def raises(ctx: Context) -> Outcome:
    ctx.report(Outcome(PASS, "first part", "the first part ran"))
    raise RuntimeError("the second part broke")


def dies(ctx: Context) -> Outcome:
    os._exit(3)


def deadline(ctx: Context) -> Outcome:
    return Outcome(PASS, f"{ctx.seconds_left():.0f}")
