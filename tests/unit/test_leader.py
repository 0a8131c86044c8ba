"""Leader election: a restarted worker takes over from its dead predecessor at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from workers.leader import _dead_here


def test_a_process_of_this_host_that_exited_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert _dead_here(f"{socket.gethostname()}:{child.pid}")


def test_a_live_process_or_another_host_is_never_taken_over() -> None:
    assert not _dead_here(f"{socket.gethostname()}:{os.getpid()}")
    assert not _dead_here(f"some-other-host:{2**22 + 7}")
    assert not _dead_here("garbage")
