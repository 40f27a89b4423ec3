"""The tasks a host runs beside its requests, started and ended as one group.

A host starts tasks that outlive the call that starts them: a state message on its way (its emulated
delay, then its request), a health check every interval. ``asyncio.TaskGroup`` needs one ``async with``
around them all, which a server's start and stop hooks cannot give (they run in different tasks), so a
``TaskSet`` is its equivalent for a service: it keeps every task it started until the task ends, logs a
task that failed (none ends unseen), and ``close`` cancels those still running and awaits every one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import Any

log = logging.getLogger("lbtestbed.tasks")


class TaskSet:
    """Tasks started by ``spawn`` and still running; ``close`` ends them all."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """Run ``coro`` as a task of this set (in the running loop); once the set is closed (its host
        stopping), ``coro`` is dropped unstarted and None returned."""
        if self._closed:
            coro.close()
            return None
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: a task failed", self.name, exc_info=task.exception())

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task still running and wait until each has ended (no task is left behind)."""
        self._closed = True
        while self._tasks:
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
