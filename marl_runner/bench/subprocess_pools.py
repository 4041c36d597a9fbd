"""Process backends measured: subprocess vs sync speed-up, and one slow sub-env in eight.

`vector_speedup` times the bare loop and the runner, each over `sync` and over
`subprocess` sub-envs, windows taking turns, and reports env steps/s and the
ratios the issue sets targets for (KAZ and simple_spread: subprocess runner
>= 1.85x the sync bare loop; cheap: subprocess runner >= 0.8x the sync runner),
with each subprocess sampler's time per round split into main-process wait and
IPC and one worker's env and other step work (`per_round_ms`).

`slow_sub_env` runs eight sub-envs of which one is 10x slower (`SlowEnv`), with
and without async pools (`num_envs_per_poll`), and reports the env steps/s of
the seven others: async pools must keep them within 10% of what they reach
with no slow sub-env at all.

Both are plain functions returning dicts (and a `print_*` helper for a table),
for the bench CLI to wire as flags. Not timed tests: measurements to read.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

from marl_runner.bench.envs import CheapEnv
from marl_runner.envs import SubprocessVectorEnv

SPEEDUP_WORKLOADS = ("kaz", "spread", "cheap")
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def vector_speedup(
    workloads: tuple[str, ...] = SPEEDUP_WORKLOADS,
    *,
    duration_s: float = 5.0,
    warmup_s: float = 2.0,
    repeats: int = 3,
    num_workers: int = 2,
    rollout_fragment_length: int = 200,
    progress: Progress = _quiet,
) -> list[dict[str, Any]]:
    """Env steps/s of bare loop and runner, sync vs subprocess, per workload (medians).

    All four (bare loop and runner, each over sync and subprocess) stay open
    for the whole workload and their windows take turns (each repeat in
    the reverse order of the last), so that the other load on a shared
    machine, coming and going, hits sync and subprocess alike.
    """
    # Imported here: worker processes import this module for SlowSubEnv, and need no torch.
    from marl_runner.bench.bare_loop import BareLoop
    from marl_runner.bench.measure import time_runner
    from marl_runner.bench.workloads import get_workload
    from marl_runner.policy.torch_utils import limit_inference_threads
    from marl_runner.sampling.runner import EnvRunner

    limit_inference_threads(1)  # as the runner does (torch_threads: 1), for the bare loop too
    rows = []
    for name in workloads:
        workload = get_workload(name)
        configs = {
            "sync": workload.config(
                vectorize="sync", rollout_fragment_length=rollout_fragment_length
            ),
            "subprocess": workload.config(
                vectorize="subprocess",
                num_workers=num_workers,
                rollout_fragment_length=rollout_fragment_length,
            ),
        }
        windows: dict[str, Callable[[float], float]] = {}
        vector_envs: dict[str, Any] = {}
        with contextlib.ExitStack() as stack:
            for kind in ("bare", "runner"):
                for mode, config in configs.items():
                    if kind == "bare":
                        bare = BareLoop(config)
                        stack.callback(bare.stop)
                        windows[f"bare_{mode}"] = functools.partial(_bare_window, bare)
                        vector_envs[f"bare_{mode}"] = bare.env
                    else:
                        runner = stack.enter_context(EnvRunner(config))
                        windows[f"runner_{mode}"] = functools.partial(
                            _runner_window, time_runner, runner
                        )
                        vector_envs[f"runner_{mode}"] = runner.env
            for key, window in windows.items():
                progress(f"{name}: warm-up {key}")
                window(warmup_s)
            for key in ("bare_subprocess", "runner_subprocess"):
                vector_envs[key].reset_stats()
            rates: dict[str, list[float]] = {key: [] for key in windows}
            order = list(windows)
            for repeat in range(repeats):
                for key in order if repeat % 2 == 0 else order[::-1]:
                    progress(f"{name}: {key} window {repeat + 1}")
                    rates[key].append(windows[key](duration_s))
            breakdowns = {
                key: round_breakdown(vector_envs[key].stats, num_workers)
                for key in ("bare_subprocess", "runner_subprocess")
            }
        row: dict[str, Any] = {"name": name, "num_envs": workload.num_envs}
        row.update({key: statistics.median(values) for key, values in rates.items()})
        row["per_round_ms"] = breakdowns
        row["bare_speedup"] = row["bare_subprocess"] / row["bare_sync"]
        row["runner_speedup"] = row["runner_subprocess"] / row["runner_sync"]
        row["runner_subprocess_over_bare_sync"] = row["runner_subprocess"] / row["bare_sync"]
        rows.append(row)
    return rows


def round_breakdown(stats: Any, num_workers: int) -> dict[str, float]:
    """Milliseconds per round (one poll: a step of every sub-env) from a
    `SubprocessStats`: the main process waiting for replies and doing IPC, one
    worker's time in env steps and in all its step work (`worker_busy` minus
    `worker_env` is its IPC), so a speed-up short of the target says where it went."""
    polls = max(stats.polls, 1)
    per_worker = polls * max(num_workers, 1)
    return {
        "main_wait": stats.parent_wait_s * 1e3 / polls,
        "main_ipc": stats.parent_ipc_s * 1e3 / polls,
        "worker_env": stats.worker_env_s * 1e3 / per_worker,
        "worker_busy": stats.worker_busy_s * 1e3 / per_worker,
        "pickled_share": stats.pickled_env_steps / max(stats.env_steps, 1),
    }


def _bare_window(bare: Any, duration_s: float) -> float:
    return _env_steps_per_s(bare.run(duration_s=duration_s))


def _runner_window(time_runner: Callable[..., Any], runner: Any, duration_s: float) -> float:
    window = time_runner(runner, duration_s)
    return window.env_steps / window.elapsed_s if window.elapsed_s > 0 else float("nan")


def _env_steps_per_s(result: Any) -> float:
    return result.env_steps / result.elapsed_s if result.elapsed_s > 0 else float("nan")


def print_speedup(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'workload':<10}{'bare sync':>12}{'bare subp':>12}{'ratio':>8}"
        f"{'runner sync':>13}{'runner subp':>13}{'ratio':>8}{'r.subp/b.sync':>15}"
        "   (env steps/s)"
    )
    for r in rows:
        print(
            f"{r['name']:<10}{r['bare_sync']:>12,.0f}{r['bare_subprocess']:>12,.0f}"
            f"{r['bare_speedup']:>8.2f}{r['runner_sync']:>13,.0f}{r['runner_subprocess']:>13,.0f}"
            f"{r['runner_speedup']:>8.2f}{r['runner_subprocess_over_bare_sync']:>15.2f}"
        )
    print(
        f"{'per round (ms)':<24}{'main wait':>10}{'main IPC':>10}{'worker env':>12}"
        f"{'worker busy':>13}{'pickled':>9}"
    )
    for r in rows:
        for key, b in r["per_round_ms"].items():
            print(
                f"{r['name'] + ' ' + key.replace('_subprocess', ''):<24}{b['main_wait']:>10.3f}"
                f"{b['main_ipc']:>10.3f}{b['worker_env']:>12.3f}{b['worker_busy']:>13.3f}"
                f"{b['pickled_share']:>9.1%}"
            )


class SlowSubEnv(CheapEnv):
    """CheapEnv (2 agents) whose step takes `step_s` more: a simulator's own time, spent
    waiting (as on a remote simulator), so that it costs no CPU the others could use."""

    def __init__(self, step_s: float) -> None:
        super().__init__(num_agents=2, episode_len=50)
        self.step_s = step_s

    def step(self, actions: Any) -> Any:
        time.sleep(self.step_s)
        return super().step(actions)


def make_slow_sub_env(index: int, step_s: float, slow_index: int | None) -> SlowSubEnv:
    """Sub-env `index`: `step_s` a step, 10x that for `slow_index`."""
    return SlowSubEnv(step_s * (10 if index == slow_index else 1))


def slow_sub_env(
    *,
    num_envs: int = 8,
    step_s: float = 0.002,
    num_envs_per_poll: int = 4,
    duration_s: float = 5.0,
    warmup_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Env steps/s of the sub-envs other than sub-env 0, with sub-env 0 as fast as they
    are or 10x slower, each with every poll waiting for all sub-envs and with async
    pools (`num_envs_per_poll`). One worker per sub-env, so a slow sub-env shares its
    worker with none. `others_kept`: the others' rate over theirs when every poll
    waits for all and no sub-env is slow (the target: >= 0.9 with async pools)."""
    rows = []
    baseline = None
    for per_poll in (num_envs, num_envs_per_poll):
        for slow in (False, True):
            make_one = functools.partial(
                make_slow_sub_env, step_s=step_s, slow_index=0 if slow else None
            )
            with SubprocessVectorEnv(
                make_one, num_envs, seed=0, num_workers=num_envs, num_envs_per_poll=per_poll
            ) as vec:
                _drive(vec, warmup_s)
                counts, elapsed = _drive(vec, duration_s)
            others = sum(counts[1:]) / elapsed
            baseline = baseline or others
            rows.append(
                {
                    "num_envs_per_poll": per_poll,
                    "slow_sub_env": slow,
                    "others_env_steps_per_s": others,
                    "slow_env_steps_per_s": counts[0] / elapsed,
                    "others_kept": others / baseline,
                }
            )
    return rows


def _drive(vec: SubprocessVectorEnv, duration_s: float) -> tuple[list[int], float]:
    """Step every sub-env as soon as it is polled (action 0 for every agent) for
    `duration_s`; env steps per sub-env and the time taken."""
    counts = [0] * vec.num_envs
    start = perf_counter()
    while perf_counter() - start < duration_s:
        obs, _, terminateds, truncateds, _, _ = vec.poll()
        actions = {}
        for env_id, env_obs in obs.items():
            if isinstance(env_obs, BaseException):
                raise RuntimeError(f"sub-env {env_id} failed in the benchmark") from env_obs
            if terminateds[env_id]["__all__"] or truncateds[env_id]["__all__"]:
                env_obs, _ = vec.try_reset(env_id)
            counts[env_id] += 1
            actions[env_id] = dict.fromkeys(env_obs, 0)
        vec.send_actions(actions)
    return counts, perf_counter() - start


def print_slow_sub_env(rows: list[dict[str, Any]]) -> None:
    print(f"{'per poll':>9}{'slow env':>10}{'others steps/s':>16}{'slow steps/s':>14}{'kept':>7}")
    for r in rows:
        print(
            f"{r['num_envs_per_poll']:>9}{'yes' if r['slow_sub_env'] else 'no':>10}"
            f"{r['others_env_steps_per_s']:>16,.0f}{r['slow_env_steps_per_s']:>14,.0f}"
            f"{r['others_kept']:>7.2f}"
        )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["slow"]:
        print_slow_sub_env(slow_sub_env())
    else:
        names = tuple(sys.argv[1:]) or SPEEDUP_WORKLOADS
        print_speedup(vector_speedup(names, duration_s=3.0, warmup_s=1.0, progress=print))
