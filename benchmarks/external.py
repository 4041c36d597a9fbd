"""`marl-runner bench --external`: serving 16 concurrent clients, in-process and over HTTP.

Each client thread plays episodes of 20 steps, 4 agents with 16-float obs:
`get_action`, then `log_returns`. Reported: agent actions served per second,
forward passes per request (how well concurrent requests are batched), and the
median and p99 latency of `get_action` as the client sees it. Also the wire
codec: encode + decode of one request, safe binary framing vs JSON.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from rich.console import Console
from rich.table import Table

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.client import PolicyClient
from marl_runner.serving import codec
from marl_runner.serving.server import PolicyServer
from marl_runner.serving.validation import to_space

NUM_AGENTS = 4
OBS_DIM = 16
EPISODE_LEN = 20
ENV = {
    "name": "marl_runner.envs.testing.external_envs:ThreadedExternalEnv",
    "config": {"num_threads": 0, "num_agents": NUM_AGENTS, "obs_dim": OBS_DIM},
}


def _config(num_clients: int) -> RunnerConfig:
    return RunnerConfig.from_dict({
        "env": ENV, "vectorize": "external", "num_envs": num_clients,
        "restart_failed_sub_environments": True, "rollout_fragment_length": 200,
        "policies": {"p": {"model": {"type": "mlp", "hidden": [64, 64]}}},
    })


def _play(calls: Any, deadline: float, latencies: list[float], seed: int) -> int:
    """Episodes until `deadline`; returns the agent actions received."""
    rng = np.random.default_rng(seed)
    agents = [f"a{i}" for i in range(NUM_AGENTS)]
    obs_pool = rng.uniform(-1, 1, (64, NUM_AGENTS, OBS_DIM)).astype(np.float32)
    actions = 0
    while time.perf_counter() < deadline:
        eid = calls.start_episode()
        for t in range(EPISODE_LEN):
            obs = dict(zip(agents, obs_pool[(t * 7 + seed) % 64]))
            started = time.perf_counter()
            answer = calls.get_action(eid, obs)
            latencies.append(time.perf_counter() - started)
            actions += len(answer)
            calls.log_returns(eid, dict.fromkeys(agents, 1.0))
        calls.end_episode(eid, {})
    return actions


def _drive(make_calls: Callable[[], Any], num_clients: int, duration_s: float) -> dict[str, Any]:
    latencies: list[list[float]] = [[] for _ in range(num_clients)]
    counts = [0] * num_clients
    deadline = time.perf_counter() + duration_s

    def client(index: int) -> None:
        counts[index] = _play(make_calls(), deadline, latencies[index], index)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(num_clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    flat = np.array([x for part in latencies for x in part]) * 1000.0
    return {
        "actions_per_s": sum(counts) / elapsed,
        "requests": int(len(flat)),
        "median_ms": float(np.median(flat)) if len(flat) else float("nan"),
        "p99_ms": float(np.percentile(flat, 99)) if len(flat) else float("nan"),
    }


def _count_forward(runner: EnvRunner) -> list[int]:
    calls = [0]
    policy = runner.policy_map["p"]
    forward = policy.compute_actions_from_input_dict

    def counting(input_dict: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward(input_dict, **kwargs)

    policy.compute_actions_from_input_dict = counting
    return calls


def measure_in_process(num_clients: int, duration_s: float) -> dict[str, Any]:
    with EnvRunner(_config(num_clients)) as runner:
        env = runner.env.get_sub_environments()[0]
        forward = _count_forward(runner)
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                runner.step()

        stepper = threading.Thread(target=loop)
        stepper.start()
        try:
            result = _drive(lambda: env, num_clients, duration_s)
        finally:
            stop.set()
            runner.stop()
            stepper.join()
    result["forward_per_request"] = forward[0] / max(result["requests"], 1)
    return result


def measure_http(num_clients: int, duration_s: float) -> dict[str, Any]:
    with EnvRunner(_config(num_clients)) as runner:
        forward = _count_forward(runner)
        server = PolicyServer(runner, "127.0.0.1", 0).start()
        stop = threading.Event()
        loop = threading.Thread(target=server.serve, args=(stop, lambda item: None))
        loop.start()
        try:
            result = _drive(lambda: PolicyClient(server.address), num_clients, duration_s)
        finally:
            stop.set()
            loop.join()
            runner.stop()
            server.close()
    result["forward_per_request"] = forward[0] / max(result["requests"], 1)
    return result


def measure_codecs(repeats: int) -> list[dict[str, Any]]:
    """µs to encode a get_action request and decode it into arrays of the obs space."""
    rng = np.random.default_rng(0)
    cases = {
        f"{NUM_AGENTS} x {OBS_DIM} floats": gym.spaces.Box(-1, 1, (OBS_DIM,), np.float32),
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
    duration_s: float, smoke: bool, progress: Callable[[str], None], num_clients: int = 16
) -> dict[str, Any]:
    duration = 0.3 if smoke else duration_s
    progress(f"external: in-process, {num_clients} client threads")
    in_process = measure_in_process(num_clients, duration)
    progress(f"external: HTTP on loopback, {num_clients} client threads")
    http = measure_http(num_clients, duration)
    return {
        "num_clients": num_clients,
        "duration_s": duration,
        "in_process": in_process,
        "http": http,
        "codec": measure_codecs(3 if smoke else 200),
    }


def print_external(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"serving {result['num_clients']} concurrent clients "
                  f"({NUM_AGENTS} agents x {OBS_DIM} floats per request)")
    for column in ("mode", "actions/s", "requests", "forward passes / request",
                   "get_action median ms", "p99 ms"):
        table.add_column(column, justify="right")
    for mode in ("in_process", "http"):
        r = result[mode]
        table.add_row(mode.replace("_", "-"), f"{r['actions_per_s']:,.0f}", f"{r['requests']:,}",
                      f"{r['forward_per_request']:.3f}", f"{r['median_ms']:.2f}", f"{r['p99_ms']:.2f}")
    console.print(table)
    codecs = Table(title="wire codec: encode + decode + convert one get_action request")
    for column in ("payload", "binary µs", "binary bytes", "JSON µs", "JSON bytes"):
        codecs.add_column(column, justify="right")
    for row in result["codec"]:
        codecs.add_row(row["payload"], f"{row['binary_us']:,.0f}", f"{row['binary_bytes']:,}",
                       f"{row['json_us']:,.0f}", f"{row['json_bytes']:,}")
    console.print(codecs)
