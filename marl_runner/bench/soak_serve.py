"""Serving soak (`marl-runner bench --soak-serve MINUTES`): every finished episode is written.

Runs `marl-runner serve --out` in a subprocess and, for `minutes`, against it
at once: well-behaved clients in both inference modes (each in its own
process), clients that kill themselves (SIGKILL) in the middle of an episode,
in both modes (their open episodes are abandoned; a killed local client had
uploaded its finished ones first), and a hostile client sending NaN
observations, bad rewards and garbage bodies. Then the clients stop, the
server is stopped with SIGINT, and `--out` is read back.

The report: episodes and env steps the clients finished (an `end_episode`
answered, or in local mode an upload accepted) against those written (must
be equal, each (episode, agent) with t = 0..n-1 exactly once), the hostile
requests by answer status, the well-behaved clients' errors (must be 0), and
the server's RSS, threads and open files at the start, after each minute
under load (flat once warm: growth there would be a leak) and at the end.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[2]  # the checkout: these modes serve its examples/
CONFIG = REPO / "examples" / "configs" / "serve_drones.yaml"
DRONES = [f"drone_{i}" for i in range(4)]
# A client killed mid-episode leaves its slot taken until this timeout ends the episode.
EPISODE_TIMEOUT_S = 3


def _obs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {d: rng.uniform(-1, 1, 8).astype(np.float32) for d in DRONES}


def _play(client: Any, rng: np.random.Generator, steps: int) -> None:
    """One whole episode of `steps` env steps."""
    eid = client.start_episode()
    for _ in range(steps):
        client.get_action(eid, _obs(rng))
        client.log_returns(eid, {d: float(rng.integers(-3, 4)) for d in DRONES})
    client.end_episode(eid, {d: np.zeros(8, np.float32) for d in DRONES})


def _record(log: Path, steps: list[int]) -> None:
    """One line per finished episode (its env steps), flushed before anything else happens."""
    with log.open("a") as file:
        file.writelines(f"{n}\n" for n in steps)
        file.flush()
        os.fsync(file.fileno())


def _client_process(address: str, mode: str, log: str, seed: int, stop: Any, kill: bool) -> None:
    """A client process: whole episodes until `stop`; with `kill`, a few, then SIGKILL mid-episode."""
    from marl_runner.client import PolicyClient

    rng = np.random.default_rng(seed)
    client = PolicyClient(address, inference_mode=mode, update_interval_s=2.0, timeout_s=60)
    path = Path(log)
    episodes = int(rng.integers(1, 4)) if kill else None
    played: list[int] = []
    while not stop.is_set() and (episodes is None or len(played) < episodes):
        steps = int(rng.integers(5, 60))
        _play(client, rng, steps)
        if mode == "remote":
            _record(path, [steps])  # end_episode was answered: the server has it
        else:
            played.append(steps)
    if not kill:
        client.close()  # local mode: uploads every finished episode, or raises
        _record(path, played)
        return
    if mode == "local":
        deadline = time.monotonic() + 60
        while client.episodes_uploaded < len(played):
            if time.monotonic() > deadline:  # not recorded: the report shows the difference
                raise TimeoutError(f"{len(played)} episodes ended, {client.episodes_uploaded} uploaded")
            time.sleep(0.01)
        _record(path, played)
    eid = client.start_episode()
    for _ in range(int(rng.integers(1, 10))):
        client.get_action(eid, _obs(rng))
    os.kill(os.getpid(), signal.SIGKILL)


class _Hostile:
    """Bad requests in a loop; counts the answers by status (0: the connection failed)."""

    def __init__(self, address: str, seed: int) -> None:
        host, port = address[len("http://"):].split(":")
        self.host, self.port = host, int(port)
        self.rng = random.Random(seed)
        self.statuses: Counter[str] = Counter()
        self.examples: dict[str, str] = {}  # the first answer of each kind and status

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: an episode to attack (abandoned now and then), then bad requests."""
        episode = None
        while not stop.is_set():
            if episode is None:
                status, answer = self._json("start_episode", {})
                episode = answer.get("episode_id") if status == 200 else None
                continue
            kind, path, body, content_type = self._attack(episode)
            status, payload = self._send(path, body, content_type)
            self.statuses[f"{kind} {status}"] += 1
            self.examples.setdefault(f"{kind} {status}", payload[:200].decode("utf-8", "replace"))
            if self.rng.random() < 0.01:
                episode = None  # abandoned: the server ends it after its timeout
            time.sleep(0.01)

    def _attack(self, episode: str) -> tuple[str, str, bytes, str]:
        json_type = "application/json"
        bad_obs = {d: [float("nan")] * 8 for d in DRONES}
        choices = [
            ("nan_obs", "get_action", {"episode_id": episode, "obs": bad_obs}),
            ("huge_obs", "get_action", {"episode_id": episode, "obs": {DRONES[0]: [1e300] * 8}}),
            ("nan_reward", "log_returns", {"episode_id": episode, "rewards": {DRONES[0]: "NaN"}}),
            ("text_reward", "log_returns", {"episode_id": episode, "rewards": {DRONES[0]: "x"}}),
            ("unknown_agent", "log_returns", {"episode_id": episode, "rewards": {"ghost": 1.0}}),
            ("unknown_episode", "get_action", {"episode_id": "nope", "obs": {DRONES[0]: [0] * 8}}),
            ("bad_upload", "experiences", {"env_steps": 10**15, "policies": {"pilot": {
                "obs": [[1e308] * 8, "not a number", None], "a/b": [1, 2, 3]}}}),
        ]
        if self.rng.random() < 0.3:
            garbage = bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(0, 300)))
            target = self.rng.choice(["get_action", "log_returns", "experiences", "state"])
            content = self.rng.choice([json_type, "application/x-marl-runner"])
            return "garbage", f"/v1/{target}", garbage, content
        kind, name, value = self.rng.choice(choices)
        return kind, f"/v1/{name}", json.dumps(value).encode(), json_type

    def _json(self, name: str, value: Any) -> tuple[int, Any]:
        status, payload = self._send(f"/v1/{name}", json.dumps(value).encode(), "application/json")
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, {}

    def _send(self, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("POST", path, body=body, headers={"Content-Type": content_type})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return 0, b""
        finally:
            connection.close()


def _server_resources(pid: int) -> dict[str, Any]:
    process = psutil.Process(pid)
    return {
        "rss_mb": round(process.memory_info().rss / 2**20, 1),
        "threads": process.num_threads(),
        "open_files": process.num_fds(),
    }


def _written(out: Path) -> dict[str, Any]:
    """Env steps and episodes in `out`, and the trajectories whose t is not 0..n-1 once."""
    from marl_runner.io import read_batches

    env_steps, batches = 0, 0
    t_by_trajectory: dict[tuple[int, int], list[int]] = {}
    for batch in read_batches(out):
        batches += 1
        env_steps += batch.env_steps()
        for policy_batch in batch.policy_batches.values():
            for key in zip(
                policy_batch["eps_id"].tolist(), policy_batch["agent_index"].tolist(),
                policy_batch["t"].tolist(), strict=True,
            ):
                t_by_trajectory.setdefault(key[:2], []).append(key[2])
    broken = sum(sorted(ts) != list(range(len(ts))) for ts in t_by_trajectory.values())
    episodes = len({eps for eps, _ in t_by_trajectory})
    return {"batches": batches, "env_steps": env_steps, "episodes": episodes,
            "broken_trajectories": broken}


def _finished(logs: Path) -> dict[str, int]:
    """What the clients finished, from their logs (only whole lines: a kill leaves none torn)."""
    steps = [
        int(line)
        for log in logs.glob("*.log")
        for line in log.read_text().splitlines(keepends=True)
        if line.endswith("\n")
    ]
    return {"episodes": len(steps), "env_steps": sum(steps)}


def run_soak_serve(
    minutes: float,
    *,
    remote_clients: int = 2,
    local_clients: int = 1,
    killed_clients: int = 2,
    hostile: bool = True,
    seed: int = 0,
    keep_out: bool = False,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Serves for `minutes` under the mixed load above; returns the report (see the docstring).

    `killed_clients` run at once, half of them in local mode; each is
    replaced as soon as it has killed itself. The server's `--out` folder is
    deleted afterwards unless `keep_out`.
    """
    if not minutes > 0:
        raise ValueError(f"minutes {minutes!r}: expected a number > 0")
    work = Path(tempfile.mkdtemp(prefix="marl-runner-soak-serve-"))
    out, logs = work / "out", work / "clients"
    logs.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "marl_runner.cli", "serve", str(CONFIG), "--port", "0",
         "--out", str(out), "--progress-interval", "10",
         "--set", f"external_episode_timeout_s={EPISODE_TIMEOUT_S}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines: list[str] = []
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    hostile_stop = threading.Event()
    processes: list[Any] = []
    killed: list[Any] = []
    per_minute: list[dict[str, Any]] = []  # the server's resources after each minute
    seeds = itertools.count()
    try:
        address = _address(server, lines)
        reader = threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True)
        reader.start()
        start = _server_resources(server.pid)
        progress(f"serving on {address}; server {start}")

        def spawn(name: str, mode: str, kill: bool) -> Any:
            """A client process logging its finished episodes to `logs/<name>.log`."""
            process = context.Process(
                target=_client_process, name=name, daemon=True,
                args=(address, mode, str(logs / f"{name}.log"), seed + next(seeds), stop, kill),
            )
            process.start()
            return process

        modes = ["remote"] * remote_clients + ["local"] * local_clients
        processes = [spawn(f"{mode}-{i}", mode, False) for i, mode in enumerate(modes)]
        killer_modes = ["remote" if i % 2 == 0 else "local" for i in range(killed_clients)]
        killers = [spawn(f"killed-{i}-0", mode, True) for i, mode in enumerate(killer_modes)]
        attacker = _Hostile(address, seed)
        hostile_thread = threading.Thread(target=attacker.run, args=(hostile_stop,), daemon=True)
        if hostile:
            hostile_thread.start()
        began = time.monotonic()
        deadline = began + minutes * 60
        while time.monotonic() < deadline:
            if time.monotonic() >= began + 60 * (len(per_minute) + 1):
                per_minute.append(_server_resources(server.pid))
            for i, process in enumerate(killers):
                if not process.is_alive():
                    killed.append(process)
                    killers[i] = spawn(f"killed-{i}-{len(killed)}", killer_modes[i], True)
            if server.poll() is not None:
                break
            time.sleep(0.2)
        progress("stopping the clients")
        stop.set()
        hostile_stop.set()
        for process in processes + killers:
            process.join(120)
        if hostile:
            hostile_thread.join(30)
        end = _server_resources(server.pid) if server.poll() is None else None
        server.send_signal(signal.SIGINT)
        server.wait(120)
        reader.join(10)
    finally:
        stop.set()
        hostile_stop.set()
        for process in processes + killed:
            if process.is_alive():
                process.kill()
        if server.poll() is None:
            server.kill()
            server.wait()
    output = "".join(lines)
    finished, written = _finished(logs), _written(out)
    if not keep_out:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "minutes": minutes,
        "server_exit_code": server.returncode,
        "clients_finished": finished,
        "written": written,
        "equal": finished["episodes"] == written["episodes"]
        and finished["env_steps"] == written["env_steps"] and not written["broken_trajectories"],
        "clients_killed": len(killed) + sum(p.exitcode == -signal.SIGKILL for p in killers),
        "client_errors": sum(p.exitcode not in (0, None) for p in processes),
        "hostile_answers": dict(sorted(attacker.statuses.items())),
        "hostile_examples": dict(sorted(attacker.examples.items())),
        "server_start": start,
        "server_per_minute": per_minute,
        "server_end": end,
        "table": _table_counts(output),
        "out_dir": str(out) if keep_out else None,
        "server_output_tail": output[-3000:],
    }


def _address(server: subprocess.Popen, lines: list[str]) -> str:
    for line in server.stdout:
        lines.append(line)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if found:
            return found.group(1)
    raise RuntimeError("marl-runner serve did not start:\n" + "".join(lines))


def _table_counts(output: str) -> dict[str, int | None]:
    """The final table's episodes and env steps, to compare with what was written."""
    counts: dict[str, int | None] = {}
    for key, pattern in (("episodes", r"│ episodes\s*│\s*([\d,]+)"),
                         ("env_steps", r"│ env steps\s*│\s*([\d,]+)")):
        found = re.search(pattern, output)
        counts[key] = int(found.group(1).replace(",", "")) if found else None
    return counts


def print_soak_serve(report: dict[str, Any], write: Callable[[str], None] = print) -> None:
    """The report in a few lines."""
    finished, written = report["clients_finished"], report["written"]
    write(
        f"serving soak {report['minutes']:g} min: clients finished {finished['episodes']} episodes "
        f"({finished['env_steps']} env steps); written {written['episodes']} episodes "
        f"({written['env_steps']} env steps) in {written['batches']} batches; table "
        f"{report['table']['episodes']} episodes, {report['table']['env_steps']} env steps; "
        f"{'EQUAL' if report['equal'] else 'NOT EQUAL'}"
    )
    write(
        f"  {report['clients_killed']} clients killed mid-episode, {report['client_errors']} "
        f"well-behaved clients failed, server exit code {report['server_exit_code']}"
    )
    write(f"  hostile answers: {report['hostile_answers']}")
    for moment in ("server_start", "server_end"):
        write(f"  {moment}: {report[moment]}")
    minutes = report["server_per_minute"]
    for name, key in (("RSS MB", "rss_mb"), ("threads", "threads"), ("open files", "open_files")):
        write(f"  server {name} after each minute: {[m[key] for m in minutes]}")


def main(argv: list[str] | None = None) -> int:
    """`python -m marl_runner.bench.soak_serve MINUTES`; exit 0 when nothing was lost or failed."""
    parser = argparse.ArgumentParser(prog="soak_serve", description=__doc__.split("\n")[0])
    parser.add_argument("minutes", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="also write the report as JSON here")
    parser.add_argument("--keep-out", action="store_true", help="keep the server's --out folder")
    args = parser.parse_args(argv)
    report = run_soak_serve(
        args.minutes, seed=args.seed, keep_out=args.keep_out,
        progress=lambda m: print(m, file=sys.stderr),
    )
    print_soak_serve(report)
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    healthy = (
        report["equal"] and report["server_exit_code"] == 0 and report["client_errors"] == 0
        and report["table"]["episodes"] == report["written"]["episodes"]
    )
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
