"""One module per runbook step; each ``run(ctx)`` returns its ``Outcome`` and runs in its own process."""
