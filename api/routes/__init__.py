"""One router per resource: jobs, and the operator's health and metrics endpoints."""
