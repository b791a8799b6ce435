"""Webhook deliveries of a job or a batch: what was sent and how each attempt went."""
