"""Slow clients for the `slow` cell of conns.py: N connections that each send half a request
head and then wait, as a slowloris attack does, until the server closes them or a deadline.

One asyncio loop in the harness's own process (pinned to the load CPU) drives them all, with
protocol objects rather than streams so that 10,000 clients fit in one core and a few dozen
MiB. Connections are opened with a bound on how many are in flight: a burst of 10,000 SYNs
overflows a listen backlog of 1,024, and the retransmitted ones would arrive a second later,
after the first clients' clocks had started.

Each client's clock starts when its half head is written; the server's header timeout starts
at the same moment (the gateway: at the head's first byte) or a little before it (nginx: at
accept), so a server that keeps its timeout closes every client within the timeout plus its
timer's slack.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, field

# A request line and the first header fields, without the blank line that ends the head.
HALF_HEAD = b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow-client\r\nAccept: "


@dataclass
class SlowResult:
    """What the slow clients saw."""

    connected: int = 0
    errors: int = 0  # connections that could not be opened
    peak_open: int = 0  # most connections open at once
    closed_in_time: int = 0  # closed by the server within the limit
    closed_late: int = 0  # closed by the server after the limit, before the deadline
    open_at_end: int = 0  # still open at the deadline (then closed by the client)
    answered: int = 0  # got bytes before the close (a 408, say)
    close_p50_s: float | None = None
    close_max_s: float | None = None


@dataclass
class Tally:
    """Counters shared by the clients of one run."""

    open: int = 0
    peak_open: int = 0
    closes: list[float] = field(default_factory=list)  # seconds from the write to the close


class HalfHead(asyncio.Protocol):
    """One client: writes the half head on connect, then only notes what the server does."""

    def __init__(self, tally: Tally, loop: asyncio.AbstractEventLoop) -> None:
        self.tally = tally
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.sent_at = 0.0
        self.answered = False
        self.closed_by_us = False
        self.done = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(HALF_HEAD)
        self.sent_at = self.loop.time()
        self.tally.open += 1
        self.tally.peak_open = max(self.tally.peak_open, self.tally.open)

    def data_received(self, data: bytes) -> None:
        self.answered = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.tally.open -= 1
        if not self.closed_by_us:
            self.tally.closes.append(self.loop.time() - self.sent_at)
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        self.closed_by_us = True
        if self.transport is not None:
            self.transport.abort()


def summarize(
    closes: list[float], limit: float, connected: int, errors: int, peak_open: int, answered: int
) -> SlowResult:
    """The result from the close times (seconds from each client's write to the server's
    close); `limit` is the header timeout plus the slack allowed to the server's timer."""
    in_time = sum(1 for t in closes if t <= limit)
    return SlowResult(
        connected=connected,
        errors=errors,
        peak_open=peak_open,
        closed_in_time=in_time,
        closed_late=len(closes) - in_time,
        open_at_end=connected - len(closes),
        answered=answered,
        close_p50_s=round(statistics.median(closes), 3) if closes else None,
        close_max_s=round(max(closes), 3) if closes else None,
    )


async def _open(
    host: str, port: int, tally: Tally, in_flight: asyncio.Semaphore
) -> HalfHead | None:
    loop = asyncio.get_running_loop()
    async with in_flight:
        try:
            _, proto = await loop.create_connection(lambda: HalfHead(tally, loop), host, port)
        except OSError:
            return None
    return proto


async def _run(
    host: str, port: int, conns: int, timeout: float, slack: float, in_flight: int
) -> SlowResult:
    tally = Tally()
    sem = asyncio.Semaphore(in_flight)
    opened = await asyncio.gather(*(_open(host, port, tally, sem) for _ in range(conns)))
    clients = [c for c in opened if c is not None]
    # The last client connected just now: give it the whole timeout and the slack, and a
    # little more so that a late close is seen as late rather than as never.
    pending = [c.done for c in clients if not c.done.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout + 2 * slack)
    for c in clients:
        if not c.done.done():
            c.close()
    await asyncio.sleep(0)  # the aborted transports' callbacks run before the loop closes
    answered = sum(1 for c in clients if c.answered)
    return summarize(
        tally.closes, timeout + slack, len(clients), conns - len(clients), tally.peak_open, answered
    )


def run(
    host: str, port: int, conns: int, timeout: float, slack: float, in_flight: int = 256
) -> SlowResult:
    """Opens `conns` slow clients to host:port and waits for the server to close them
    (at most the timeout plus twice the slack after the last one connected)."""
    return asyncio.run(_run(host, port, conns, timeout, slack, in_flight))
