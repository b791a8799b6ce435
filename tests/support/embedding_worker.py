"""``python -m tests.support.embedding_worker NAME``: a worker of the served embedding model NAME, with
the settings of the environment (``worker.embedding_host.run_embedding_worker``, as ``pagedq worker
--model NAME`` runs it for a model of kind embed)."""

import sys

from core.served_models import model_named
from core.settings import Settings
from pagedq.logs import configure_logging
from worker.embedding_host import run_embedding_worker

if __name__ == "__main__":
    settings = Settings()
    configure_logging(settings.log_level)
    run_embedding_worker(settings, model_named(settings, sys.argv[1]))
