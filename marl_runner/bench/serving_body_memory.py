"""Peak RSS of a policy server decoding big JSON bodies (issue 17, finding 8).

    python -m marl_runner.bench.serving_body_memory [--mb 59] [--concurrent 6]

Runs the server in a child process (so the client's copy of the body does not
count), sends `--concurrent` experiences uploads of about `--mb` MB of JSON at
once, and prints the server's RSS before and its peak while decoding.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import threading
import time

import numpy as np

CONFIG = {
    "env": {
        "name": "marl_runner.bench.envs.external_envs:ThreadedExternalEnv",
        "config": {"num_threads": 0, "num_agents": 2},
    },
    "vectorize": "external",
    "num_envs": 8,
    "policies": {"p": {"model": {"type": "mlp", "hidden": [8]}}},
}


def status_mb(pid: int, field: str) -> float:
    """`VmRSS` (now) or `VmHWM` (peak so far) of process `pid`, read from outside it: a
    sampling thread inside would miss the peak, since `json.loads` holds the GIL."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def serve(ready: multiprocessing.Queue, done: multiprocessing.Event) -> None:
    from marl_runner.config import RunnerConfig
    from marl_runner.sampling.runner import EnvRunner
    from marl_runner.serving.server import PolicyServer

    runner = EnvRunner(RunnerConfig.from_dict(CONFIG))
    server = PolicyServer(runner, "127.0.0.1", 0).start()
    stop = threading.Event()
    loop = threading.Thread(target=server.serve, args=(stop, lambda item: None), daemon=True)
    loop.start()  # as `serve` does: uploads are drained (here: dropped) by the sampling loop
    ready.put(server.server_address_tuple())
    done.wait()
    stop.set()
    loop.join(30)
    runner.stop()
    server.close()


def body(megabytes: float) -> bytes:
    rows = int(megabytes * 2**20 / 99)  # ~99 bytes of JSON per row
    rng = np.random.default_rng(0)
    obs = np.round(rng.uniform(-1, 1, (rows, 3)), 6).tolist()
    value = {
        "env_steps": rows,
        "policies": {"p": {
            "obs": obs, "new_obs": obs, "actions": [1] * rows, "rewards": [0.5] * rows,
            "terminateds": [False] * rows, "truncateds": [False] * rows,
            "eps_id": [1] * rows, "t": list(range(rows)),
        }},
    }
    return json.dumps(value).encode()


def post(address: tuple[str, int], payload: bytes, statuses: list) -> None:
    connection = http.client.HTTPConnection(*address, timeout=600)
    connection.request("POST", "/v1/experiences", payload, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    statuses.append(response.status)
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=59.0)
    parser.add_argument("--concurrent", type=int, default=1)
    args = parser.parse_args()
    payload = body(args.mb)
    ready: multiprocessing.Queue = multiprocessing.Queue()
    done = multiprocessing.Event()
    child = multiprocessing.Process(target=serve, args=(ready, done))
    child.start()
    address = ready.get(timeout=120)
    before = status_mb(child.pid, "VmRSS")
    statuses: list = []
    started = time.perf_counter()
    senders = [
        threading.Thread(target=post, args=(address, payload, statuses))
        for _ in range(args.concurrent)
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    elapsed = time.perf_counter() - started
    peak = status_mb(child.pid, "VmHWM")
    done.set()
    child.join(30)
    print(
        f"{args.concurrent} x {len(payload) / 2**20:.1f} MB JSON: statuses {sorted(statuses)}, "
        f"server RSS {before:.0f} MB before, peak {peak:.0f} MB (+{peak - before:.0f} MB, "
        f"{(peak - before) / (args.concurrent * len(payload) / 2**20):.1f}x the bodies), "
        f"{elapsed:.1f}s"
    )


if __name__ == "__main__":
    main()
