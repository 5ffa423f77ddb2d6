"""Progress of long calls: tqdm bars where tqdm is installed (``tqdm.auto``: a widget in a
notebook, text in a terminal), plain lines on stderr otherwise; images the engine skips
become :class:`SkippedImageWarning` warnings; the engine's other notes go to the
``craterdex`` logger (level INFO)."""

from __future__ import annotations

import logging
import sys
import time
import warnings
from typing import Any, List, Optional, Tuple

__all__ = ["SkippedImageWarning", "Reporter"]

_log = logging.getLogger("craterdex")


class SkippedImageWarning(UserWarning):
    """An image craterdex could not use and left out (the message names it and why)."""


def _tqdm():
    try:
        from tqdm.auto import tqdm  # type: ignore[import-not-found]
    except Exception:  # not installed, or a notebook without widgets
        return None
    return tqdm


class _PlainBar:
    """A line on stderr at most every two seconds, and at the end: done/total, rate, ETA."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.n = what, total, 0
        self.t0 = self.last = time.monotonic()

    def update_to(self, done: int) -> None:
        self.n = done
        now = time.monotonic()
        if now - self.last >= 2.0:
            self.last = now
            self._line(now)

    def close(self) -> None:
        self._line(time.monotonic(), end=True)

    def _line(self, now: float, end: bool = False) -> None:
        elapsed = max(now - self.t0, 1e-9)
        rate = self.n / elapsed
        left = (self.total - self.n) / rate if rate > 0 and not end else 0.0
        tail = f"{elapsed:.0f} s" if end else f"ETA {left:.0f} s"
        print(f"{self.what}: {self.n}/{self.total} ({rate:.1f}/s, {tail})", file=sys.stderr, flush=True)


class Reporter:
    """What a long call hands the engine as ``progress``: bars when ``show`` (tqdm, else plain
    lines), every skipped image kept for :meth:`warn_skipped`, notes logged."""

    def __init__(self, show: bool = True):
        self.show = show
        self.skipped: List[Tuple[str, str]] = []
        self._bar: Optional[Any] = None
        self._tqdm = _tqdm() if show else None

    def __call__(self, event: str, *args: Any) -> None:
        if event == "skipped":
            self.skipped.append((str(args[0]), str(args[1])))
        elif event == "note":
            _log.info("%s", args[0])
        elif not self.show:
            return
        elif event == "start":
            self._close()
            what, total = str(args[0]), int(args[1])
            if self._tqdm is not None:
                self._bar = self._tqdm(total=total, desc=what, unit="img", file=sys.stderr)
            else:
                self._bar = _PlainBar(what, total)
        elif event == "advance" and self._bar is not None:
            done = int(args[0])
            if self._tqdm is not None:
                self._bar.update(done - self._bar.n)
            else:
                self._bar.update_to(done)
        elif event == "finish":
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def warn_skipped(self, stacklevel: int = 3) -> None:
        """One warning per skipped image, attributed to the caller's caller's line."""
        self._close()
        for path, reason in self.skipped:
            warnings.warn(f"{path}: {reason}; skipped", SkippedImageWarning, stacklevel=stacklevel)
        self.skipped.clear()
