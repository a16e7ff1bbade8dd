"""The event loop the load engine runs on: uvloop when it is importable, else asyncio's own.

uvloop is asyncio's API over libuv (vLLM itself depends on it, so a vLLM environment has it); the
load engine (bench, its worker processes, tune's points) only uses what both loops have:
Protocols, add_reader, signal handlers, futures and timers, and stamps with time.perf_counter, not
loop.time(). One difference shows: uvloop's timers count whole ms from a time taken at the start
of the loop's turn, so a sleep can end up to ~1 ms early (asyncio's end late, never early);
`sleep_until` (request arrivals) waits again for what is left. `run` is asyncio.run with the loop
chosen; `running_loop` names the loop that runs, for the client's self-measurement. Client CPU
per token on each loop: docs/results.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any, TypeVar

from kimictl.core.errors import InputError

__all__ = ["EventLoop", "loop_factory", "run", "running_loop", "sleep_until", "stop_on_signals"]

T = TypeVar("T")


class EventLoop(StrEnum):
    auto = "auto"  # uvloop when importable, else asyncio
    uvloop = "uvloop"
    asyncio = "asyncio"


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The new-loop function for `choice` (None: asyncio's default); InputError when the choice
    is unknown, or is uvloop and uvloop cannot be imported."""
    if choice not in EventLoop.__members__:
        raise InputError(f"event loop {choice!r} is not one of: {', '.join(EventLoop.__members__)}")
    if choice == EventLoop.asyncio:
        return None
    try:
        import uvloop
    except ImportError:
        if choice == EventLoop.uvloop:
            raise InputError(
                "--loop uvloop: uvloop is not installed in this Python",
                hint="pip install uvloop (Linux and macOS), or pass --loop asyncio",
            ) from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], loop: str = EventLoop.auto) -> T:
    """asyncio.run(main) on the loop `loop` names (EventLoop)."""
    try:
        factory = loop_factory(loop)
    except InputError:
        main.close()  # never started: no "never awaited" warning
        raise
    saved = _python_handlers()
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    finally:
        # asyncio's close removes the loop's signal handlers; uvloop's leaves them installed,
        # bound to the closed loop, so a later SIGTERM to this process would go nowhere
        for sig, handler in saved.items():
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


def _python_handlers() -> dict[int, Any]:
    """Each signal's handler as Python sees it (main thread only: elsewhere none can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers: dict[int, Any] = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(sig)
            if handler is not None:  # None: not installed from Python, cannot be put back
                handlers[sig] = handler
    return handlers


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets, on the running loop (where it can take signal
    handlers: a Unix process's main thread; elsewhere the event is only set by its owner)."""
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            running.add_signal_handler(sig, stop.set)
    return stop


def running_loop() -> str:
    """The running loop's kind: "uvloop" or "asyncio"."""
    kind = type(asyncio.get_running_loop()).__module__
    return "uvloop" if kind.split(".")[0] == "uvloop" else "asyncio"


async def sleep_until(when: float, stop: asyncio.Event | None = None) -> None:
    """Wait until time.perf_counter() reaches `when`, or `stop` is set; on either loop, never
    early (a timer that fired early is waited again for what is left)."""
    while (delay := when - time.perf_counter()) > 0:
        if stop is None:
            await asyncio.sleep(delay)
            continue
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass
