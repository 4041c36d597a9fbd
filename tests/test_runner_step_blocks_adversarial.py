"""Adversarial checks of the StepBlock path on the real subprocess vector env.

``vectorize: subprocess`` (2 workers) hands a worker's reply over as one
``StepBlock`` when its sub-envs all look alike, and the runner takes those
rows on its fast path. Whatever the env does between such rounds (agents
dying and spawning, rewards without obs, episode ends in some sub-envs of a
worker, odd obs spaces, faults), the batches must equal ``vectorize: sync``'s
for the same seed, and the batch invariants must hold.

Worker processes import this module to build its envs, so nothing here pulls in
torch at import time: ``marl_runner.EnvRunner`` is looked up when a test runs,
and ``tests.test_runner_step_blocks`` (its in-process block backend) is
imported by the tests that use it. That keeps a worker's start ~1.5 s shorter.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import marl_runner
from connectors import AgentConnector
from connectors.data import AgentRows
from marl_runner import check_batch_invariants
from marl_runner.checks import trajectory_rows
from marl_runner.envs import subprocess_replies, vector_backends
from marl_runner.envs.base_env import BaseEnv, PollDicts
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, StepResult
from marl_runner.envs.step_block import StepBlock
from marl_runner.envs.vector_backends import VectorBuild, register_vector_backend
from marl_runner.envs.vectorize import build_sync
from tests.envs import CrashingEnvError, Round, ScriptedEnv
from tests.runner_helpers import EpisodeTracker, assert_rewards_conserved, config, logged_env_name

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

HERE = "tests.test_runner_step_blocks_adversarial"
AGENTS = tuple(f"a{i}" for i in range(6))


class ChaosEnv(ScriptedEnv):
    """Six agents playing a fresh random script every episode (drawn from the reset seed).

    Most rounds repeat the last round's observers, each rewarded and no flag
    set (a reply of such sub-envs comes as a StepBlock); the others change
    something: observers shuffled, some agents without an obs, rewards for
    agents without an obs (held, before the first obs, after done), rewards
    for only some observers, agents dying (terminated or truncated) or
    spawning. Episodes are 3 to ``most_rounds`` rounds long, so the sub-envs
    of a worker end at different rounds; they end terminated or truncated.

    ``obs``: ``box`` (float32 [3]), ``uint8`` (uint8 [4, 4, 3] images),
    ``multidiscrete``, ``discrete``, ``two_dtypes`` (even agents float32,
    odd float64, one Box space each), ``two_shapes`` (odd agents [4]) or
    ``float64_sometimes`` (a float32 space, float64 obs every third round) or
    ``box0`` (0-d float32 obs of a Box of shape ()).
    ``steady``: the chance a round is a steady one; ``crash_rate``: the chance a step
    raises CrashingEnvError (drawn from the reset seed too, so sync and subprocess
    runs crash alike).
    """

    def __init__(
        self, obs: str = "box", steady: float = 0.8, most_rounds: int = 12, crash_rate: float = 0.0
    ) -> None:
        self.obs_kind = obs
        self.steady = steady
        self.most_rounds = most_rounds
        self.crash_rate = crash_rate
        space = _SPACES[obs]
        super().__init__([Round(AGENTS, end="terminated")], AGENTS, space(0))
        self.observation_spaces = {agent: space(i) for i, agent in enumerate(AGENTS)}
        self._script_rng = np.random.default_rng()

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        if seed is not None:
            self._script_rng = np.random.default_rng(seed + 1000)
        self.script = _chaos_script(self._script_rng, self.steady, self.most_rounds)
        return super().reset(seed=seed, options=options)

    def step(self, actions: MultiAgentDict) -> StepResult:
        if self.crash_rate and self._script_rng.random() < self.crash_rate:
            raise CrashingEnvError(f"ChaosEnv: planned crash after round {self._round}")
        return super().step(actions)

    def _observation(self, agent: AgentID) -> Any:
        plain = super()._observation(agent)
        index = AGENTS.index(agent)
        kind = self.obs_kind
        if kind == "uint8":
            return self._rng.integers(0, 256, (4, 4, 3), np.uint8)
        if kind == "multidiscrete":
            return np.array([self._round % 3, index % 4], np.int64)
        if kind == "discrete":
            return int(self._round % 5)
        if kind == "two_dtypes" and index % 2:
            return plain.astype(np.float64)
        if kind == "two_shapes" and index % 2:
            return np.append(plain, np.float32(0.5))
        if kind == "box0":
            return np.array(plain[2])  # 0-d
        if kind == "float64_sometimes" and self._round % 3 == 0:
            return plain.astype(np.float64)  # off its space's dtype (no check_env_outputs)
        return plain


_SPACES = {
    "box": lambda i: gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    "uint8": lambda i: gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
    "multidiscrete": lambda i: gym.spaces.MultiDiscrete([3, 4]),
    "discrete": lambda i: gym.spaces.Discrete(5),
    "two_dtypes": lambda i: gym.spaces.Box(-1.0, 1.0, (3,), np.float64 if i % 2 else np.float32),
    "two_shapes": lambda i: gym.spaces.Box(-1.0, 1.0, (4,) if i % 2 else (3,), np.float32),
    "float64_sometimes": lambda i: gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    "box0": lambda i: gym.spaces.Box(-1.0, 1.0, (), np.float32),
}


def _chaos_script(rng: np.random.Generator, steady: float, most_rounds: int) -> list[Round]:
    """One episode's rounds (see ChaosEnv). A steady round has every live agent observe
    in agent order, so sub-envs of one worker at different rounds still look alike."""
    born = 4 if rng.random() < 0.75 else int(rng.integers(2, 5))
    unborn = list(AGENTS[born:])
    alive = list(AGENTS[:born])  # born, not done
    script = [Round(tuple(alive))]
    length = int(rng.integers(3, most_rounds + 1))
    for k in range(1, length + 1):
        last = k == length
        if not last and rng.random() < steady:
            observers = tuple(a for a in AGENTS if a in alive)
            script.append(Round(observers, {a: _reward(rng) for a in observers}))
            continue
        change = rng.integers(6)
        if change == 0 and unborn:  # a spawn (rewarded before its first obs now and then)
            alive.append(unborn.pop(0))
        pool = list(alive)
        rng.shuffle(pool)
        observers = tuple(pool[: rng.integers(1, len(pool) + 1)])
        if change == 1:  # every live agent, shuffled: another layout
            observers = tuple(rng.permutation(alive))
        given = [a for a in AGENTS if rng.random() < 0.6]  # anyone: unborn, without obs, done
        if change == 2:
            given = list(observers[: max(1, len(observers) - 1)])  # only some observers
        rewards = {a: _reward(rng) for a in given}
        if last:
            end = "terminated" if rng.random() < 0.5 else "truncated"
            flagged = {"terminated": (), "truncated": ()}
            flagged[end] = observers
            script.append(Round(observers, rewards, end=end, **flagged))
            break
        # Never the last one alive: a round without obs kills a subprocess worker (see
        # test_a_round_without_any_obs_keeps_the_subprocess_worker_alive).
        dying = tuple(a for a in observers[1:] if change == 3 and rng.random() < 0.5)
        how = "terminated" if rng.random() < 0.5 else "truncated"
        script.append(Round(observers, rewards, **{how: dying}))
        for agent in dying:
            alive.remove(agent)
    return script


def _reward(rng: np.random.Generator) -> float:
    return float(rng.integers(-4, 9)) / 4


class NobodyObservesEnv(ScriptedEnv):
    """Two agents; in round 2 neither observes (as in a turn-based env between turns)."""

    def __init__(self) -> None:
        both = ("a0", "a1")
        rewards = {"a0": 1.0, "a1": 0.5}
        script = [Round(both), Round(both, rewards), Round((), rewards), Round(both, rewards),
                  Round(both, rewards, truncated=both, end="truncated")]
        super().__init__(script, both)


CHAOS = f"{HERE}:ChaosEnv"
#: Two policies with interleaved agents: a block's columns are split by fancy index.
INTERLEAVED = dict(
    policies={"even": {"model": {"type": "mlp", "hidden": [8]}}, "odd": {}},
    policy_mapping_fn={"a[024]": "even", "a*": "odd"},
)


def by_sub_env(agent_id: AgentID, episode: Any, **kwargs: Any) -> str:
    """Even sub-envs: every agent plays "even"; odd ones: interleaved. Sub-envs of one
    block then group their agents differently (several layout shapes per block)."""
    if episode.env_id % 2 == 0 or agent_id in ("a0", "a2", "a4"):
        return "even"
    return "odd"


@pytest.fixture
def block_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per StepBlock a subprocess env hands out in this test: its number of sub-envs."""
    given: list[int] = []
    enter = subprocess_replies.Replies._enter_block

    def counting(self: Any, block: Any) -> None:
        given.append(len(block.env_ids))
        enter(self, block)

    monkeypatch.setattr(subprocess_replies.Replies, "_enter_block", counting)
    return given


def _run(
    cfg_args: dict, vectorize: str, steps: int, calls: int, between: Any = None
) -> tuple[list, list[dict]]:
    """``calls`` samples of ``steps`` env steps; ``between(runner, call)`` runs before each
    call but the first. A RuntimeError saying "planned ..." out of a call is noted and
    sampling goes on (the runner must recover). Batches, and metrics (the errors last)."""
    workers = {"num_workers": 2} if vectorize == "subprocess" else {}
    cfg = config(**cfg_args, vectorize=vectorize, **workers)
    batches, metrics, errors = [], [], []
    with marl_runner.EnvRunner(cfg) as runner:
        for call in range(calls):
            try:
                if call and between is not None:
                    between(runner, call)
                batch = runner.sample(num_env_steps=steps)
            except RuntimeError as error:
                if not str(error).startswith("planned"):
                    raise
                errors.append(str(error))  # a planned failure: the runner must go on
                continue
            check_batch_invariants(batch, t_from_zero=not call)
            batches.append(batch)
            metrics.append(runner.get_metrics())
    return batches, metrics + [{"errors": errors}]


def assert_same_batches(sync: list, other: list, sampled_final_obs: bool = False) -> None:
    """Batch by batch, policy by policy, column by column (episode ids up to renaming;
    ``sampled_final_obs``: final new_obs are drawn from the space, unseeded)."""
    assert len(sync) == len(other)
    for first, second in zip(sync, other):
        assert set(first.policy_batches) == set(second.policy_batches)
        for policy_id, batch in first.policy_batches.items():
            theirs = second.policy_batches[policy_id]
            assert set(batch.keys()) == set(theirs.keys()), policy_id
            for column in batch.keys():
                if column == "eps_id":  # random per runner: the same rows share an id in both
                    np.testing.assert_array_equal(
                        np.unique(batch[column], return_inverse=True)[1],
                        np.unique(theirs[column], return_inverse=True)[1],
                    )
                elif column == "infos":
                    assert list(batch[column]) == list(theirs[column]), policy_id
                elif column == "new_obs" and sampled_final_obs:
                    live = ~(batch["terminateds"] | batch["truncateds"])
                    np.testing.assert_array_equal(batch[column][live], theirs[column][live])
                else:
                    np.testing.assert_array_equal(
                        batch[column], theirs[column], err_msg=f"{policy_id}.{column}"
                    )


_METRICS = ("episodes", "num_agent_steps", "num_env_steps", "episode_reward_mean",
            "policy_reward_mean", "num_faulty_episodes", "num_sub_env_restarts", "errors")


def compare(cfg_args: dict, block_rows: list[int], *, steps: int = 80, calls: int = 2,
            between: Any = None, min_block_rows: int = 20) -> list[dict]:
    """Subprocess batches and metrics equal sync ones, with enough rows from blocks;
    returns the metrics (the errors last)."""
    sync, sync_metrics = _run(cfg_args, "sync", steps, calls, between)
    parallel, parallel_metrics = _run(cfg_args, "subprocess", steps, calls, between)
    assert sum(block_rows) >= min_block_rows, block_rows
    assert_same_batches(sync, parallel, cfg_args.get("fake_obs") == "sample")
    for first, second in zip(sync_metrics, parallel_metrics):
        for key in _METRICS:
            np.testing.assert_equal(first.get(key), second.get(key), err_msg=key)
    return parallel_metrics


def _chaos(seed: int, num_envs: int = 4, **more: Any) -> dict:
    return dict(env_name=CHAOS, num_envs=num_envs, rollout_fragment_length=10, seed=seed, **more)


CASES = {  # config, and the fewest sub-env results that must come in blocks
    # 3 sub-envs per worker: blocks whose rows partly take the general path.
    "one_policy_3_per_worker": (_chaos(1, num_envs=6), 20),
    "fake_obs_last_interleaved_3_per_worker": (
        _chaos(3, num_envs=6, fake_obs="last", **INTERLEAVED), 20
    ),
    "uint8_images_complete_episodes_agent_steps": (_chaos(
        5, env_config={"obs": "uint8"}, batch_mode="complete_episodes",
        count_steps_by="agent_steps", **INTERLEAVED
    ), 20),
    "multidiscrete_check_env_outputs_fake_obs_zeros": (_chaos(
        6, env_config={"obs": "multidiscrete"}, check_env_outputs=True, fake_obs="zeros"
    ), 20),
    # Rounds of blocks (float32) and of dicts (float64 obs) for one policy.
    "float64_sometimes_fake_obs_sample": (
        _chaos(12, env_config={"obs": "float64_sometimes"}, fake_obs="sample"), 20
    ),
    # Not one array space for all agents: never a block, dicts as before.
    "two_dtypes_own_policies": (_chaos(9, env_config={"obs": "two_dtypes"}, **INTERLEAVED), 0),
    "shapes_per_block_sub_env": (_chaos(
        10, num_envs=6, policies=INTERLEAVED["policies"], policy_mapping_fn=f"{HERE}:by_sub_env"
    ), 20),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chaos_batches_equal_sync(case: str, block_rows: list[int]) -> None:
    cfg_args, min_block_rows = CASES[case]
    compare(cfg_args, block_rows, min_block_rows=min_block_rows)
    if not min_block_rows:
        assert block_rows == []


# ---- faults: sub-envs that crash, runner steps that raise


def test_crashing_sub_envs_restarted_equal_sync(block_rows: list[int]) -> None:
    """A crash's reply is dicts, its worker's next replies blocks again; the restarted
    sub-env drifts out of step with the others of its worker."""
    cfg_args = _chaos(13, num_envs=6, env_config={"crash_rate": 0.04},
                      restart_failed_sub_environments=True, max_consecutive_step_failures=50)
    metrics = compare(cfg_args, block_rows, steps=100)
    assert metrics[0]["num_sub_env_restarts"] + metrics[1]["num_sub_env_restarts"] >= 3


class RaiseOnCall(AgentConnector):
    """A column connector that raises on its ``fail_at``-th call (once)."""

    def __init__(self, ctx: Any, fail_at: int) -> None:
        super().__init__(ctx)
        self.calls = 0
        self.fail_at = fail_at

    def __call__(self, rows: AgentRows) -> AgentRows:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"planned connector failure on call {self.fail_at}")
        return rows


def _connector_raising_once(runner: marl_runner.EnvRunner, call: int) -> None:
    if call == 1:
        pipeline = runner.policy_map.entries["odd"].agent_pipeline
        pipeline.append(RaiseOnCall(pipeline.ctx, fail_at=4))


def _policy_raising_once(runner: marl_runner.EnvRunner, call: int) -> None:
    if call == 1:
        policy = runner.policy_map["even"]
        compute = policy.compute_actions_from_input_dict
        calls = []

        def raising(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("planned policy failure")
            return compute(*args, **kwargs)

        policy.compute_actions_from_input_dict = raising


@pytest.mark.parametrize("between", [_connector_raising_once, _policy_raising_once])
def test_a_step_raising_mid_sample_recovers_as_with_sync(between: Any, block_rows: list[int]) -> None:
    """Rows came from blocks in the step that raised: the interrupted sub-envs' episodes
    are dropped and reset, and sampling goes on exactly as sync's does."""
    metrics = compare(_chaos(14, num_envs=6, **INTERLEAVED), block_rows, calls=3, between=between)
    assert len(metrics[-1]["errors"]) == 1 and metrics[-2]["num_faulty_episodes"] >= 1


def test_random_faults_and_dead_workers_keep_invariants_and_episode_rewards(
    block_rows: list[int],
) -> None:
    """Workers that die (os._exit), steps and resets that raise, restarted: every complete
    episode still carries exactly what RandomFaultEnv gives (a0 0.1, a1 0.2 per round)."""
    cfg = config(
        "marl_runner.bench.envs.random_fault_env:RandomFaultEnv", vectorize="subprocess",
        num_workers=2, num_envs=6, rollout_fragment_length=10, seed=15,
        env_config={"fault_rate": 0.02, "kinds": ["raise", "reset", "exit"], "episode_len": 6},
        restart_failed_sub_environments=True, max_consecutive_step_failures=50,
        max_consecutive_reset_failures=50,
    )
    with marl_runner.EnvRunner(cfg) as runner:
        batches = [runner.sample(num_env_steps=150) for _ in range(2)]
        metrics = runner.get_metrics()
    assert sum(block_rows) >= 20, block_rows
    complete = 0
    for index, batch in enumerate(batches):
        check_batch_invariants(batch, t_from_zero=not index)
        policy_batch = batch.policy_batches["shared"]
        done = policy_batch["terminateds"] | policy_batch["truncateds"]
        for rows in trajectory_rows(policy_batch).values():
            if policy_batch["t"][rows[0]] == 0 and done[rows[-1]]:
                agent = policy_batch["agent_id"][rows[0]]
                got = float(policy_batch["rewards"][rows].astype(np.float64).sum())
                assert np.isclose(got, 0.6 * (1 + (agent == "a1"))), (agent, got)
                complete += 1
    assert complete >= 20 and metrics["num_sub_env_restarts"] >= 1, metrics


# ---- policies changed between samples


def _change_policies(runner: marl_runner.EnvRunner, call: int) -> None:
    if call == 1:
        runner.set_policy_mapping_fn(f"{HERE}:by_sub_env")
    elif call == 2:
        runner.set_policy_mapping_fn({"*": "even"})
        runner.remove_policy("odd")
    elif call == 3:
        runner.add_policy("late", {"model": {"type": "mlp", "hidden": [4]}},
                          {"a[13]": "late", "*": "even"})


def test_policies_added_removed_and_remapped_between_samples_equal_sync(
    block_rows: list[int],
) -> None:
    compare(_chaos(16, num_envs=6, **INTERLEAVED), block_rows, calls=4, between=_change_policies)


# ---- async pools


def _finished_trajectories(batch: Any) -> dict[tuple, dict[str, np.ndarray]]:
    """Per (sub-env, episode, agent index): the env data of each trajectory the batch
    holds from its first row to its last; an episode is named by its first obs (the
    noise in agent index 0's reset obs), the same whichever runner played it."""
    policy_batch = batch.policy_batches["shared"]
    first = (policy_batch["t"] == 0) & (policy_batch["agent_index"] == 0)
    name_of = dict(zip(policy_batch["eps_id"][first].tolist(),
                       policy_batch["obs"][first][:, 2].tolist()))
    done = policy_batch["terminateds"] | policy_batch["truncateds"]
    out = {}
    for (eps_id, agent_index), rows in trajectory_rows(policy_batch).items():
        if policy_batch["t"][rows[0]] == 0 and done[rows[-1]]:
            env_id = int(policy_batch["env_id"][rows[0]])
            out[env_id, name_of[eps_id], agent_index] = {
                column: policy_batch[column][rows]
                for column in ("obs", "new_obs", "rewards", "terminateds", "truncateds", "t")
            }
    return out


def assert_finished_trajectories_equal(expected_batch: Any, got_batch: Any, least: int) -> None:
    """The trajectories both batches finished (at least ``least`` of them) are equal."""
    expected, got = _finished_trajectories(expected_batch), _finished_trajectories(got_batch)
    common = expected.keys() & got.keys()
    assert len(common) >= least, len(common)
    for key in sorted(common):
        for column, values in expected[key].items():
            np.testing.assert_array_equal(values, got[key][column], err_msg=f"{key} {column}")


@pytest.mark.parametrize("per_poll", [{"num_envs_per_poll": 2}, {"async_poll": True}])
def test_async_pools_play_each_sub_env_as_sync_does(per_poll: dict, block_rows: list[int]) -> None:
    """ChaosEnv ignores actions, so each sub-env plays the same episodes whatever the
    timing: each finished episode's trajectories equal sync's."""
    cfg_args = _chaos(17, fake_obs="last")
    sync, _ = _run(cfg_args, "sync", 240, 1)
    parallel, _ = _run({**cfg_args, **per_poll}, "subprocess", 240, 1)
    assert sum(block_rows) >= 20, block_rows
    assert_finished_trajectories_equal(sync[0], parallel[0], 40)


# ---- reward conservation with blocks (in process, so the env's own log can be read)


def _in_process_blocks(monkeypatch: pytest.MonkeyPatch, name: str, blocking: Any) -> list:
    """Registers backend ``name``: ``blocking(sync vector env)``; lists those built."""
    monkeypatch.setattr(vector_backends, "_BACKENDS", dict(vector_backends._BACKENDS))
    built: list = []

    def build(spec: VectorBuild) -> BaseEnv:
        built.append(blocking(build_sync(spec)))
        return built[-1]

    register_vector_backend(name, build, doc="Sync sub-envs handed out as StepBlocks (tests).")
    return built


def test_chaos_rewards_conserved_per_agent_with_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_runner_step_blocks import BlockingVectorEnv

    built = _in_process_blocks(monkeypatch, "chaos_blocks_test", BlockingVectorEnv)
    tracker = EpisodeTracker()
    cfg = config(**{**_chaos(18, num_envs=6, **INTERLEAVED), "env_name": logged_env_name(CHAOS)},
                 vectorize="chaos_blocks_test")
    with marl_runner.EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_env_steps=300)
        check_batch_invariants(batch)
        assert_rewards_conserved(batch, runner, tracker, min_episodes=20)
    assert built[0].rows_given > 100


def test_an_interrupt_while_a_block_is_read_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, block_rows: list[int]
) -> None:
    """A Ctrl-C while a worker's reply is entered as a block: the reply stays unread, the
    retried sample() reads it, and the batches are those of a run never interrupted."""
    cfg_args = _chaos(19, **INTERLEAVED)
    sync, _ = _run(cfg_args, "sync", 80, 2)
    rows = StepBlock.rows
    calls: list[int] = []

    def interrupted(self: StepBlock) -> list:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("planned interrupt while a block is entered")
        return rows(self)

    monkeypatch.setattr(StepBlock, "rows", interrupted)
    cfg = config(**cfg_args, vectorize="subprocess", num_workers=2)
    with marl_runner.EnvRunner(cfg) as runner:
        with pytest.raises(KeyboardInterrupt, match="planned"):
            runner.sample(num_env_steps=80)
        parallel = [runner.sample(num_env_steps=80) for _ in range(2)]
        assert runner.get_metrics()["num_faulty_episodes"] == 0
    assert len(calls) > 3 and sum(block_rows) >= 20
    assert_same_batches(sync, parallel)


# ---- bugs the review found, each fixed


def test_discrete_obs_come_as_dicts_equal_to_sync(block_rows: list[int]) -> None:
    compare(_chaos(20, env_config={"obs": "discrete"}), block_rows, min_block_rows=0)
    assert block_rows == []  # a scalar leaf: never a block


def test_zero_dim_box_obs_equal_sync(block_rows: list[int]) -> None:
    compare(_chaos(23, env_config={"obs": "box0"}, **INTERLEAVED), block_rows)


def test_a_round_without_any_obs_keeps_the_subprocess_worker_alive() -> None:
    cfg_args = dict(env_name=f"{HERE}:NobodyObservesEnv", num_envs=2, rollout_fragment_length=5,
                    seed=21)
    sync, sync_metrics = _run(cfg_args, "sync", 20, 1)
    parallel, parallel_metrics = _run(cfg_args, "subprocess", 20, 1)
    assert_same_batches(sync, parallel)
    assert parallel_metrics[0]["num_faulty_episodes"] == 0


def _reversed_blocks(inner: BaseEnv) -> BaseEnv:
    """A backend of its own (docs/SCALING.md) that puts each round's look-alike sub-envs
    in one StepBlock listed last-first (as one that fills a block by sub-env id while
    its poll is in arrival order might): every BlockRow still names its own row."""
    from tests.test_runner_step_blocks import BlockingVectorEnv, _alike, _block_of, _fits_a_block

    class ReversedBlocks(BlockingVectorEnv):
        def poll_blocks(self) -> PollDicts:
            polled = self.inner.poll()
            fits = [env_id for env_id in polled[0] if _fits_a_block(polled, env_id)]
            run = [env_id for env_id in fits if _alike(polled, fits[0], env_id)][::-1]
            out = tuple(dict(part) for part in polled)
            if len(run) < 2:
                return out
            block = _block_of(polled, run)
            self.rows_given += len(run)
            for row in block.rows():
                out[0][block.env_ids[row.index]] = row
                for part in out[1:]:
                    part.pop(block.env_ids[row.index], None)
            return out

    return ReversedBlocks(inner)


def test_block_rows_polled_in_another_order_than_their_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _in_process_blocks(monkeypatch, "reversed_blocks_test", _reversed_blocks)
    cfg_args = dict(env_name="marl_runner.bench.envs.cheap_env:CheapEnv", num_envs=3, seed=22,
                    rollout_fragment_length=10, env_config={"num_agents": 2, "episode_len": 6})
    sync, _ = _run(cfg_args, "sync", 30, 1)
    reversed_blocks, _ = _run(cfg_args, "reversed_blocks_test", 30, 1)
    assert built[0].rows_given > 10
    assert_same_batches(sync, reversed_blocks)


def ragged_obs(item: Any) -> Any:
    """Per-item: odd agents keep 2 of their 3 obs values, even ones 1 (rows that do not
    stack until the next connector pads them)."""
    item.data["new_obs"] = item.data["new_obs"][: 1 + item.data["agent_index"] % 2]
    return item


class PadRaggedObs(AgentConnector):
    """A column connector that pads each row's obs back to 3 values."""

    def __call__(self, rows: AgentRows) -> AgentRows:
        rows["obs"] = np.stack([np.resize(np.asarray(obs, np.float32), 3) for obs in rows["obs"]])
        return rows


def test_a_per_item_connector_sees_the_same_column_kind_with_blocks(block_rows: list[int]) -> None:
    chain = [{"name": "LambdaAgentConnector", "fn": f"{HERE}:ragged_obs"},
             {"name": f"{HERE}:PadRaggedObs"}, {"name": "ObsPreprocessorConnector"}]
    compare(_chaos(24, policies={"shared": {"agent_connectors": chain}}), block_rows)


def double_obs_in_place(item: Any) -> Any:
    """Per-item: doubles the row's raw obs in place (a careless user connector)."""
    item.data["new_obs"] *= 2
    return item


def test_an_in_place_per_item_connector_gives_the_same_fake_final_obs_with_blocks(
    block_rows: list[int],
) -> None:
    chain = [{"name": "LambdaAgentConnector", "fn": f"{HERE}:double_obs_in_place"},
             {"name": "ObsPreprocessorConnector"}]
    compare(_chaos(25, fake_obs="last", policies={"shared": {"agent_connectors": chain}}),
            block_rows)
