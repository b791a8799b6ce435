"""What the API and the worker share: settings, job states, the job spec, the tables, the queue.

It imports neither side: ``api/`` and ``worker/`` both import it, and it knows nothing of the engine.
"""
