"""The API's startup heap is out of the garbage collector's reach, so a full collection (a big batch's
accept sets off several) walks what requests made, not the millions of objects startup made (torch, the
tokenizer, every module), which stopped every thread, the event loop's too, for 0.3-0.8 s each. Its
effect on the loop is measured by ``bench/service_overhead.py --healthz-during-batch``."""

import gc

from fastapi.testclient import TestClient

from api.app import create_app
from core.settings import Settings


def test_serving_starts_with_the_startup_heap_frozen(service_settings: Settings) -> None:
    gc.unfreeze()  # what earlier apps of this test process froze
    app = create_app(service_settings)
    assert gc.get_freeze_count() == 0
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        frozen, collectable = gc.get_freeze_count(), len(gc.get_objects())
    assert frozen > 10 * collectable, (frozen, collectable)  # a full collection walks a tenth or less
