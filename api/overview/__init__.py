"""GET /v1/overview: the console's figures (jobs by state, live workers, the last hour)."""
