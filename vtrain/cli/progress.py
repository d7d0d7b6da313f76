"""The progress bars of the commands that run long (`vtrain plan`, `vtrain validate --measurements`, a large
`vtrain ingest`): one rich bar on stderr, gone when the work is done, and only where someone sees it.

On a stderr that is not a terminal (a pipe, a file, a test's capture) there is no bar: rich would draw nothing
there but a blank line, after importing itself. stdout is never written, so ``--json`` stays one document.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: a count's callback: (done so far, to do)
Counted = Callable[[int, int], None]
#: a byte count's callback: bytes done since the last call
Read = Callable[[int], None]


def shown() -> bool:
    """Whether a bar would be seen: stderr is a terminal."""
    return sys.stderr.isatty()


@contextmanager
def counting(label: str) -> Iterator[Counted | None]:
    """A bar ``label [####    ] done/total elapsed`` fed by the callback yielded (``None`` where stderr is not a
    terminal: pass it on as "no progress"); its total may be unknown (a pulsing bar) until the first call."""
    if not shown():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    with _bar(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as (bar, task):
        yield lambda done, total: bar.update(task, completed=done, total=total)


@contextmanager
def reading(label: str, total_bytes: int) -> Iterator[Read | None]:
    """A bar ``label [####    ] MB read/total MB time left`` of ``total_bytes``, fed by the callback yielded with
    the bytes read since its last call (``None`` where stderr is not a terminal)."""
    if not shown():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn

    with _bar(TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn(), total=total_bytes) as (bar, task):
        yield lambda n: bar.advance(task, n)


@contextmanager
def _bar(*columns: Any, total: int | None = None) -> Iterator[tuple[Any, Any]]:
    """One transient rich bar on stderr and its task."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        yield bar, bar.add_task("work", total=total)
