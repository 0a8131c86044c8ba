"""The worker's consumer settles no message on a channel that a lost broker connection closed."""

from __future__ import annotations

import logging

from kombu import Connection, Queue
from kombu.message import Message

from shared.config import load_settings
from workers.celery_app import celery_config
from workers.consumer import _unless_channel_closed

LOG = logging.getLogger(__name__)


def _received(connection: Connection) -> Message:
    channel = connection.channel()
    queue = Queue("tasks", channel=channel)
    queue.declare()
    connection.Producer(channel).publish({"task": "x"}, routing_key="tasks")
    message = queue.get(no_ack=False)
    assert message is not None
    return message


def test_a_message_of_a_live_channel_is_acknowledged() -> None:
    with Connection("memory://") as connection:
        message = _received(connection)
        _unless_channel_closed(message.ack_log_error)(LOG, connection.connection_errors)
        assert message.acknowledged


def test_a_message_of_a_closed_channel_is_left_to_the_broker() -> None:
    with Connection("memory://") as connection:
        message = _received(connection)
        assert message.channel is not None
        message.channel.close()  # what kombu does to the channels of a broken connection
        _unless_channel_closed(message.ack_log_error)(LOG, connection.connection_errors)
        _unless_channel_closed(message.reject_log_error)(LOG, connection.connection_errors, True)
        assert not message.acknowledged


def test_the_worker_runs_the_recovering_consumer_and_lets_running_stages_finish() -> None:
    config = celery_config(load_settings())
    assert config["worker_consumer"] == "workers.consumer:RecoveringConsumer"
    # Cancelling killed pool processes mid-stage, one between a release and its resend.
    assert config["worker_cancel_long_running_tasks_on_connection_loss"] is False
