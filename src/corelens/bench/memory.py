"""Process memory measurement for benchmarks: peak RSS sampled by a background thread.

"Peak" here means activation memory: the largest increase of the process's resident set size (RSS) over
its value just before the measured block (e.g. one forward pass), sampled from /proc/self/statm about
every millisecond. Memory that was already resident before the block (model weights, inputs, allocator
caches) does not count; a spike shorter than the sampling interval can be missed, and memory the
allocator reuses without growing the RSS is not seen.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from types import TracebackType

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM = "/proc/self/statm"
MB = 1 << 20


def rss_bytes() -> int:
    """Return the current resident set size of this process in bytes (0 where /proc is unavailable)."""
    try:
        with open(_STATM, "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def max_rss_mb() -> float:
    """Return the process's lifetime peak RSS (`ru_maxrss`) in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


class PeakRSS:
    """Context manager measuring the peak RSS increase over the RSS at entry (activation memory, MiB).

    A daemon thread reads /proc/self/statm every `interval` seconds while the block runs; `peak_mb` is
    max(RSS during the block) - RSS at entry, `baseline_mb` the RSS at entry and `peak_rss_mb` the absolute
    peak. The statm file is kept open and re-read from offset 0, so one sample costs a few microseconds.
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.baseline = 0
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            f = open(_STATM, "rb", buffering=0)  # noqa: SIM115 - held open for the sampler's lifetime
        except OSError:
            return
        with f:
            while not self._stop.is_set():
                f.seek(0)
                rss = int(f.read().split()[1]) * _PAGE
                self.samples += 1
                if rss > self.peak:
                    self.peak = rss
                time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="PeakRSS", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def peak_mb(self) -> float:
        """Return the peak RSS increase over the RSS at entry, in MiB."""
        return (self.peak - self.baseline) / MB

    @property
    def baseline_mb(self) -> float:
        """Return the RSS at entry, in MiB."""
        return self.baseline / MB

    @property
    def peak_rss_mb(self) -> float:
        """Return the absolute peak RSS seen during the block, in MiB."""
        return self.peak / MB
