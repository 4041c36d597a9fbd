"""Remote inference sends one request per env step: `log_returns` rides on the episode's next call.

A `PolicyClient` queues the rewards and infos logged on an episode it has
open and sends them in the `returns` field of the next `get_action`,
`log_action` or `end_episode`; the server applies them, in order, before the
call. The episode must come out exactly as when every `log_returns` was a
request of its own, a bad value must still raise at `log_returns`, and a
reward must never be applied twice.
"""

from __future__ import annotations

import collections
import functools
import re
import threading
from typing import Any

import numpy as np
import pytest
from helpers_http_stub import ScriptedHandler, scripted_server

from marl_runner import EnvRunner
from marl_runner.client import PolicyClient, PolicyServerUnavailable
from marl_runner.serving import client as client_module
from marl_runner.serving.server import PolicyServer
from marl_runner.serving.transport import HttpTransport
from tests.test_serving_http import serve_config, served, wait_for

AGENTS = ["a0", "a1"]
CONFIG = serve_config(env={
    "name": "marl_runner.bench.envs.external_envs:ThreadedExternalEnv",
    "config": {"num_threads": 0, "num_agents": len(AGENTS)},
})
ROUTES = ("_start_episode", "_get_action", "_log_action", "_log_returns", "_end_episode", "_info")


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    """Requests each route of the servers built from here on was called with, by name."""
    counts: collections.Counter = collections.Counter()

    def counting(name: str, route: Any) -> Any:
        @functools.wraps(route)
        async def wrapper(self: PolicyServer, body: Any) -> Any:
            counts[name] += 1
            return await route(self, body)
        return wrapper

    for route in ROUTES:
        monkeypatch.setattr(PolicyServer, route, counting(route[1:], getattr(PolicyServer, route)))
    return counts


def obs(rng: np.random.Generator) -> dict:
    return {a: rng.uniform(-1, 1, 3).astype(np.float32) for a in AGENTS}


def script(seed: int) -> list[dict]:
    """Steps of one episode: the step's call and the log_returns that follow it (0 to 3,
    some for one agent only, some with infos); the last entry is the episode's end."""
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(6):
        logged = []
        for _ in range(int(rng.integers(0, 4))):
            agents = AGENTS if rng.random() < 0.7 else AGENTS[:1]
            rewards = {a: float(rng.integers(-8, 9)) / 4 for a in agents}
            infos = {a: {"step": t, "k": len(logged)} for a in agents} if rng.random() < 0.5 else None
            logged.append((rewards, infos))
        steps.append({"call": "log_action" if t == 3 else "get_action", "obs": obs(rng),
                      "logged": logged})
    steps.append({"call": "end_episode", "obs": obs(rng), "logged": []})
    return steps


def expected_rows(steps: list[dict]) -> dict[str, list[tuple[float, dict]]]:
    """Per agent, each row's reward and infos: what was logged after its step, added up and
    merged in order."""
    rows: dict[str, list] = {a: [] for a in AGENTS}
    for step in steps[:-1]:
        for agent in AGENTS:
            reward, info = 0.0, {}
            for rewards, infos in step["logged"]:
                reward += rewards.get(agent, 0.0)
                info.update((infos or {}).get(agent, {}))
            rows[agent].append((reward, info))
    return rows


def play(calls: Any, steps: list[dict]) -> str:
    """Plays `steps` through `calls` (a PolicyClient, or a transport sending each call)."""
    eid = calls.start_episode()
    for step in steps:
        if step["call"] == "get_action":
            calls.get_action(eid, step["obs"])
        elif step["call"] == "log_action":
            calls.log_action(eid, step["obs"], dict.fromkeys(AGENTS, 3))
        else:
            calls.end_episode(eid, step["obs"])
        for rewards, infos in step["logged"]:
            calls.log_returns(eid, rewards, infos)
    return eid


class OneRequestPerCall:
    """The five calls, each one request of its own (what PolicyClient sent before)."""

    def __init__(self, address: str) -> None:
        self.transport = HttpTransport(address)

    def start_episode(self) -> str:
        return self.transport.post("start_episode", {})["episode_id"]

    def get_action(self, eid: str, obs: dict) -> dict:
        return self.transport.post("get_action", {"episode_id": eid, "obs": obs})["actions"]

    def log_action(self, eid: str, obs: dict, actions: dict) -> None:
        self.transport.post("log_action", {"episode_id": eid, "obs": obs, "actions": actions})

    def log_returns(self, eid: str, rewards: dict, infos: dict | None = None) -> None:
        self.transport.post("log_returns", {"episode_id": eid, "rewards": rewards, "infos": infos})

    def end_episode(self, eid: str, obs: dict) -> None:
        self.transport.post("end_episode", {"episode_id": eid, "obs": obs})


def rows_of(batch: Any) -> dict[str, list[tuple[float, dict]]]:
    """Per agent, each row's (reward, infos) in `t` order (one episode per batch)."""
    rows = batch.policy_batches["p"]
    assert len(set(rows["eps_id"].tolist())) == 1
    out = {}
    for index, agent in enumerate(AGENTS):
        mine = np.flatnonzero(rows["agent_index"] == index)
        mine = mine[np.argsort(rows["t"][mine])]
        assert rows["t"][mine].tolist() == list(range(len(mine)))
        out[agent] = [(float(rows["rewards"][i]), dict(rows["infos"][i])) for i in mine]
    return out


def test_one_request_per_step_and_every_episode_as_with_a_request_per_call(requests):
    seeds = range(4)
    with served(CONFIG) as handle:
        with PolicyClient(handle.server.address) as client:
            for seed in seeds:
                play(client, script(seed))
            wait_for(lambda: len(handle.batches) == len(seeds))
            steps = sum(len(script(seed)) - 1 for seed in seeds)
            # The first log_returns fetched the spaces once; then a request per step, plus
            # each episode's start and end.
            assert requests == {"info": 1, "start_episode": len(seeds),
                                "get_action": steps - len(seeds), "log_action": len(seeds),
                                "end_episode": len(seeds)}
        separate = OneRequestPerCall(handle.server.address)
        for seed in seeds:
            play(separate, script(seed))
        wait_for(lambda: len(handle.batches) == 2 * len(seeds))
        assert requests["log_returns"] == sum(len(s["logged"]) for seed in seeds for s in script(seed))
        batches = handle.batches
    for seed, queued, sent in zip(seeds, batches[:len(seeds)], batches[len(seeds):]):
        assert rows_of(queued) == rows_of(sent) == expected_rows(script(seed))


def test_a_bad_reward_or_info_raises_at_log_returns_and_the_episode_is_still_written(requests):
    rng = np.random.default_rng(0)
    with served(CONFIG) as handle:
        with PolicyClient(handle.server.address) as client:
            eid = client.start_episode()
            client.get_action(eid, obs(rng))
            client.log_returns(eid, {"a0": 1.0})
            with pytest.raises(ValueError, match=r"reward of agent 'a1': nan is not a finite"):
                client.log_returns(eid, {"a0": 5.0, "a1": float("nan")})
            with pytest.raises(ValueError, match=r"rewards: unknown agent 'ghost'"):
                client.log_returns(eid, {"ghost": 1.0})
            with pytest.raises(ValueError, match=r"infos of agent 'a0'\['z'\].*complex"):
                client.log_returns(eid, {"a0": 5.0}, {"a0": {"z": np.array([1 + 2j])}})
            with pytest.raises(ValueError, match=r"action_mask.*allows no action"):
                client.log_returns(eid, {"a0": 5.0}, {"a0": {"action_mask": [0, 0, 0, 0]}})
            client.log_returns(eid, {"a1": 3e38})
            with pytest.raises(ValueError, match=r"rewards of agent 'a1' add up to 6e\+38"):
                client.log_returns(eid, {"a1": 3e38})
            client.log_returns(eid, {"a0": 0.5, "a1": -2.0}, {"a1": {"ok": 1}})
            client.end_episode(eid, obs(rng))
            wait_for(lambda: len(handle.batches) == 1)
        assert requests["log_returns"] == 0  # every refusal was the client's own
    rows = rows_of(handle.batches[0])
    assert rows["a0"] == [(1.5, {})]
    assert rows["a1"] == [(np.float32(3e38 - 2.0), {"ok": 1})]


def test_unknown_and_finished_episodes_still_raise_at_log_returns():
    rng = np.random.default_rng(0)
    with served(CONFIG) as handle, PolicyClient(handle.server.address) as client:
        with pytest.raises(ValueError, match=r"log_returns: unknown episode 'nope'"):
            client.log_returns("nope", {"a0": 1.0})
        eid = client.start_episode()
        client.get_action(eid, obs(rng))
        client.end_episode(eid, obs(rng))
        with pytest.raises(ValueError, match=rf"log_returns: episode '{eid}' has already finished"):
            client.log_returns(eid, {"a0": 1.0})
        # Opened by another client: this one sends at once too, and the server applies it.
        with PolicyClient(handle.server.address) as starter:
            other = starter.start_episode()
        client.log_returns(other, {"a0": 1.0})
        with pytest.raises(ValueError, match=r"episode_id \['x'\]: expected a string"):
            client.log_returns(["x"], {"a0": 1.0})


def test_close_sends_the_rewards_still_queued(requests):
    rng = np.random.default_rng(0)
    with served(CONFIG) as handle:
        client = PolicyClient(handle.server.address)
        eid = client.start_episode()
        client.get_action(eid, obs(rng))
        client.log_returns(eid, {"a0": 1.0})
        client.log_returns(eid, {"a0": 2.0, "a1": 4.0})
        assert requests["log_returns"] == 0
        client.close()
        assert requests["log_returns"] == 2
        PolicyClient(handle.server.address).end_episode(eid, obs(rng))
        wait_for(lambda: len(handle.batches) == 1)
    rows = rows_of(handle.batches[0])
    assert (rows["a0"], rows["a1"]) == ([(3.0, {})], [(4.0, {})])


def test_the_oldest_idle_episodes_are_forgotten_past_the_limit(requests, monkeypatch):
    monkeypatch.setattr(client_module, "MAX_OPEN_EPISODES", 2)
    rng = np.random.default_rng(0)
    with served(CONFIG) as handle, PolicyClient(handle.server.address) as client:
        first, second = client.start_episode(), client.start_episode()
        client.log_returns(second, {"a0": 1.0})  # queued: never forgotten
        third = client.start_episode()  # forgets `first`, the oldest with nothing queued
        client.log_returns(first, {"a0": 1.0})
        client.log_returns(second, {"a0": 1.0})
        client.log_returns(third, {"a0": 1.0})
        assert requests["log_returns"] == 1
        client.get_action(first, obs(rng))  # opens it again; the others have rewards queued
        client.log_returns(first, {"a0": 1.0})
        assert requests["log_returns"] == 1


def test_a_malformed_returns_field_gets_400_and_changes_nothing():
    rng = np.random.default_rng(0)
    step = {a: v.tolist() for a, v in obs(rng).items()}
    with served(CONFIG) as handle:
        eid = handle.post_json("start_episode", {})[1]["episode_id"]
        assert handle.post_json("get_action", {"episode_id": eid, "obs": step})[0] == 200
        refused = [
            ("get_action", {"obs": step, "returns": "x"}, "returns: expected a list"),
            ("get_action", {"obs": step, "returns": [[{"a0": 1.0}]]}, r"returns\[0\]: expected \[rewards"),
            ("get_action", {"obs": step, "returns": [[{"a0": 1.0}, None], [{"a0": "NaN"}, None]]},
             r"returns\[1\]: reward of agent 'a0'"),
            ("get_action", {"obs": step, "returns": [[{"a0": 3e38}, None], [{"a0": 3e38}, None]]},
             r"returns\[1\]: rewards of agent 'a0' add up to"),
            ("get_action", {"obs": step, "returns": [[{"ghost": 1.0}, None]]}, "unknown agent 'ghost'"),
            ("get_action", {"obs": step, "returns": [[{"a0": 1.0}, {"a0": {"bad/key": 1}}]]},
             r"returns\[0\]: infos of agent 'a0'"),
            ("get_action", {"obs": {"a0": [9, 9, 9]}, "returns": [[{"a0": 1.0}, None]]}, "outside"),
            ("log_action", {"obs": {"a0": step["a0"]}, "actions": {"a0": 1, "a1": 1},
                            "returns": [[{"a0": 1.0}, None]]}, r"agents \['a1'\] have no obs"),
            ("end_episode", {"obs": step, "truncated": "x", "returns": [[{"a0": 1.0}, None]]},
             "truncated"),
        ]
        for call, body, message in refused:
            status, answer = handle.post_json(call, {"episode_id": eid, **body})
            assert status == 400, (call, body, answer)
            assert answer["type"] == "RequestError"
            assert re.search(message, answer["error"]), answer["error"]
        status, answer = handle.post_json(
            "end_episode", {"episode_id": eid, "obs": step, "returns": [[{"a1": 0.25}, None]]})
        assert status == 200, answer
        wait_for(lambda: len(handle.batches) == 1)
    rows = rows_of(handle.batches[0])  # one step: none of the refused calls stepped or logged
    assert (rows["a0"], rows["a1"]) == ([(0.0, {})], [(0.25, {})])


def test_a_call_that_may_have_reached_the_server_does_not_send_its_rewards_again(requests):
    runner = EnvRunner(CONFIG)
    server = PolicyServer(runner, "127.0.0.1", 0).start()
    stop = threading.Event()
    outputs: list = []
    loop = threading.Thread(target=server.serve, args=(stop, outputs.append), daemon=True)
    rng = np.random.default_rng(0)
    try:
        client = PolicyClient(server.address, timeout_s=0.5)
        eid = client.start_episode()
        client.log_returns(eid, {"a0": 1.0})
        # Nobody answers get_action yet: it times out after the server applied its rewards.
        with pytest.raises(PolicyServerUnavailable, match="after the request was sent"):
            client.get_action(eid, obs(rng))
        loop.start()
        client.get_action(eid, obs(rng))
        client.log_returns(eid, {"a0": 2.0})
        client.end_episode(eid, obs(rng))
        wait_for(lambda: any(hasattr(o, "policy_batches") for o in outputs))
        client.close()
    finally:
        stop.set()
        loop.join(10)
        runner.stop()
        server.close()
    batch = next(o for o in outputs if hasattr(o, "policy_batches"))
    rows = batch.policy_batches["p"]
    assert float(rows["rewards"][rows["agent_index"] == 0].sum()) == 3.0  # 1.0 applied once


class _Recorder(ScriptedHandler):
    """A stand-in server with the spaces and episode "e1"; its `get_action` calls are scripted."""

    scripted = "get_action"
    SPACE = {"type": "Box", "low": -1.0, "high": 1.0, "shape": [3], "dtype": "float32"}

    def answer(self, name: str) -> Any:
        if name == "info":
            return {"observation_spaces": dict.fromkeys(AGENTS, self.SPACE),
                    "action_spaces": dict.fromkeys(AGENTS, {"type": "Discrete", "n": 4})}
        return {"episode_id": "e1"} if name == "start_episode" else {"actions": {}}

    def error_type(self, status: int) -> str:
        return "RequestError" if status == 400 else "Busy"


def test_retries_and_failures_carry_each_reward_once():
    ones = [[{"a0": 1.0}, None]]
    with scripted_server(_Recorder, [503, 200, 400, 200, "drop", 200, 503, 503]) as address:
        client = PolicyClient(address, retries=1, backoff_s=0.01)
        eid = client.start_episode()
        client.log_returns(eid, {"a0": 1.0})
        client.get_action(eid, {"a0": np.zeros(3, np.float32)})  # 503 (did nothing), 200
        client.log_returns(eid, {"a0": 1.0})
        with pytest.raises(ValueError, match="refused"):  # 400: refused, so carried again
            client.get_action(eid, {"a0": np.zeros(3, np.float32)})
        client.get_action(eid, {"a0": np.zeros(3, np.float32)})
        client.log_returns(eid, {"a0": 1.0})
        with pytest.raises(PolicyServerUnavailable):  # may have been applied: not sent again
            client.get_action(eid, {"a0": np.zeros(3, np.float32)})
        client.get_action(eid, {"a0": np.zeros(3, np.float32)})
        client.log_returns(eid, {"a0": 1.0})
        with pytest.raises(Exception, match="503"):  # refused, retries spent: kept for close
            client.get_action(eid, {"a0": np.zeros(3, np.float32)})
        client.close()
    carried = [(name, body.get("returns")) for _, name, body in _Recorder.requests if body is not None]
    assert carried == [
        ("start_episode", None),
        ("get_action", ones), ("get_action", ones),
        ("get_action", ones), ("get_action", ones),
        ("get_action", ones), ("get_action", None),
        ("get_action", ones), ("get_action", ones),
        ("log_returns", None),
    ]
    assert _Recorder.requests[-1][2]["rewards"] == {"a0": 1.0}
