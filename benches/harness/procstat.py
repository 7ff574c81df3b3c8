"""What the harness reads from /proc about a server under test, and the CPU wake-up latency hold.

CPU time is user + system from /proc/PID/stat (fields 14 and 15, in clock ticks) summed over
every process of the server (nginx's master and worker, a single process for the others; a
process's own line already includes all of its threads). Resident memory is VmRSS from
/proc/PID/status, summed the same way and sampled every 50 ms during a run for the peak; the
kernel's own peak per process (VmHWM) is read the same way.

`hold_cpu_dma_latency` keeps /dev/cpu_dma_latency at 0 for the life of the process: with it the
idle CPUs of these small virtual machines stop entering deep halt states, and cross-CPU wake-ups
(load generator on one CPU, server on the other) stop dominating the numbers.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Direct and indirect children of `pid` (nginx's workers), found by scanning /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    return [pid, *children(pid)]


def start_time(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/PID/stat), which tells a recycled pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def cpu_split(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds consumed so far by `pids` (processes that are gone count 0).
    The system part is the kernel working for the server (sockets, TCP, copies): on loopback
    it is most of a small request's cost, and no user-space change can take it away."""
    user = system = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        user += int(fields[11])  # utime
        system += int(fields[12])  # stime
    return user / CLK_TCK, system / CLK_TCK


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds consumed so far by `pids`."""
    return sum(cpu_split(pids))


def status_kib(pids: list[int], name: str) -> int:
    """A memory field of /proc/PID/status (`VmRSS`, `VmHWM`), in KiB, summed over `pids`."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(f"{name}:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def rss_kib(pids: list[int]) -> int:
    """Summed VmRSS of `pids`, in KiB."""
    return status_kib(pids, "VmRSS")


def hwm_kib(pids: list[int]) -> int:
    """Summed VmHWM (each process's peak RSS since it started) of `pids`, in KiB. The kernel
    keeps it exactly, so no peak between two samples is missed; summed over processes it can
    exceed the largest total ever resident at once (nginx's master peaks at start-up, its
    worker under load)."""
    return status_kib(pids, "VmHWM")


class RssSampler:
    """Samples the summed RSS of `pids` in a thread until `stop()`; `peak` is the largest seen."""

    def __init__(self, pids: list[int], interval: float = 0.05) -> None:
        self.pids = pids
        self.interval = interval
        self.peak = rss_kib(pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_kib(self.pids))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_kib(self.pids))


def hold_cpu_dma_latency() -> int | None:
    """Opens /dev/cpu_dma_latency and writes a 32-bit 0; the request lasts while the file is
    open, so the descriptor is returned and must be kept. None when the device is unavailable
    (not root, or no such device): the run goes on, noisier."""
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
        os.write(fd, struct.pack("i", 0))
        return fd
    except OSError:
        return None
