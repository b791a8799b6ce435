"""The operator's endpoints: /healthz, /readyz, /metrics."""
