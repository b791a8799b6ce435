"""The broker on Redis (core/redis_broker.py): kombu's transport with one client per connection pool, not
a new one, with its copy of redis-py's reply callbacks, for every publish and every acknowledgement."""

import uuid

import pytest
import redis

from core import redis_broker
from core.queue import make_celery, publish_jobs, queue_depth
from core.settings import Settings
from tests.support.services import redis_url


@pytest.fixture
def clients_made(monkeypatch: pytest.MonkeyPatch) -> list[redis.Redis]:
    """Every ``redis.Redis`` made from now on."""
    made: list[redis.Redis] = []
    init = redis.Redis.__init__

    def counted(self: redis.Redis, *args: object, **kwargs: object) -> None:
        made.append(self)
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.Redis, "__init__", counted)
    return made


def test_publishing_one_job_at_a_time_makes_one_client(clients_made: list[redis.Redis]) -> None:
    app, queue = make_celery(Settings(broker_url=redis_url())), f"pagedq.jobs.test-{uuid.uuid4().hex[:8]}"
    with app.connection_for_write() as connection:
        assert type(connection.transport) is redis_broker.Transport
    publish_jobs(app, ["job_0"], queue, 0)
    first = len(clients_made)
    for i in range(1, 40):  # as the API publishes a lone submission: a producer batch of one
        publish_jobs(app, [f"job_{i}"], queue, 0)
    assert len(clients_made) == first  # kombu's own made one more for each
    assert queue_depth(app, queue) == 40


def test_a_channel_whose_pools_were_dropped_gets_a_client_of_the_new_pool() -> None:
    """After a fork kombu drops a channel's pools: the kept client would talk through the old one."""
    app = make_celery(Settings(broker_url=redis_url()))
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        before = channel._create_client()
        assert channel._create_client() is before
        channel._disconnect_pools()
        after = channel._create_client()
        assert after is not before and after.connection_pool is channel.pool
        assert after.ping()


def test_other_redis_urls_keep_kombu_s_transport() -> None:
    """TLS, Sentinel and socket URLs keep kombu's own transport, which reads them."""
    for url in ("rediss://127.0.0.1:6379/0", "sentinel://127.0.0.1:26379", "redis+socket:///tmp/redis.sock"):
        assert "broker_transport" not in make_celery(Settings(broker_url=url)).conf.changes, url


def test_a_received_message_leaves_redis_at_once() -> None:
    """The database, not the broker, repairs a message that a killed worker held (core/queue.py), so Redis
    keeps no copy of a received one: kombu's acknowledgement emulation wrote it into its ``unacked`` hash
    as it was received and removed it at the ack, a transaction each."""
    app, queue = make_celery(Settings(broker_url=redis_url())), f"pagedq.jobs.test-{uuid.uuid4().hex[:8]}"
    publish_jobs(app, ["job_0"], queue, 0)
    broker = redis.Redis.from_url(redis_url())
    with app.connection_for_read() as connection:
        message = connection.default_channel.basic_get(queue, no_ack=False)
        assert message is not None and message.decode()[0] == ["job_0"]
        assert queue_depth(app, queue) == 0
        assert not broker.hexists("unacked", message.delivery_tag)
        message.ack()
