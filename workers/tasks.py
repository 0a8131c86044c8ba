"""Celery tasks of the Ragline workers."""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import shared_task


@shared_task(name="ragline.ping", acks_late=False)
def ping(payload: str = "") -> dict[str, Any]:
    """Answer from inside a worker process: proves broker, worker and result backend work."""
    return {"payload": payload, "hostname": socket.gethostname(), "pid": os.getpid()}
