"""Counter-based random draws: a sampled token's random number is a function of (seed, choice, position)
only, never of a stream shared with the rest of the batch, so a request samples the same tokens however
the engine batched, chunked, preempted or resumed it, and whatever ran beside it.

The function is splitmix64's finaliser chained over the three counters (integer arithmetic in Python, so
the same bits on every machine and device); its top 53 bits are the uniform draw in [0, 1).
"""

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def uniform(seed: int, choice: int, position: int) -> float:
    """The draw in [0, 1) of sample ``choice`` (0 for the first of n) for the token at ``position`` (its
    index in the prompt + output) under ``seed``."""
    z = _mix((seed + _GOLDEN) & _MASK)
    z = _mix((z ^ (choice + 2 * _GOLDEN)) & _MASK)
    z = _mix((z ^ (position + 3 * _GOLDEN)) & _MASK)
    return (z >> 11) * 2.0**-53
