"""Where independent simulations run: a local process pool, or the workers of a Dask distributed scheduler.

A sweep's points and a simulation's replications are independent calls of one function on picklable,
self-contained arguments (the frozen ``Experiment``, a replication index; never a path). ``open_executor``
gives the place to run them: ``local`` (a process pool on this machine) or ``tcp://HOST:PORT`` (the address
``dask scheduler`` prints; its workers must have the same lbtestbed installed). ``run_each`` submits the
calls there and hands each result back as it finishes, then all of them in the order given.

Where a call runs does not change its result: the simulator draws every random number from the
experiment's seed and the replication index (``model.streams``), so a worker anywhere computes the same
bits as the local pool. A call Dask loses with its worker is run again elsewhere, with the same result.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as local_as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol, TypeVar

from lbtestbed.analysis.results.provenance import version
from lbtestbed.experiment.errors import BadInput, Failed

T = TypeVar("T")

LOCAL = "local"
#: wall seconds a scheduler has to answer, and then to have a worker, before the command gives up
CONNECT_TIMEOUT = 5.0
#: wall seconds a run goes on without a single worker (they may come back) before it gives up
WORKERLESS = 60.0
CHECK_WORKERS = 2.0  # wall seconds between asking the scheduler for its workers while waiting
POLL = 0.05  # wall seconds between looks for finished calls
_ADDRESS = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")


def executor_address(text: str) -> str:
    """``local``, or a Dask scheduler's address ``tcp://HOST:PORT``; ValueError saying what is expected."""
    if text == LOCAL:
        return text
    m = _ADDRESS.fullmatch(text)
    if m is None or not 0 < int(m["port"]) < 65536:
        raise ValueError(
            f"expected 'local' or a Dask scheduler's address tcp://HOST:PORT (as dask scheduler prints "
            f"it), got {text!r}"
        )
    return text


class Pending(Protocol):
    """A call submitted to an executor: a ``concurrent.futures.Future`` or a Dask ``Future``."""

    def result(self) -> Any: ...


class Executor(Protocol):
    """What sweeps and replications need of the place they run: submit a call, see calls finish."""

    #: how the executor is named in messages: ``local (2 processes)`` or the scheduler's address
    name: str
    #: what ``result()`` raises when the executor, not the call, failed (a process or worker lost)
    lost: tuple[type[BaseException], ...]

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Pending: ...

    def as_completed(self, pending: Iterable[Pending]) -> Iterator[Pending]: ...


class _Local:
    """A process pool on this machine."""

    lost: tuple[type[BaseException], ...] = (BrokenProcessPool,)

    def __init__(self, pool: ProcessPoolExecutor, jobs: int) -> None:
        self.pool = pool
        self.name = f"local ({jobs} process{'es' if jobs > 1 else ''})"

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Pending:
        return self.pool.submit(fn, *args)

    def as_completed(self, pending: Iterable[Pending]) -> Iterator[Pending]:
        return local_as_completed(pending)  # type: ignore[arg-type]


class _Dask:
    """The workers of a Dask distributed scheduler, through a client of its own."""

    def __init__(self, client: Any, address: str) -> None:
        from distributed import CancelledError
        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker

        self.client, self.name = client, address
        self.lost: tuple[type[BaseException], ...] = (KilledWorker, CancelledError, CommClosedError)

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Pending:
        # pure=False: every call is a task of its own, never merged with an equal one by its arguments
        return self.client.submit(fn, *args, pure=False)

    def as_completed(self, pending: Iterable[Pending]) -> Iterator[Pending]:
        """The calls as they finish; Failed when the scheduler has had no worker for ``WORKERLESS``
        seconds (Dask itself would wait for one for ever)."""
        from distributed import as_completed

        finished = as_completed(list(pending), loop=self.client.loop)
        checked = seen = time.monotonic()
        while not finished.is_empty():
            if finished.has_ready():
                yield from finished.next_batch(block=False)
                continue
            time.sleep(POLL)
            now = time.monotonic()
            if now - checked >= CHECK_WORKERS:
                checked = now
                if self.client.nthreads():
                    seen = now
                elif now - seen >= WORKERLESS:
                    raise Failed(
                        f"{self.name}: no worker for {WORKERLESS:g} s, {finished.count()} calls not done"
                    )


@contextlib.contextmanager
def open_executor(where: str, jobs: int = 1, timeout: float = CONNECT_TIMEOUT) -> Iterator[Executor]:
    """The executor ``where`` names (``executor_address``): ``local``, a pool of ``jobs`` processes; else
    a client of that Dask scheduler, checked first (it answers, has a worker within ``timeout`` seconds,
    and every worker runs this lbtestbed): BadInput otherwise, before anything runs. What is still
    running when the block ends by an exception is cancelled."""
    if where == LOCAL:
        pool = ProcessPoolExecutor(max_workers=max(1, jobs))
        try:
            yield _Local(pool, max(1, jobs))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return
    client = _connect(where, timeout)
    try:
        yield _Dask(client, where)
    finally:
        client.close()  # the scheduler forgets the client's tasks, running or not


def _connect(address: str, timeout: float) -> Any:
    """A Dask client of the scheduler at ``address`` with at least one worker that runs this lbtestbed."""
    try:
        from distributed import Client
    except ImportError:
        raise BadInput(
            f"--executor {address}: needs Dask on this machine: pip install 'lbtestbed[dask]'"
        ) from None
    _check_scheduler(address, timeout)
    client = Client(address, timeout=timeout, set_as_default=False)
    try:
        _check_workers(client, address, timeout)
    except BaseException:
        client.close()
        raise
    return client


def _check_scheduler(address: str, timeout: float) -> None:
    """BadInput unless a Dask scheduler answers at ``address`` within ``timeout`` seconds. Asked before
    a client is made because a client waits for ever on a server that accepts the connection but is not
    Dask's (an HTTP server, say)."""
    m = _ADDRESS.fullmatch(address)
    assert m is not None, address  # checked by executor_address
    try:  # a plain connection first: refused answers at once, where Dask's client retries until the timeout
        socket.create_connection((m["host"].strip("[]"), int(m["port"])), timeout=timeout).close()
        identity = asyncio.run(asyncio.wait_for(_identity(address, timeout), timeout))
    except OSError as e:  # refused, unreachable, no answer in time (TimeoutError)
        raise BadInput(
            f"--executor {address}: no Dask scheduler answers there within {timeout:g} s "
            f"({type(e).__name__}{': ' if str(e) else ''}{e})"
        ) from None
    except Exception as e:  # a server that is not Dask's answers with bytes that mean nothing to it
        raise BadInput(f"--executor {address}: not a Dask scheduler ({type(e).__name__}: {e})") from None
    kind = identity.get("type") if isinstance(identity, dict) else type(identity).__name__
    if kind != "Scheduler":
        raise BadInput(f"--executor {address}: not a Dask scheduler (it says it is a {kind})")


async def _identity(address: str, timeout: float) -> Any:
    """What the server at ``address`` says it is, asked in Dask's own protocol."""
    from distributed.comm import connect

    comm = await connect(address, timeout=timeout)
    try:
        await comm.write({"op": "identity"})
        return await comm.read()
    finally:
        comm.abort()


def _check_workers(client: Any, address: str, timeout: float) -> None:
    """BadInput unless the scheduler has a worker within ``timeout`` and every worker has this version."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise BadInput(
            f"--executor {address}: the scheduler has no worker after {timeout:g} s (start one on each "
            f"machine: dask worker {address})"
        ) from None
    try:
        versions = client.run(importlib.metadata.version, "lbtestbed")
    except Exception as e:  # PackageNotFoundError from a worker without it, as a rule
        raise BadInput(
            f"--executor {address}: a worker cannot say its lbtestbed version ({type(e).__name__}: {e}; "
            f"install lbtestbed {version()} on every machine)"
        ) from None
    ours = version()
    for worker, theirs in sorted(versions.items()):
        if theirs != ours:
            raise BadInput(
                f"--executor {address}: worker {worker} runs lbtestbed {theirs}, this machine "
                f"{ours} (install the same version on every machine)"
            )


def run_each(
    executor: Executor,
    fn: Callable[..., T],
    calls: Sequence[tuple[Any, ...]],
    done: Callable[[int, int, T], None] | None = None,
) -> list[T]:
    """``fn(*args)`` for each ``args`` of ``calls`` on ``executor``, the results in the order of
    ``calls``. As each call finishes, ``done(finished, i, result)``: how many have finished, the call's
    index in ``calls`` and its result. An exception of a call is raised as it is; an executor that lost
    its processes or workers raises Failed."""
    pending = [executor.submit(fn, *args) for args in calls]
    index = {id(p): i for i, p in enumerate(pending)}
    results: list[Any] = [None] * len(calls)
    try:
        for finished, p in enumerate(executor.as_completed(pending), 1):
            i = index[id(p)]
            results[i] = p.result()
            if done is not None:
                done(finished, i, results[i])
    except executor.lost as e:
        raise Failed(f"{executor.name}: {type(e).__name__}: {e}") from e
    return results
