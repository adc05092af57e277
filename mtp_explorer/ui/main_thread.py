"""Widget updates made from a background thread, run on the kernel's main thread: :class:`MainThread`.

ipywidgets' state sync is not thread-safe: a widget changed from two threads at once can lose an update (the
browser then keeps showing an old state). A background thread that prepares something to show hands the showing
to the thread that made the widgets, through its running asyncio loop (a Jupyter kernel's).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["MainThread"]


class MainThread:
    """Runs calls on the thread that made it, through that thread's running asyncio loop (a Jupyter kernel's), in
    the order they were posted; where it had no running loop (a script, the tests), in the caller's thread at once."""

    def __init__(self) -> None:
        self._thread = threading.current_thread()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def deferred(self) -> bool:
        """Calls from other threads wait for the loop (True) rather than run at once."""
        return self._loop is not None

    def post(self, call: Callable[[], None]) -> None:
        """Run ``call()`` on the main thread: now where this is it (or there is no loop), else when its loop is
        next free (a kernel's: after the running cell)."""
        loop = self._loop
        if loop is None or threading.current_thread() is self._thread or loop.is_closed():
            call()
        else:
            loop.call_soon_threadsafe(call)
