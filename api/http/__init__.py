"""HTTP plumbing every resource shares: callers and auth, key limits, problems and their statuses,
body limits, metrics, OpenAPI responses."""
