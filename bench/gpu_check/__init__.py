"""The GPU runbook: every GPU check and benchmark in one command, results in bench/RESULTS-gpu.md.

    python -m bench.gpu_check [--steps 1-4] [--continue] [--within S] [--copy-to DIR] [--dry-run] [--out FILE]

On a CUDA machine it runs the steps of ``plan.STEPS`` in order, each in its own process under its own time
limit (together at most 25 minutes on an H100, none over 9), goes on past a failed step, and rewrites
the results file after each one, so a run that is cut off still leaves what it measured; it ends with a
summary table (step, result, figure, target, time). ``--steps`` runs some of them, and ``--continue`` adds
them to the file's last run, so that a machine with a 10-minute limit per command runs the whole book in
a few commands (README, "On a GPU"); ``--within`` cuts the steps' limits to the command's own, and what a
running step reports is saved as it comes. Before the first step, runtime dependencies the machine lacks are
installed from the wheels of ``make gpu-wheels`` (bench/gpu_wheels.py) with ``pip install --no-index``.

``--dry-run``: the same steps at tiny sizes on the CPU (tiny random models, the Triton interpreter, a few
jobs), which CI runs so the runbook does not rot; a step whose point needs CUDA says "needs CUDA".

This package's runner imports only the standard library: the steps' processes import torch and the rest.
"""
