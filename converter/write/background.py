"""``pwrite`` on a background thread: one process computes the next tensor while the kernel copies
the last one into the page cache.

Both sides release the GIL (numpy's kernels, ``os.pwrite``), so on a machine with a spare core a
single worker overlaps its arithmetic with its writes instead of alternating between them. Bytes
in flight are bounded (``limit``; one item larger than the limit still goes, alone), each item is
written at its own offset, so the file's bytes do not depend on the timing.

An item whose bytes are a view of a memory-mapped file (a dense tensor passed through from the source:
:func:`submit` with ``release``) holds no memory of its own: it is not counted in the bytes in flight,
so queueing it never makes the caller wait, and ``release`` (the map's pages dropped) runs once it is
written; such an item is queued in chunks of :data:`MAPPED_CHUNK`, so at most one chunk of the map is
resident at a time. The caller goes on computing the next tensor while the kernel copies the map.

A write error (``ENOSPC`` ...) is raised by the next :meth:`BackgroundWriter.submit` or
:meth:`~BackgroundWriter.drain` as :class:`converter.errors.OutputWriteError` naming the file;
nothing is dropped silently. After a ``fork`` the child starts
its own queue and thread on first use (a thread does not survive ``fork``), and
:func:`drain_process` lets a worker wait for its own writes before it reports a task done.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Callable

from converter.write.writeback import start_writeback
from converter.errors import OutputWriteError

__all__ = ["BackgroundWriter", "drain_process", "pause_threads", "pwrite_all", "DEFAULT_LIMIT"]

#: Bytes queued but not yet written, at most (besides one larger item alone).
DEFAULT_LIMIT = 96 * 2**20
#: Largest single ``pwrite`` call.
_CHUNK = 1 << 30
#: Bytes of a memory-mapped item written before its pages are released (:meth:`BackgroundWriter.submit`).
MAPPED_CHUNK = 32 * 2**20

_WRITERS: "weakref.WeakSet[BackgroundWriter]" = weakref.WeakSet()


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """``os.pwrite`` until every byte of ``view`` is at ``offset`` (pwrite may write less)."""
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:done + _CHUNK], offset + done)


class BackgroundWriter:
    """Queue of ``(bytes, offset)`` writes to an open file descriptor, done by one daemon thread.

    Parameters
    ----------
    fd : int
        Open for writing; the caller closes it after :meth:`close` or :meth:`abandon`.
    limit : int
        Bytes in flight before :meth:`submit` waits.
    """

    def __init__(self, fd: int, *, limit: int = DEFAULT_LIMIT, path: str | os.PathLike | None = None) -> None:
        self.fd = fd
        self.limit = int(limit)
        self.path = path
        self._reset()
        _WRITERS.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cv = threading.Condition()
        self._queue: deque[tuple[memoryview, int, Callable[[], None] | None]] = deque()
        self._inflight = 0
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None

    def _mine(self) -> None:
        if self._pid != os.getpid():  # a forked child: its own queue and thread
            self._reset()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, view: memoryview, offset: int, release: Callable[[], None] | None = None) -> None:
        """Write ``view`` (bytes; kept alive until written) at ``offset``, in the background.

        ``release``: ``view`` is a view of a memory-mapped file (no memory of its own); it goes in chunks of
        :data:`MAPPED_CHUNK`, not counted in the bytes in flight (this call does not wait for them), and
        ``release()`` runs on the writer's thread after each chunk (e.g. the map's pages dropped).

        Raises
        ------
        OutputWriteError
            A previous background write failed (a :class:`ConverterError` and an ``OSError``).
        """
        self._mine()
        n = view.nbytes
        if n == 0:
            return
        with self._cv:
            self._raise()
            if release is None:
                while self._inflight and self._inflight + n > self.limit and self._error is None:
                    self._cv.wait()
                self._raise()
                self._queue.append((view, offset, None))
                self._inflight += n
            else:
                for start in range(0, n, MAPPED_CHUNK):
                    self._queue.append((view[start:start + MAPPED_CHUNK], offset + start, release))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qckpt-pwrite", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if not self._queue:
                    return
                view, offset, release = self._queue[0]
            try:
                pwrite_all(self.fd, view, offset)
                start_writeback(self.fd, offset, view.nbytes)  # the disk starts now; fsync waits for little
                if release is not None:
                    release()
            except BaseException as exc:  # noqa: BLE001 - handed to the submitting thread
                err = exc
                if isinstance(exc, OSError):  # one of qckpt's errors, naming the file (CLI: no traceback)
                    err = OutputWriteError("cannot write the output", file=self.path,
                                           field=f"{view.nbytes} bytes at offset {offset}",
                                           expected="all bytes written", found=exc.strerror or str(exc),
                                           hint="check free disk space")
                    err.errno = err._errno = exc.errno  # (_errno survives the trip from a worker)
                with self._cv:
                    self._error = err
                    self._queue.clear()
                    self._inflight = 0
                    self._cv.notify_all()
                return
            with self._cv:
                self._queue.popleft()
                if release is None:
                    self._inflight -= view.nbytes
                self._cv.notify_all()

    def drain(self) -> None:
        """Wait until every submitted write is done.

        Raises
        ------
        OutputWriteError
            A background write failed (a :class:`ConverterError` and an ``OSError``).
        """
        self._mine()
        with self._cv:
            while self._queue and self._error is None:
                self._cv.wait()
            self._raise()

    def _stop_thread(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        t = self._thread
        # a thread interrupted (Ctrl-C) between its creation and its start was never started
        if t is not None and t is not threading.current_thread() and t.ident is not None:
            t.join()
        with self._cv:
            self._thread = None
            self._stop = False  # a later submit starts a new thread

    def close(self) -> None:
        """:meth:`drain`, then stop the thread (the descriptor stays open)."""
        try:
            self.drain()
        finally:
            self._stop_thread()

    def abandon(self) -> None:
        """Drop the writes not started, wait for the one in progress, stop the thread (on abort:
        the descriptor may be closed afterwards)."""
        if self._pid != os.getpid():
            return
        with self._cv:
            while len(self._queue) > 1:
                self._queue.pop()
        self._stop_thread()


def pause_threads() -> None:
    """Drain every writer of this process and stop its thread (the next submit starts a new one).

    Called before worker processes are forked (:mod:`converter.write.engine`): a thread does not
    survive ``fork``, and one holding a lock at that moment would leave it held in the child.
    """
    pid = os.getpid()
    for w in list(_WRITERS):
        if w._pid == pid and w._thread is not None:
            w.close()


def drain_process() -> None:
    """Drain every writer this process has used (a worker, before it reports a task done)."""
    pid = os.getpid()
    for w in list(_WRITERS):
        if w._pid == pid:
            w.drain()
