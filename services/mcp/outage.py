"""Which backing service a failure says is down, in words an MCP client can show."""

from __future__ import annotations

from kombu.exceptions import OperationalError as BrokerError
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import ConnectionTimeout
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeout

HOW_TO_START = (
    "locally, start the stack with `make up`; for a stack on other ports, "
    "set RAGLINE_OPENSEARCH__URL and RAGLINE_REDIS__URL"
)


def unreachable(error: BaseException) -> str | None:
    """'OpenSearch' or 'Redis' when `error` is a lost connection to it; None for anything else."""
    if isinstance(error, OpenSearchConnectionError | ConnectionTimeout):
        return "OpenSearch"
    if isinstance(error, RedisConnectionError | RedisTimeout | BrokerError):
        return "Redis"
    return None


def outage_message(service: str) -> str:
    """The text after `UNAVAILABLE: ` of a tool call that needed `service`."""
    return f"{service} is unreachable; retry once it is up ({HOW_TO_START})"
