"""GET /v1/usage: what each key used, per model and day: jobs, tokens and engine time."""
