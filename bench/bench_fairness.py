"""Fairness: one chat-only run streaming at full speed must not stall the loop for anyone else.

    python bench/bench_fairness.py [--deltas 20000] [--rounds 20]

A real `agent-gateway serve` (SQLite, default config) with the chat-only runtime, pointed at an
upstream in its own process that answers every chat completion with the model's count of deltas
(`n20000`, `n3`) written in one go, as fast as the socket takes (`n50p10`: 50 deltas 10 ms apart,
as a model paces them; `hang`: headers, then nothing),
on a connection it keeps alive as real upstreams do (`--upstream-closes`: it closes each one).
One SSE client (its own process) reads the fast run. Alternating, in each round:

- idle: the same probes with nothing running (the latency baselines: health, and a new run's
  time to first event, which is also issue point 2's figure: a client attaching at once);
- alone: the fast run with no probes (the throughput baseline);
- probed: the fast run while this process probes `GET /v1/health`, pausing `--pace-ms` (10)
  between probes, and times the first event of one second run's client, started at a random
  moment of the fast run's first 110 ms: `POST /v1/runs` then `GET .../stream` in even rounds,
  the one round trip `POST /v1/runs` with `Accept: text/event-stream` in odd ones. That is the
  issue's goal as it reads (one run streaming; health probes and a second run's client).

Heavier loads: `--ttfe-every N` replaces the second run with a pair of first-event probes (both
kinds, two runs) every Nth probe (`--ttfe-every 10 --pace-ms 5`: about 30 new runs and 300
requests a second while the fast run streams; `--ttfe-every 3 --pace-ms 0`: probes back to back).

Beside each health probe, the same request to a bare asyncio responder in its own process (the
floor): what the machine itself adds to a request while the fast run keeps its cores busy.
`--ttfe-burst N` ends with N time-to-first-event probes back to back (5 ms apart) with nothing
else running, alternating the two kinds: each overlaps the previous run's end.

Throughput is the fast run's deltas over the span between its first and last delta's `createdAt`,
against two baselines: the alone runs, and (the same run's) its rate in the milliseconds no probe
touched, from a probe's start to QUIET_GUARD_MS after its end.
The busy figures hold every probe taken until the fast run's client has read it all; the
streaming figures only those that ended inside that span.
Each round also times a bare reader taking the same answer straight from the upstream (one raw
socket, no parsing): the fixture's own rate, printed beside the gateway's, which must stay well
below it for the ratio to measure the gateway.
Each round also reads the gateway loop's clock (`LoopClock`: its thread's CPU time and its wait
for a CPU, from the kernel): where the probed run's rate went, against the alone run's. The probes
take their own CPU of the loop (timed at rest in each round, `_calibrate`), the machine may keep
the loop off a core, and the rest is the fast run's; `fair` is its rate over what it would have
made in the loop time left to it at its CPU cost per delta alone (`_loop_shares`).
This process collects its own garbage only between phases (a full collection here took up to
13 ms, which a probe it landed in would have counted as the gateway's).
Prints one JSON line per scenario and the p50/p99 figures as same-run ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, ROOT, Clients, load, median, percentile

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"xxxxxxxxxxxxxxxx"}}]}\n\n'
TAIL = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
ONE_CALL = True  # --no-one-call: a gateway without create-and-stream
KEEP_ALIVE = True  # --upstream-closes: the upstream closes the connection after each answer
PROBE_KEYS = ("health", "live", "floor", "ttfe_two_calls", "ttfe_one_call")
TTFE_EVERY = 0  # --ttfe-every: a pair of first-event probes per this many probes (0: one second run a round)
IDLE_TTFE_EVERY = 10  # at idle without --ttfe-every: a pair of first-event probes per this many probes
SECOND_RUN_WITHIN = (0.010, 0.110)  # seconds after the fast run's start: when its second run starts
PACE = 0.010  # --pace-ms: the pause between two probes
# The answer a model name asks for: `n<count>` deltas at once, `n<count>p<ms>` each <ms> apart.
MODEL = re.compile(rb'"model":\s*"n([0-9]+)(?:p([0-9]+))?"')
CLOCK_EVERY = 0.002  # seconds between two readings of the gateway loop's clock


class LoopClock:
    """The gateway's loop thread (its main thread) as the kernel accounts it: nanoseconds on a
    CPU and waiting for one (`/proc/<pid>/task/<pid>/schedstat`, exact, not clock ticks), read
    every CLOCK_EVERY on a thread of this process, so the figures of any wall-clock span can be
    read off afterwards. The rest of a span the loop slept: nothing to do, or waiting for the GIL
    or a lock its own workers held."""

    def __init__(self, pid: int) -> None:
        self.path = f"/proc/{pid}/task/{pid}/schedstat"
        self.readings: list[tuple[float, int, int]] = []  # (time.time(), on CPU ns, waiting ns)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read_until_stopped, daemon=True)

    def read(self) -> tuple[float, int, int]:
        with open(self.path) as file:
            on_cpu, waiting = file.read().split()[:2]
        return time.time(), int(on_cpu), int(waiting)

    def _read_until_stopped(self) -> None:
        while not self._stop.wait(CLOCK_EVERY):
            self.readings.append(self.read())

    def __enter__(self) -> LoopClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _at(self, when: float) -> tuple[float, float]:
        """CPU and wait seconds at `when`, interpolated between the two readings around it."""
        readings = self.readings
        index = bisect.bisect_left(readings, (when,))
        if index == 0 or index >= len(readings):
            raise RuntimeError("the loop clock has no reading around that time")
        (t0, cpu0, wait0), (t1, cpu1, wait1) = readings[index - 1], readings[index]
        share = (when - t0) / (t1 - t0) if t1 > t0 else 0.0
        return (cpu0 + (cpu1 - cpu0) * share) / 1e9, (wait0 + (wait1 - wait0) * share) / 1e9

    def span(self, first_ms: int, last_ms: int) -> dict[str, float]:
        """The loop's shares of a span (ms of wall-clock time): on a CPU, waiting for one."""
        (cpu0, wait0), (cpu1, wait1) = self._at(first_ms / 1000), self._at(last_ms / 1000)
        seconds = max(last_ms - first_ms, 1) / 1000
        return {"seconds": seconds, "cpu": (cpu1 - cpu0) / seconds, "wait": (wait1 - wait0) / seconds}


# -- the upstream (its own process) ---------------------------------------------------------------
async def _upstream_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request on a connection kept alive, as real upstreams do (`KEEP_ALIVE`;
    otherwise each answer closes its connection, and each run opens one)."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*([0-9]+)", head).group(1))  # type: ignore[union-attr]
            body = await reader.readexactly(length)
            if b'"model": "hang"' in body or b'"model":"hang"' in body:  # answers nothing until the client leaves
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                await reader.read()
                return
            found = MODEL.search(body)
            count = int(found.group(1)) if found else 3
            gap = int(found.group(2)) / 1000 if found and found.group(2) else 0.0
            answer = CHUNK * count + TAIL
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            head += b"Content-Length: %d\r\n\r\n" % len(answer) if KEEP_ALIVE else b"Connection: close\r\n\r\n"
            if gap:
                writer.write(head)
                for _ in range(count):
                    await asyncio.sleep(gap)  # a model's pace between two deltas
                    writer.write(CHUNK)
                writer.write(TAIL)
            else:
                writer.write(head + answer)
            await writer.drain()  # as fast as the socket takes
            if not KEEP_ALIVE:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(handle: Any, path: str = "") -> None:
    """Serve `handle` on a free loopback port (the upstream, the floor) and print the URL."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{path}", flush=True)
    async with server:
        await server.serve_forever()


# -- the floor (its own process): answers every request at once --------------------------------------
async def _floor_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


# -- the measurements -------------------------------------------------------------------------------
def _run_body(model: str) -> dict[str, Any]:
    return {
        "requestId": os.urandom(8).hex(),
        "agentId": "chat-only",
        "sessionId": os.urandom(6).hex(),
        "message": "go",
        "options": {"model": model},
    }


async def _health(http: aiohttp.ClientSession, url: str, probe: str = "ready") -> float:
    start = time.perf_counter()
    async with http.get(url + "/v1/health?probe=" + probe) as response:
        await response.read()
    return (time.perf_counter() - start) * 1000


FLOOR: list[str] = []  # the floor responder's URL


async def _first_event(http: aiohttp.ClientSession, url: str, one_call: bool) -> float:
    """Milliseconds from sending `POST /v1/runs` to the first event's bytes on the client's stream."""
    start = time.perf_counter()
    if one_call:
        response = await http.post(url + "/v1/runs", json=_run_body("n3"), headers={"Accept": "text/event-stream"})
    else:
        async with http.post(url + "/v1/runs", json=_run_body("n3")) as created:
            run_id = (await created.json())["hostRunId"]
        response = await http.get(f"{url}/v1/runs/{run_id}/stream")
    try:
        async for line in response.content:
            if line.startswith(b"id:"):
                return (time.perf_counter() - start) * 1000
        raise RuntimeError("the stream ended with no event")
    finally:
        response.close()


def _sample(out: dict[str, list[float]], key: str, milliseconds: float) -> None:
    """Record a probe's latency, and (under "at:" + key) the wall-clock time it ended."""
    out[key].append(milliseconds)
    out.setdefault("at:" + key, []).append(time.time())


def _while_streaming(out: dict[str, list[float]], first_ms: int, last_ms: int) -> dict[str, list[float]]:
    """The samples of `out` whose probe ended between the fast run's first and last delta
    (`createdAt`): taken while it streamed, not while its client caught up afterwards."""
    during: dict[str, list[float]] = {}
    for key in PROBE_KEYS:
        ends = out.get("at:" + key, [])
        during[key] = [value for value, end in zip(out[key], ends, strict=True) if first_ms <= end * 1000 <= last_ms]
    return during


async def _probe(
    http: aiohttp.ClientSession,
    url: str,
    out: dict[str, list[float]],
    done: asyncio.Event | None,
    probes: int,
    ttfe_every: int = 0,
) -> None:
    """Probe `GET /v1/health` (readiness, then liveness) and, every `ttfe_every` probes (0: never),
    a new run's time to first event, both kinds, until `done` is set or after `probes` probes."""
    for index in range(probes):
        if done is not None and done.is_set():
            return
        began = time.time()
        if ttfe_every and index % ttfe_every == ttfe_every - 1:
            _sample(out, "ttfe_two_calls", await _first_event(http, url, one_call=False))
            if ONE_CALL:
                _sample(out, "ttfe_one_call", await _first_event(http, url, one_call=True))
        else:
            _sample(out, "floor", await _health(http, FLOOR[0]))
            _sample(out, "health", await _health(http, url))
            _sample(out, "live", await _health(http, url, "live"))
        out.setdefault("busy_spans", []).append((began, time.time()))
        await asyncio.sleep(PACE)  # probe pacing


CALIBRATION_PROBES = 40  # health probes that time the loop's CPU per probe (a quarter as many first-event rounds)


async def _second_run(http: aiohttp.ClientSession, url: str, out: dict[str, list[float]], number: int) -> None:
    """One second run while the fast run streams: its client's time to first event, started at a
    random moment of SECOND_RUN_WITHIN (the same ones for the same round), two calls in even
    rounds and one call in odd ones."""
    await asyncio.sleep(random.Random(number).uniform(*SECOND_RUN_WITHIN))  # a moment of the fast run
    one_call = ONE_CALL and number % 2 == 1
    began = time.time()
    _sample(out, "ttfe_one_call" if one_call else "ttfe_two_calls", await _first_event(http, url, one_call))
    out.setdefault("busy_spans", []).append((began, time.time()))


async def _runs_ended(http: aiohttp.ClientSession, url: str) -> None:
    """Wait (bounded) until the gateway's metrics show no active run."""
    for _ in range(400):
        async with http.get(url + "/metrics") as response:
            text = await response.text()
        lines = text.splitlines()
        if not sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("agent_gateway_runs_active{")):
            return
        await asyncio.sleep(0.005)  # polling pace
    raise RuntimeError("runs still active after 400 polls")


async def _calibrate(http: aiohttp.ClientSession, url: str, clock: LoopClock) -> dict[str, float]:
    """The loop's own CPU seconds per probe with nothing else running: a health probe (readiness
    or liveness), and a first-event probe round (a two-call and a one-call probe, with the runs
    they create, to their end): what the probes take of the loop while the fast run streams."""
    cpu0 = clock.read()[1]
    for _ in range(CALIBRATION_PROBES // 2):
        await _health(http, url)
        await _health(http, url, "live")
    cpu1 = clock.read()[1]
    rounds = CALIBRATION_PROBES // 4
    for _ in range(rounds):
        await _first_event(http, url, one_call=False)
        if ONE_CALL:
            await _first_event(http, url, one_call=True)
        await asyncio.sleep(PACE)  # probe pacing
    await _runs_ended(http, url)
    cpu2 = clock.read()[1]
    return {"health": (cpu1 - cpu0) / 1e9 / CALIBRATION_PROBES, "ttfe_round": (cpu2 - cpu1) / 1e9 / rounds}


def _loop_shares(
    alone: dict[str, Any], probed: dict[str, Any], per_probe: dict[str, float], deltas: int
) -> dict[str, float]:
    """Where the fast run's rate went, from the loop's clock over each run's delta span. The
    probes' own share of the loop is their count in the span times their CPU at rest; the rest
    of the loop's CPU is the fast run's. `fair` is the probed rate over the rate it would have
    had with its CPU per delta alone and all the loop time the probes and the machine left it
    (less any sleep the probes added, more sleep is the gateway's): the goal's 10 % reads there."""
    streaming = probed["streaming"]
    ttfe_rounds = len(streaming["ttfe_two_calls"]) + len(streaming["ttfe_one_call"])
    ttfe_rounds /= 2 if ONE_CALL else 1
    span = probed["loop"]["seconds"]
    share = (len(streaming["health"]) + len(streaming["live"])) * per_probe["health"] / span
    share += ttfe_rounds * per_probe["ttfe_round"] / span
    cpu_alone, cpu_probed = alone["loop"]["cpu"], probed["loop"]["cpu"]
    sleep_alone = 1 - cpu_alone - alone["loop"]["wait"]
    sleep_probed = 1 - cpu_probed - probed["loop"]["wait"]
    cost_alone = cpu_alone * alone["loop"]["seconds"] / deltas  # loop CPU seconds per delta
    cost_probed = max(cpu_probed - share, 1e-9) * span / deltas
    left = cpu_probed - share + max(sleep_probed - sleep_alone, 0.0)  # the loop time left to it
    return {
        "probes_share": share,
        "cpu_alone": cpu_alone,
        "cpu_probed": cpu_probed,
        "wait_alone": alone["loop"]["wait"],
        "wait_probed": probed["loop"]["wait"],
        "sleep_alone": sleep_alone,
        "sleep_probed": sleep_probed,
        "us_per_delta_alone": cost_alone * 1e6,
        "us_per_delta_probed": cost_probed * 1e6,
        "fair": probed["rate"] * cost_alone / max(left, 1e-9),
    }


async def _fast_run(
    http: aiohttp.ClientSession, url: str, deltas: int, probe: bool, clock: LoopClock, number: int = 0
) -> dict[str, Any]:
    # The reader's process starts before the run: its interpreter's start-up (tens of ms of CPU on
    # a two-core machine) would otherwise land in the run's first probes.
    warm = await asyncio.to_thread(Clients.warm)
    async with http.post(url + "/v1/runs", json=_run_body(f"n{deltas}")) as created:
        run_id = (await created.json())["hostRunId"]
    out: dict[str, list[float]] = {"health": [], "live": [], "floor": [], "ttfe_two_calls": [], "ttfe_one_call": []}
    done = asyncio.Event()
    probers = []
    if probe:
        probers.append(asyncio.create_task(_probe(http, url, out, done, 100_000, TTFE_EVERY)))
        if not TTFE_EVERY:
            probers.append(asyncio.create_task(_second_run(http, url, out, number)))
    clients = await asyncio.to_thread(Clients, url, [{"run": run_id, "after": None}], warm=warm, mode="count")
    result = (await asyncio.to_thread(clients.results))[0]
    done.set()
    await asyncio.gather(*probers)
    created: list[int] = []  # each delta's createdAt (ms)
    after = 0
    while True:  # the delta span from the journal's timestamps
        async with http.get(f"{url}/v1/runs/{run_id}/events?afterSeq={after}&limit=5000") as page:
            body = await page.json()
        created += [event["createdAt"] for event in body["events"] if event["kind"] == "message.delta"]
        if not body["events"]:
            break
        after = int(body["nextCursor"])
    first, last = (created[0], created[-1]) if created else (0, 0)
    span = max(last - first, 1) / 1000
    streaming = _while_streaming(out, first, last)
    quiet = _quiet_rate(created, out.get("busy_spans", [])) if probe else None
    loop = clock.span(first, last)
    return {
        "events": result["events"],
        "rate": deltas / span,
        "quiet_rate": quiet,
        **out,
        "streaming": streaming,
        "loop": loop,
    }


# A probe's own work in the gateway goes on after its client has its answer (a new run's upstream
# call, its last events, storage): milliseconds after a probe that do not count as quiet.
QUIET_GUARD_MS = 20


def _quiet_rate(created: list[int], busy_spans: list[tuple[float, float]]) -> float | None:
    """The fast run's deltas per second in the milliseconds of its span that no probe touched
    (from a probe's start to QUIET_GUARD_MS after its end): its rate in the same run, on the
    same machine a moment apart, without the probes. None if no such millisecond had deltas."""
    if not created:
        return None
    first, last = created[0], created[-1]
    busy: set[int] = set()
    for start, end in busy_spans:
        busy.update(range(int(start * 1000), int(end * 1000) + QUIET_GUARD_MS + 1))
    quiet_ms = [ms for ms in range(first, last + 1) if ms not in busy]
    quiet_deltas = sum(1 for ms in created if ms not in busy)
    if not quiet_ms or not quiet_deltas:
        return None
    return quiet_deltas * 1000 / len(quiet_ms)


def _summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    return {"n": len(samples), "p50": round(percentile(samples, 50), 2), "p99": round(percentile(samples, 99), 2)}


async def _upstream_rate(base_url: str, deltas: int) -> float:
    """The fixture's own rate: deltas per second a bare reader gets straight from the upstream (one
    raw socket, no parsing), so the gateway's rate can be read against what its peer can give."""
    host, port = base_url.removeprefix("http://").split("/")[0].split(":")
    body = json.dumps({"model": f"n{deltas}", "stream": True}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        start = time.perf_counter()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        received = 0
        answer = deltas * len(CHUNK) + len(TAIL)  # (with its head: a kept-alive connection stays open)
        while received <= answer and (chunk := await reader.read(1 << 20)):
            received += len(chunk)
        seconds = time.perf_counter() - start
    finally:
        writer.close()
    if received < deltas * len(CHUNK):
        raise RuntimeError(f"the upstream sent {received} bytes for {deltas} deltas")
    return deltas / seconds


async def _burst(http: aiohttp.ClientSession, url: str, probes: int) -> dict[str, list[float]]:
    """Time-to-first-event probes back to back with nothing else running, alternating the kinds."""
    out: dict[str, list[float]] = {"ttfe_two_calls": [], "ttfe_one_call": []}
    for index in range(probes):
        one_call = ONE_CALL and index % 2 == 1
        out["ttfe_one_call" if one_call else "ttfe_two_calls"].append(await _first_event(http, url, one_call))
        await asyncio.sleep(0.005)  # probe pacing
    return out


async def _bench(url: str, upstream: str, deltas: int, rounds: int, burst: int, clock: LoopClock) -> None:
    idle: dict[str, list[float]] = {"health": [], "live": [], "floor": [], "ttfe_two_calls": [], "ttfe_one_call": []}
    alone: list[float] = []
    quiet_rates: list[float] = []  # the probed run's rate in its quiet milliseconds
    quiet_ratios: list[float] = []  # the probed run's rate over that, run by run
    upstream_rates: list[float] = []
    probed: dict[str, list[float]] = {
        "health": [], "live": [], "floor": [], "ttfe_two_calls": [], "ttfe_one_call": [], "rate": []
    }  # fmt: skip
    streaming: dict[str, list[float]] = {key: [] for key in PROBE_KEYS}  # between first and last delta
    loop_rounds: list[dict[str, float]] = []  # per round, where the fast run's rate went (`_loop_shares`)
    async with aiohttp.ClientSession(headers={"X-Agent-Gateway-Client": "bench"}) as http:
        await _fast_run(http, url, 200, probe=False, clock=clock)  # warm up
        gc.disable()  # collected between phases (`gc.collect()` below), never inside a probe
        gc.freeze()
        for number in range(rounds):
            # Nothing else running: the baselines.
            await _probe(http, url, idle, None, 60, TTFE_EVERY or IDLE_TTFE_EVERY)
            gc.collect()
            upstream_rates.append(await _upstream_rate(upstream, deltas))
            per_probe = await _calibrate(http, url, clock)
            gc.collect()
            alone_run = await _fast_run(http, url, deltas, probe=False, clock=clock)
            alone.append(alone_run["rate"])
            gc.collect()
            result = await _fast_run(http, url, deltas, probe=True, clock=clock, number=number)
            gc.collect()
            shares = _loop_shares(alone_run, result, per_probe, deltas)
            loop_rounds.append(shares)
            for key in PROBE_KEYS:
                probed[key] += result[key]
                streaming[key] += result["streaming"][key]
            probed["rate"].append(result["rate"])
            if result["quiet_rate"]:
                quiet_rates.append(result["quiet_rate"])
                quiet_ratios.append(result["rate"] / result["quiet_rate"])
            rates = {"upstream_rate": round(upstream_rates[-1]), "alone_rate": round(alone[-1])}
            print(json.dumps({"round": number, **rates, "loop": {k: round(v, 3) for k, v in shares.items()}, "probed": {
                "rate": round(result["rate"]),
                "quiet_rate": round(result["quiet_rate"] or 0),
                "health": _summary(result["health"]),
                "floor": _summary(result["floor"]),
                "live": _summary(result["live"]),
                "ttfe_two_calls": _summary(result["ttfe_two_calls"]),
                "ttfe_one_call": _summary(result["ttfe_one_call"]),
            }}), flush=True)  # fmt: skip
        bursts = await _burst(http, url, burst) if burst else None
        async with http.get(url + "/metrics") as response:
            metrics = (await response.text()).splitlines()
    alone_rate = sorted(alone)[len(alone) // 2]
    upstream_rate = sorted(upstream_rates)[len(upstream_rates) // 2]
    probed_rate = sorted(probed["rate"])[len(probed["rate"]) // 2]
    report = {
        "deltas": deltas,
        "rounds": rounds,
        "pace_ms": PACE * 1000,
        "ttfe_every": TTFE_EVERY,
        "load": load(),
        "idle_health_ms": _summary(idle["health"]),
        "busy_health_ms": _summary(probed["health"]),
        "busy_live_ms": _summary(probed["live"]),
        # The same request to a bare responder in its own process: what the machine adds.
        "idle_floor_ms": _summary(idle["floor"]),
        "busy_floor_ms": _summary(probed["floor"]),
        "busy_health_p99_over_idle_p99": round(percentile(probed["health"], 99) / percentile(idle["health"], 99), 2),
        "idle_ttfe_two_calls_ms": _summary(idle["ttfe_two_calls"]),
        "idle_ttfe_one_call_ms": _summary(idle["ttfe_one_call"]) if ONE_CALL else None,
        "ttfe_two_calls_ms": _summary(probed["ttfe_two_calls"]),
        "ttfe_one_call_ms": _summary(probed["ttfe_one_call"]),
        # Only the probes that ended while the fast run's deltas were being created (the busy
        # figures above also hold those taken while its client caught up afterwards).
        "streaming_health_ms": _summary(streaming["health"]),
        "streaming_floor_ms": _summary(streaming["floor"]),
        "streaming_ttfe_two_calls_ms": _summary(streaming["ttfe_two_calls"]),
        "streaming_ttfe_one_call_ms": _summary(streaming["ttfe_one_call"]),
        "burst_ttfe_two_calls_ms": _summary(bursts["ttfe_two_calls"]) if bursts else None,
        "burst_ttfe_one_call_ms": _summary(bursts["ttfe_one_call"]) if bursts and ONE_CALL else None,
        # The fixture must be faster than the gateway, or the throughput ratio measures the fixture.
        "upstream_rate_bare_reader": round(upstream_rate),
        "fast_run_rate_alone": round(alone_rate),
        "fast_run_alone_over_upstream": round(alone_rate / upstream_rate, 3),
        "fast_run_rate_probed": round(probed_rate),
        "probed_over_alone_rate": round(probed_rate / alone_rate, 3),
        # The same-run baseline: each probed run's rate over its own rate in the milliseconds no
        # probe touched (median of the runs). Machine drift between two runs does not enter it.
        "fast_run_quiet_rate": round(sorted(quiet_rates)[len(quiet_rates) // 2]) if quiet_rates else None,
        "probed_over_quiet_rate": round(sorted(quiet_ratios)[len(quiet_ratios) // 2], 3) if quiet_ratios else None,
        "quiet_guard_ms": QUIET_GUARD_MS,
        # The loop's clock (`_loop_shares`), medians of the rounds: the probes' own share of the
        # loop, its shares on a CPU, waiting for one and asleep, the fast run's loop CPU per delta,
        # and its rate over the rate it would have had in the loop time left to it.
        "loop": {key: round(median([r[key] for r in loop_rounds]), 3) for key in loop_rounds[0]},
    }
    report["loop_lag_buckets"] = [line.split("le=")[1] for line in metrics if "loop_lag_seconds_bucket" in line]
    print(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--switch", type=float, default=0.0, help="the gateway's GIL switch interval, seconds")
    parser.add_argument("--no-one-call", action="store_true", help="skip the create-and-stream probe")
    parser.add_argument(
        "--ttfe-every", type=int, default=0, help="a pair of first-event probes every N probes (0: one second run)"
    )
    parser.add_argument("--ttfe-burst", type=int, default=0, help="end with N back-to-back first-event probes")
    parser.add_argument("--pace-ms", type=float, default=10.0, help="the pause between two probes, ms")
    parser.add_argument(
        "--upstream-closes", action="store_true", help="the upstream closes each connection after its answer"
    )
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global ONE_CALL, TTFE_EVERY, PACE, KEEP_ALIVE
    ONE_CALL = not args.no_one_call
    KEEP_ALIVE = not args.upstream_closes
    TTFE_EVERY = max(args.ttfe_every, 0)
    PACE = max(args.pace_ms, 0.0) / 1000
    if args.upstream:
        asyncio.run(_serve(_upstream_connection, "/v1"))
        return
    if args.floor:
        asyncio.run(_serve(_floor_connection))
        return
    closes = ["--upstream-closes"] if args.upstream_closes else []
    upstream_command = [sys.executable, __file__, "--upstream", *closes]
    upstream = subprocess.Popen(upstream_command, stdout=subprocess.PIPE, text=True, env=ENV)
    floor = subprocess.Popen([sys.executable, __file__, "--floor"], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert upstream.stdout is not None and floor.stdout is not None
        base_url = upstream.stdout.readline().strip()
        FLOOR.append(floor.stdout.readline().strip())
        with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryFile("w+") as log:
            env = {**ENV, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "", "OPENAI_MODEL": "n3"}
            command = [sys.executable, "-m", "agent_gateway", "serve", "--port", "0", "--data-dir", data_dir]
            if args.switch:  # an experiment: the GIL switch interval (Python's default is 0.005 s)
                serve = "import sys; from agent_gateway.cli import main; sys.setswitchinterval(float(sys.argv[1]));"
                serve += " sys.argv[1:2] = []; main()"
                command = [sys.executable, "-c", serve, str(args.switch), *command[3:]]
            gateway = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env)
            try:
                assert gateway.stdout is not None
                line = gateway.stdout.readline()
                found = re.search(r"listening on (\S+)", line)
                if not found:
                    raise RuntimeError(f"the gateway did not start: {line!r}")
                with LoopClock(gateway.pid) as clock:
                    asyncio.run(_bench(found.group(1), base_url, args.deltas, args.rounds, args.ttfe_burst, clock))
            finally:
                gateway.terminate()
                gateway.wait(timeout=30)
                log.seek(0)
                lags = [line for line in log if "event loop blocked" in line]
                print(f"{len(lags)} loop-lag warning line(s) from the gateway", *lags[-5:], sep="\n")
    finally:
        for process in (upstream, floor):
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    main()
