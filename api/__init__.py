"""The REST API: accepts jobs into Postgres, publishes their ids to the broker, reports their state.

It builds on ``core`` only; it never imports the worker (jobs travel by task name).
"""
