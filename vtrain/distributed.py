"""Running work in parallel: as worker processes on this machine (how many: :func:`workers_within_cores`), or as Ray
tasks (``pip install vtrain[ray]``) on an existing cluster or a local instance: `vtrain plan`'s groups of plans and
`vtrain ingest`'s rank files go through the same function as their process pools, so the numbers are the same."""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from multiprocessing import resource_tracker
from typing import Any, TypeVar

from vtrain.errors import InputError, InputWarning, stops_deferred


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers_within_cores(requested: int, warn: Callable[[str], None]) -> int:
    """``--workers``, at most one process per usable core (``warn`` says so when that is fewer): the work is CPU-
    bound, so more processes than cores add only memory (each holds its own copy of the profile and the
    libraries: 10,000 asked for would exhaust any machine's memory)."""
    cores = usable_cores()
    if requested > cores:
        warn(f"--workers {requested}: this process may use {cores} CPU core(s); using {cores} worker processes")
        return cores
    return requested


Job = TypeVar("Job")
Result = TypeVar("Result")


def map_in_order(function: Callable[[Job], Result], jobs: list[Job], workers: int) -> Iterator[Result]:
    """``function(job)`` of every job, in the jobs' order: in this process for one worker (or one job), else by
    :func:`worker_pool` (``function`` and the jobs must pickle)."""
    if workers <= 1 or len(jobs) <= 1:
        yield from map(function, jobs)
        return
    with worker_pool(min(workers, len(jobs))) as pool:
        yield from pool.imap(function, jobs)


@contextmanager
def worker_pool(workers: int, initializer: Callable[..., None] | None = None,
                initargs: tuple[Any, ...] = ()) -> Iterator[multiprocessing.pool.Pool]:
    """A pool of ``workers`` spawned processes (forking a process that runs polars' threads can deadlock), each
    running polars on one thread (the parallelism is across jobs), saying none of the user's warnings
    (:func:`quiet_input_warnings`) and then running ``initializer(*initargs)``. Ctrl-C never reaches a worker:
    the terminal sends it to every process of its group, and the workers start with it blocked (a signal mask
    survives fork and exec; Python's own resource tracker is started the same way), so a Ctrl-C while a worker
    imports prints no traceback and the calling process alone handles it, once the workers have been given what
    they start with (:func:`~vtrain.errors.stops_deferred`: the signal may arrive in any thread of this process,
    Python runs its handler in the main one). Leaving the block stops the workers
    (SIGTERM, left unblocked for that) at once: after a stop nothing they were doing is waited for (closing an
    iterator over their results stops them before anyone removes what they write in)."""
    context = multiprocessing.get_context("spawn")
    resource_tracker.ensure_running()  # started now: starting it unblocks Ctrl-C in this process
    with ExitStack() as stack:
        with stops_deferred():  # a stop in the middle of a worker's start would leave it reading a closed pipe
            with _one_thread_each():
                before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # inherited by the workers
                try:
                    on_main = threading.current_thread() is threading.main_thread()
                    pool = stack.enter_context(context.Pool(workers, initializer=_start_worker,
                                                            initargs=(initializer, initargs, on_main)))
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, before)
        yield pool  # a stop held while the workers started arrived above: the stack then stopped them


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple[Any, ...], on_main: bool) -> None:
    if on_main:  # the signal comes when the thread that started the worker ends: only the main one ends with us
        _die_with_the_parent()
    quiet_input_warnings()
    if initializer is not None:
        initializer(*initargs)


#: Linux's prctl option that sends a process a signal when its parent dies
_PR_SET_PDEATHSIG = 1


def _die_with_the_parent() -> None:
    """In a worker process started from the calling process's main thread, on Linux: be killed when the calling
    process dies, however it dies (Linux signals when the starting thread ends, so a pool started on another thread
    does not ask). Killed at once (an out-of-memory kill, ``kill -9``), the calling process left its workers to
    write their results into a closed pipe, each printing two BrokenPipeError tracebacks on the user's terminal
    (an audit). Elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the request was made
        os._exit(0)


def quiet_input_warnings() -> None:
    """In a worker process: warnings about the user's input are the calling process's to say, once; a worker
    repeating them (in Python's own format, not the command's one line) says nothing new."""
    warnings.simplefilter("ignore", InputWarning)


class _one_thread_each:
    """Workers start with one polars thread each (``POLARS_MAX_THREADS``, read when polars is imported)."""

    def __enter__(self) -> None:
        self._before = os.environ.get("POLARS_MAX_THREADS")
        os.environ["POLARS_MAX_THREADS"] = "1"

    def __exit__(self, *_: object) -> None:
        if self._before is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = self._before


def map_on_ray_in_order(address: str, function: Callable[[Job], Result], jobs: list[Job]) -> Iterator[Result]:
    """``function(job)`` of every job as one Ray task each (:func:`run_on_ray`; ``address`` as there), yielded in
    the jobs' order. A task reads what its job names where it runs: files must be on a shared file system."""
    done: dict[int, Result] = {}
    following = 0
    for index, result in run_on_ray(address, _numbered, function, None, None, list(enumerate(jobs))):
        done[index] = result
        while following in done:
            yield done.pop(following)
            following += 1


def _numbered(function: Callable[[Job], Result], _profile: None, _device: None,
              job: tuple[int, Job]) -> tuple[int, Result]:
    """A Ray task of :func:`map_on_ray_in_order`: the job's result with the job's number."""
    index, item = job
    return index, function(item)


def run_on_ray(address: str, function: Callable[..., Any], base: Any, profile: Any, device: Any,
               groups: list[Any]) -> Iterator[Any]:
    """Yield ``function(base, profile, device, group)`` for every group, each run as one Ray task, as they
    finish. ``address``: a cluster's address (``ray://host:10001``, ``auto``), or ``local``: the cluster named
    by ``RAY_ADDRESS`` if set, else a new local instance.
    The shared arguments are put in Ray's object store once."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'vtrain[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises bare exceptions when a node does not start
            raise InputError(f"--ray: could not start or reach Ray at {address!r}: {exc}") from None
    try:
        remote = ray.remote(function)
        shared = [ray.put(value) for value in (base, profile, device)]
        pending = [remote.remote(*shared, group) for group in groups]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


def release_freed_memory() -> None:
    """Hand the memory freed since the last call back to the system (glibc's ``malloc_trim``; nothing elsewhere).
    A validation frees hundreds of MB at once (a rank's decoded events, the replay's edges) that glibc keeps for
    reuse; the next phase allocates differently, so without this the process's peak is the sum of the phases'."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
