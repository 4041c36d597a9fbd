"""`marl-runner bench --external`: `marl-runner serve` answering clients in other processes.

The setting a user meets: `marl-runner serve examples/configs/serve_drones.yaml`
(remote inference over loopback, 32 episode slots, observation filter and
frame stacking) in its own process, and client processes of 8 or 16 threads,
each thread playing 50-step episodes of 4 drones with `PolicyClient`
(`get_action`, then `log_returns`; `end_episode`: one request per step, the
rewards riding on the next call). Reported at 16 and 64
clients: `get_action` calls per second, their p50 and p99 latency as the
client sees it, errors, and the episodes the clients finished against those
the server wrote to `--out`. Also the wire codec: encode + decode of one
request, safe binary framing vs JSON.

A client process is this module run as `python -m marl_runner.bench.external
--client ADDRESS THREADS START END SEED`; it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from marl_runner.serving import codec
from marl_runner.serving.validation import to_space

REPO = Path(__file__).resolve().parents[2]  # the checkout: these modes serve its examples/
CONFIG = REPO / "examples" / "configs" / "serve_drones.yaml"
NUM_AGENTS = 4
OBS_DIM = 8
EPISODE_LEN = 50
# (clients, processes): 8 threads per process at 16 clients, 16 at 64.
SETTINGS = ((16, 2), (64, 4))
# Client processes import numpy and the client, then wait for the common start.
START_DELAY_S = 3.0
# This bench on the stack the aiohttp server and libcurl client replaced (`http.server`
# with a hand-built worker pool, deadlines and limits; a hand-built client transport),
# on this project's 2-core machine: (clients, calls/s, p50 ms, p99 ms), shown for comparison.
HAND_BUILT_STACK = ((16, 745, 15.7, 33.4), (64, 960, 34.2, 69.4))


def _play(address: str, end: float, seed: int, out: dict[str, Any]) -> None:
    """One client thread: episodes until `end` (the last one played to its end); latencies,
    in ms, of the `get_action` calls answered by `end`."""
    from marl_runner.client import PolicyClient

    rng = np.random.default_rng(seed)
    agents = [f"drone_{i}" for i in range(NUM_AGENTS)]
    pool = rng.uniform(-1, 1, (64, NUM_AGENTS, OBS_DIM)).astype(np.float32)
    latencies, errors, episodes = out["latencies"], out["errors"], [0]
    with PolicyClient(address, timeout_s=30) as client:
        while time.time() < end:
            try:
                eid = client.start_episode()
                for t in range(EPISODE_LEN):
                    obs = dict(zip(agents, pool[(t * 7 + seed) % 64]))
                    started = time.perf_counter()
                    client.get_action(eid, obs)
                    if time.time() <= end:  # the window's calls; the episode still ends
                        latencies.append((time.perf_counter() - started) * 1000.0)
                    client.log_returns(eid, dict.fromkeys(agents, 1.0))
                client.end_episode(eid, dict(zip(agents, pool[seed % 64])))
                episodes[0] += 1
            except Exception as exc:  # counted, and the thread plays on
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
    out["episodes"] = episodes[0]


def client_process(address: str, threads: int, start: float, end: float, seed: int) -> dict:
    """`threads` client threads from `start` to `end` (wall clock); their merged results."""
    results = [{"latencies": [], "errors": []} for _ in range(threads)]
    time.sleep(max(0.0, start - time.time()))
    cpu = time.process_time()
    workers = [
        threading.Thread(target=_play, args=(address, end, seed * 1000 + i, results[i]))
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {
        "cpu_s": time.process_time() - cpu,
        "latencies": [x for r in results for x in r["latencies"]],
        "errors": [e for r in results for e in r["errors"]],
        "episodes": sum(r.get("episodes", 0) for r in results),
    }


def _start_server(out_dir: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "marl_runner.cli", "serve", str(CONFIG), "--port", "0",
         "--out", str(out_dir), "--progress-interval", "3600"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if found:
            return process, found.group(1)
    process.wait()
    raise RuntimeError("marl-runner serve did not start:\n" + "".join(lines))


def measure_served(num_clients: int, num_processes: int, duration_s: float) -> dict[str, Any]:
    """One `serve` process, `num_clients` threads over `num_processes` client processes."""
    from marl_runner.io import list_batch_files

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "out"
        server, address = _start_server(out_dir)
        try:
            start = time.time() + START_DELAY_S
            end = start + duration_s
            threads = num_clients // num_processes
            clients = [
                subprocess.Popen(
                    [sys.executable, "-m", "marl_runner.bench.external", "--client", address,
                     str(threads), repr(start), repr(end), str(i)],
                    cwd=REPO, stdout=subprocess.PIPE, text=True,
                    env={**os.environ, "PYTHONPATH": str(REPO)},
                )
                for i in range(num_processes)
            ]
            time.sleep(max(0.0, start - time.time()))
            server_cpu = _cpu_s(server.pid)
            parts = [json.loads(c.communicate(timeout=duration_s + 120)[0]) for c in clients]
            server_cpu = _cpu_s(server.pid) - server_cpu
        finally:
            server.send_signal(signal.SIGINT)
            output, _ = server.communicate(timeout=120)
        written = len(list_batch_files(out_dir)) if out_dir.exists() else 0
    latencies = np.array([x for p in parts for x in p["latencies"]])
    errors = [e for p in parts for e in p["errors"]]
    return {
        "clients": num_clients,
        "processes": num_processes,
        "calls_per_s": len(latencies) / duration_s,
        "p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        "p99_ms": float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
        "errors": len(errors),
        # CPU per get_action call (its log_returns and a share of episode starts and ends
        # included), over the window and the last episodes' ends.
        "server_cpu_us": server_cpu / max(len(latencies), 1) * 1e6,
        "client_cpu_us": sum(p["cpu_s"] for p in parts) / max(len(latencies), 1) * 1e6,
        "first_errors": errors[:3],
        "episodes_finished": sum(p["episodes"] for p in parts),
        "episodes_written": written,
        "server_exit": server.returncode,
        "server_tail": output[-2000:] if server.returncode else "",
    }


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure_codecs(repeats: int) -> list[dict[str, Any]]:
    """µs to encode a get_action request and decode it into arrays of the obs space."""
    rng = np.random.default_rng(0)
    cases = {
        f"{NUM_AGENTS} x 16 floats": gym.spaces.Box(-1, 1, (16,), np.float32),
        f"{NUM_AGENTS} x 84x84x3 uint8": gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
    }
    rows = []
    for name, space in cases.items():
        obs = {f"a{i}": space.sample() if space.dtype == np.uint8 else
               rng.uniform(-1, 1, space.shape).astype(np.float32) for i in range(NUM_AGENTS)}
        request = {"episode_id": "0" * 32, "obs": obs}
        row: dict[str, Any] = {"payload": name}
        for label, content_type in (("binary", codec.BINARY), ("json", codec.JSON)):
            body = codec.encode(request, content_type)
            started = time.perf_counter()
            for _ in range(repeats):
                value = codec.decode(codec.encode(request, content_type), content_type)
                {a: to_space(space, v, a) for a, v in value["obs"].items()}
            row[f"{label}_us"] = (time.perf_counter() - started) / repeats * 1e6
            row[f"{label}_bytes"] = len(body)
        rows.append(row)
    return rows


def external_benchmark(
    duration_s: float, smoke: bool, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Serving at 16 and 64 clients (1 s each with `smoke`), and the codec costs."""
    duration = 1.0 if smoke else duration_s
    served = []
    for num_clients, num_processes in SETTINGS:
        progress(f"external: marl-runner serve, {num_clients} clients in "
                 f"{num_processes} processes, {duration:g} s")
        served.append(measure_served(num_clients, num_processes, duration))
    return {"duration_s": duration, "served": served, "codec": measure_codecs(3 if smoke else 200)}


def print_external(console: Console, result: dict[str, Any]) -> None:
    """The serving table and the codec table."""
    table = Table(title=f"marl-runner serve {CONFIG.relative_to(REPO)}: remote inference over "
                  f"loopback, {EPISODE_LEN}-step episodes of {NUM_AGENTS} drones, "
                  f"{result['duration_s']:g} s")
    for column in ("clients", "processes", "get_action calls/s", "p50 ms", "p99 ms", "errors",
                   "episodes finished", "written", "server CPU µs/call", "clients CPU µs/call"):
        table.add_column(column, justify="right")
    for r in result["served"]:
        table.add_row(str(r["clients"]), str(r["processes"]), f"{r['calls_per_s']:,.0f}",
                      f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", str(r["errors"]),
                      f"{r['episodes_finished']:,}", f"{r['episodes_written']:,}",
                      f"{r['server_cpu_us']:,.0f}", f"{r['client_cpu_us']:,.0f}")
    console.print(table)
    before = Table(title="the same on the hand-built stack this one replaced (http.server, "
                   "own worker pool and client transport), same machine")
    for column in ("clients", "get_action calls/s", "p50 ms", "p99 ms"):
        before.add_column(column, justify="right")
    for clients, calls, p50, p99 in HAND_BUILT_STACK:
        before.add_row(str(clients), f"{calls:,}", f"{p50:.1f}", f"{p99:.1f}")
    console.print(before)
    for r in result["served"]:
        for error in r["first_errors"]:
            console.print(f"{r['clients']} clients: {error}", markup=False, highlight=False)
    codecs = Table(title="wire codec: encode + decode + convert one get_action request")
    for column in ("payload", "binary µs", "binary bytes", "JSON µs", "JSON bytes"):
        codecs.add_column(column, justify="right")
    for row in result["codec"]:
        codecs.add_row(row["payload"], f"{row['binary_us']:,.0f}", f"{row['binary_bytes']:,}",
                       f"{row['json_us']:,.0f}", f"{row['json_bytes']:,}")
    console.print(codecs)


if __name__ == "__main__" and sys.argv[1:2] == ["--client"]:
    _, _, address, threads, start, end, seed = sys.argv
    print(json.dumps(client_process(address, int(threads), float(start), float(end), int(seed))))
