"""MainThread: a background thread's widget updates run on the thread that made the widgets."""

from __future__ import annotations

import asyncio
import threading

from mtp_explorer.ui.main_thread import MainThread


def test_a_call_posted_from_another_thread_runs_on_the_main_threads_loop_in_order():
    ran: list[tuple[int, str]] = []

    async def main() -> None:
        main_thread = MainThread()
        assert main_thread.deferred
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def worker() -> None:
            for i in range(3):
                main_thread.post(lambda i=i: ran.append((i, threading.current_thread().name)))
            main_thread.post(lambda: loop.call_soon(done.set))

        thread = threading.Thread(target=worker, name="worker")
        thread.start()
        await asyncio.wait_for(done.wait(), 10)
        thread.join()
        main_thread.post(lambda: ran.append((3, threading.current_thread().name)))  # on the main thread: at once
        assert ran[-1] == (3, threading.current_thread().name)

    asyncio.run(main())
    assert [i for i, _ in ran] == [0, 1, 2, 3] and {name for _, name in ran} == {threading.current_thread().name}


def test_without_a_running_loop_a_call_runs_at_once_in_the_callers_thread():
    main_thread = MainThread()
    assert not main_thread.deferred
    ran: list[str] = []
    thread = threading.Thread(target=lambda: main_thread.post(lambda: ran.append(threading.current_thread().name)))
    thread.start()
    thread.join()
    assert ran == [thread.name]
