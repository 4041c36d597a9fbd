"""Fault injection at the vector-env level: crashes, dead workers, hangs, Ctrl-C, bad output.

Each test drives SyncVectorEnv / SubprocessVectorEnv through poll / send_actions /
try_reset / try_restart with a real failing env and checks that the healthy
sub-envs go on, that the failing one is reported (never silently lost), and
that no worker process or shared-memory block is left behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from marl_runner.envs import EnvError, SubprocessVectorEnv, SyncVectorEnv
from marl_runner.envs.errors import SubEnvTimeoutError
from tests.envs import CrashingEnv, CrashingEnvError, MalformedEnv

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

ACT = {"a0": 0, "a1": 0}


def shm_blocks(pid: int | None = None) -> set[str]:
    """The shared-memory blocks of the vector envs made by process `pid` (default: this one).

    Their names start with `mr<pid>v` (other processes on the machine have their own).
    """
    if not os.path.isdir("/dev/shm"):
        return set()
    prefix = f"mr{os.getpid() if pid is None else pid}v"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


def step_all(vec, env_ids=(0, 1)):
    vec.send_actions({env_id: ACT for env_id in env_ids})
    return vec.poll()


# ---- env creators (module level: they are pickled to worker processes)


def crash_in_step_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=2 if index == 1 else None)


def crash_in_reset_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=None, reset_crashes=2 if index == 1 else 0)


def exit_in_step_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=2 if index == 1 else None, fault="exit")


def hang_in_step_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=2 if index == 1 else None, fault="hang", hang_s=60)


def short_hang_in_step_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=2 if index == 1 else None, fault="hang", hang_s=1.5)


def interrupt_in_step_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=2 if index == 1 else None, fault="interrupt")


def always_crashing(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=1)


def healthy(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=None)


class HangingCloseEnv(CrashingEnv):
    """Its close() never returns (a simulator that does not shut down)."""

    def close(self) -> None:
        time.sleep(3600)


def hanging_close(index: int) -> CrashingEnv:
    return HangingCloseEnv(crash_step=None)


def make_vec(kind: str, make_one, num_envs: int = 2, **kwargs):
    if kind == "sync":
        kwargs.pop("num_workers", None)
        kwargs.pop("step_timeout_s", None)
        return SyncVectorEnv(make_one, num_envs, seed=0, **kwargs)
    return SubprocessVectorEnv(make_one, num_envs, seed=0, **kwargs)


BOTH = pytest.mark.parametrize("kind", ["sync", "subprocess"])


@BOTH
def test_exception_in_step_fails_only_its_sub_env_and_restart_recovers(kind):
    with make_vec(kind, crash_in_step_1, restart_failed=True) as vec:
        vec.poll()
        step_all(vec)
        obs, _, terminateds, *_ = step_all(vec)
        assert isinstance(obs[1], CrashingEnvError) and terminateds[1]["__all__"] is True
        assert set(obs[0]) == {"a0", "a1"} and terminateds[0]["__all__"] is False
        vec.try_restart(1)
        assert set(vec.try_reset(1)[0]) == {"a0", "a1"}
        obs, *_ = step_all(vec)  # the recreated env crashes afresh at its step 2
        assert set(obs[0]) == set(obs[1]) == {"a0", "a1"}


@BOTH
def test_exception_in_reset_is_returned_then_the_reset_succeeds(kind):
    with make_vec(kind, crash_in_reset_1) as vec:
        obs, _, terminateds, *_ = vec.poll()
        assert isinstance(obs[1], CrashingEnvError) and terminateds[1]["__all__"] is True
        error, infos = vec.try_reset(1)
        assert isinstance(error, CrashingEnvError) and infos == {}
        assert set(vec.try_reset(1)[0]) == {"a0", "a1"}
        obs, *_ = step_all(vec)
        assert set(obs) == {0, 1}


def test_os_exit_in_step_is_a_faulty_sub_env_and_the_worker_is_replaced():
    before = shm_blocks()
    with make_vec("subprocess", exit_in_step_1, num_workers=2, restart_failed=True) as vec:
        vec.poll()
        step_all(vec)
        obs, _, terminateds, *_ = step_all(vec)
        assert isinstance(obs[1], EnvError) and "died (exit code 3)" in str(obs[1])
        assert terminateds[1]["__all__"] and set(obs[0]) == {"a0", "a1"}
        old_pid = vec._workers[1].process.pid
        vec.try_restart(1)
        assert vec._workers[1].process.pid != old_pid
        assert set(vec.try_reset(1)[0]) == {"a0", "a1"}
        assert set(step_all(vec)[0]) == {0, 1}
    assert shm_blocks() <= before


def test_sigkill_from_outside_fails_the_workers_sub_envs_and_frees_its_memory():
    before = shm_blocks()
    with make_vec("subprocess", healthy, 4, num_workers=2, restart_failed=True) as vec:
        vec.poll()
        step_all(vec, range(4))
        victim = vec._workers[0]
        os.kill(victim.process.pid, signal.SIGKILL)
        obs, _, terminateds, *_ = step_all(vec, range(4))
        for env_id in (0, 1):
            assert isinstance(obs[env_id], EnvError) and terminateds[env_id]["__all__"]
            assert f"exit code {-signal.SIGKILL}" in str(obs[env_id])
        assert set(obs[2]) == set(obs[3]) == {"a0", "a1"}
        assert victim.block_prefix and not [
            name for name in shm_blocks() if name.startswith(victim.block_prefix)
        ]
        for env_id in (0, 1):
            vec.try_restart(env_id)
            assert set(vec.try_reset(env_id)[0]) == {"a0", "a1"}
        assert all(isinstance(o, dict) for o in step_all(vec, range(4))[0].values())
    assert shm_blocks() <= before


def test_a_hang_past_the_timeout_names_the_sub_env_and_drops_its_worker_mates():
    """Two sub-envs on one worker: sub-env 1 hangs, sub-env 0 loses its episode with it."""
    before = shm_blocks()
    with make_vec(
        "subprocess", hang_in_step_1, 3, num_workers=2, step_timeout_s=0.5, restart_failed=True
    ) as vec:
        assert vec._worker_of_env == [0, 1, 1]
        vec.poll()
        step_all(vec, range(3))
        start = time.monotonic()
        obs, _, terminateds, *_ = step_all(vec, range(3))
        assert time.monotonic() - start < 5
        assert isinstance(obs[1], SubEnvTimeoutError)
        assert "sub-env 1 took longer than sub_env_step_timeout_s=0.5 s" in str(obs[1])
        assert isinstance(obs[2], EnvError) and not isinstance(obs[2], SubEnvTimeoutError)
        assert "sub-env 2: its episode is dropped because its worker 1 was killed" in str(obs[2])
        assert terminateds[1]["__all__"] and terminateds[2]["__all__"]
        assert set(obs[0]) == {"a0", "a1"}  # worker 0 is untouched
        assert not vec._workers[1].process.is_alive()
        for env_id in (1, 2):
            vec.try_restart(env_id)
            assert set(vec.try_reset(env_id)[0]) == {"a0", "a1"}
        assert all(isinstance(o, dict) for o in step_all(vec, range(3))[0].values())
    assert shm_blocks() <= before


def test_a_worker_mate_stepped_before_its_reset_fails_instead_of_running_on_a_fresh_env():
    with make_vec(
        "subprocess", hang_in_step_1, 2, num_workers=1, step_timeout_s=0.5, restart_failed=True
    ) as vec:
        vec.poll()
        step_all(vec)
        obs, *_ = step_all(vec)
        assert isinstance(obs[1], SubEnvTimeoutError) and isinstance(obs[0], EnvError)
        vec.try_restart(1)  # recreates the whole worker: sub-env 0 is a new, unreset env too
        vec.try_reset(1)
        obs, *_ = step_all(vec)  # a caller that forgot sub-env 0's reset
        assert isinstance(obs[0], EnvError) and "stepped without a reset" in str(obs[0])
        assert set(obs[1]) == {"a0", "a1"}


def interrupt_main_thread_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(
        seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
    )
    timer.start()
    return timer


@pytest.mark.slow  # a SIGINT to the main thread: run alone, not beside an xdist worker
def test_ctrl_c_while_polling_keeps_the_protocol_in_step_and_leaks_no_memory():
    """A KeyboardInterrupt while waiting for a slow worker: the retried poll gets
    this round's results (not a stale reply later); stop frees everything."""
    before = shm_blocks()
    vec = make_vec("subprocess", short_hang_in_step_1, 2, num_workers=2)
    try:
        vec.poll()
        step_all(vec)
        vec.send_actions({0: ACT, 1: ACT})
        timer = interrupt_main_thread_after(0.3)
        with pytest.raises(KeyboardInterrupt):
            vec.poll()
        timer.join()
        obs, rewards, *_ = vec.poll()  # sub-env 1's step ends after its 1.5 s hang
        assert set(obs) == {0, 1} and set(obs[1]) == {"a0", "a1"}
        assert rewards[1] == {"a0": pytest.approx(0.1), "a1": pytest.approx(0.2)}
        obs, *_ = step_all(vec)
        assert set(obs) == {0, 1} and all(isinstance(o, dict) for o in obs.values())
    finally:
        vec.stop()
    assert shm_blocks() <= before


@pytest.mark.slow
def test_ctrl_c_during_a_hang_then_stop_kills_the_worker_and_frees_its_memory():
    before = shm_blocks()
    vec = make_vec("subprocess", hang_in_step_1, 2, num_workers=2)  # no timeout
    processes = [worker.process for worker in vec._workers]
    vec.poll()
    step_all(vec)
    vec.send_actions({0: ACT, 1: ACT})
    timer = interrupt_main_thread_after(0.3)
    with pytest.raises(KeyboardInterrupt):
        vec.poll()
    timer.join()
    vec.stop()
    assert not any(process.is_alive() for process in processes)
    assert shm_blocks() <= before


def test_keyboard_interrupt_inside_a_sync_step_keeps_the_other_results():
    vec = make_vec("sync", interrupt_in_step_1, 3, restart_failed=True)
    vec.poll()
    step_all(vec, range(3))
    vec.send_actions({env_id: ACT for env_id in range(3)})
    with pytest.raises(KeyboardInterrupt):
        vec.poll()
    obs, _, terminateds, *_ = vec.poll()  # sub-env 2 is stepped now, sub-env 0 was before
    assert set(obs) == {0, 1, 2}
    assert isinstance(obs[1], EnvError) and "interrupted by KeyboardInterrupt" in str(obs[1])
    assert terminateds[1]["__all__"] and set(obs[0]) == set(obs[2]) == {"a0", "a1"}
    crashed = vec.get_sub_environments()[1]
    assert set(vec.try_reset(1)[0]) == {"a0", "a1"}
    assert vec.get_sub_environments()[1] is not crashed  # state unknown: recreated


def test_keyboard_interrupt_inside_a_worker_step_is_that_sub_envs_crash():
    with make_vec("subprocess", interrupt_in_step_1, num_workers=2) as vec:
        vec.poll()
        step_all(vec)
        obs, *_ = step_all(vec)
        assert isinstance(obs[1], EnvError) and "KeyboardInterrupt" in str(obs[1])
        assert set(obs[0]) == {"a0", "a1"}
        assert set(vec.try_reset(1)[0]) == {"a0", "a1"}  # the worker lives on


@BOTH
def test_every_sub_env_crashing_every_episode_keeps_cycling(kind):
    before = shm_blocks()
    with make_vec(kind, always_crashing, 3, num_workers=2, restart_failed=True) as vec:
        obs, *_ = vec.poll()
        for _ in range(5):
            obs, _, terminateds, *_ = step_all(vec, range(3))
            assert all(isinstance(o, CrashingEnvError) for o in obs.values()) and len(obs) == 3
            for env_id in range(3):
                vec.try_restart(env_id)
                assert set(vec.try_reset(env_id)[0]) == {"a0", "a1"}
        if kind == "subprocess":
            assert all(worker.process.is_alive() for worker in vec._workers)
    assert shm_blocks() <= before


BAD_OUTPUT = [
    ("nan_reward", r"step returned reward nan for agent 'a0'; expected a finite number"),
    ("inf_reward", r"step returned reward -inf for agent 'a0'"),
    ("huge_reward", r"step returned reward 1e\+300 for agent 'a0'; expected a finite number a "
     r"float32 holds"),
    ("int_past_float_reward", r"step returned reward 10{400} for agent 'a0'; expected a finite"),
    ("complex_reward", r"step returned reward 1j \(complex\) for agent 'a0'; expected a finite"),
    ("undeclared_obs", r"step returned an obs for agent 'ghost', which the env never declared"),
    ("undeclared_reward", r"step returned a reward for agent 'ghost', which the env never"),
    ("undeclared_flag", r"step returned a terminated flag for agent 'ghost'"),
    ("no_all_terminated", r"step returned terminateds without the '__all__' key"),
]


class Malformed1:
    """Picklable: sub-env 1 has the defect (from its step ``from_step`` on)."""

    def __init__(self, defect: str, from_step: int = 1) -> None:
        self.defect = defect
        self.from_step = from_step

    def __call__(self, index: int) -> MalformedEnv:
        return MalformedEnv(self.defect if index == 1 else "none", self.from_step)


@BOTH
@pytest.mark.parametrize(("defect", "message"), BAD_OUTPUT)
def test_bad_output_is_a_faulty_sub_env_when_restarts_are_on(kind, defect, message):
    with make_vec(kind, Malformed1(defect), num_workers=2, restart_failed=True) as vec:
        vec.poll()
        vec.send_actions({0: {}, 1: {}})
        obs, _, terminateds, *_ = vec.poll()
        assert isinstance(obs[1], EnvError) and terminateds[1]["__all__"]
        assert "sub-env 1 (MalformedEnv): " in str(obs[1])
        assert re.search(message, str(obs[1]))
        assert obs[0] == {"a0": 0}


@BOTH
@pytest.mark.parametrize("defect", ["nan_reward", "huge_reward"])
def test_a_bad_reward_after_good_steps_is_found(kind, defect):
    """A worker checks a request's rewards in one pass once its sub-envs' keys were seen
    clean: that pass must find what the per-agent check finds."""
    with make_vec(kind, Malformed1(defect, from_step=4), num_workers=1, restart_failed=True) as vec:
        vec.poll()
        for _ in range(3):
            obs, *_ = step_all(vec)
            assert obs == {0: {"a0": 0}, 1: {"a0": 0}}
        obs, _, terminateds, *_ = step_all(vec)
        assert isinstance(obs[1], EnvError) and terminateds[1]["__all__"]
        assert re.search(r"sub-env 1 \(MalformedEnv\): step returned reward", str(obs[1]))


@BOTH
def test_bad_output_raises_when_restarts_are_off_and_nothing_is_lost(kind):
    with make_vec(kind, Malformed1("nan_reward"), 3, num_workers=2) as vec:
        vec.poll()
        vec.send_actions({0: {}, 1: {}, 2: {}})
        with pytest.raises(EnvError, match=r"sub-env 1 \(MalformedEnv\): step returned reward nan"):
            vec.poll()
        obs, rewards, terminateds, *_ = vec.poll()  # the round's other results, and sub-env 1's end
        assert obs[0] == obs[2] == {"a0": 0} and rewards[2] == {"a0": 0.0}
        assert isinstance(obs[1], EnvError) and terminateds[1]["__all__"]


@BOTH
def test_obs_outside_its_space_is_checked_only_when_asked(kind):
    with make_vec(kind, Malformed1("obs_out_of_space"), num_workers=2) as vec:
        vec.poll()
        vec.send_actions({0: {}, 1: {}})
        assert vec.poll()[0][1] == {"a0": 7}
    with make_vec(
        kind, Malformed1("obs_out_of_space"), num_workers=2, check_env_outputs=True
    ) as vec:
        vec.poll()
        vec.send_actions({0: {}, 1: {}})
        with pytest.raises(
            EnvError,
            match=r"sub-env 1 \(MalformedEnv\): step returned an obs for agent 'a0' outside its "
            r"observation space Discrete\(2\): got int",
        ):
            vec.poll()


WORKER_SCRIPT = """
import os, sys, time
from marl_runner.envs import SubprocessVectorEnv
from tests.envs import CrashingEnv

def slow(index):
    return CrashingEnv(crash_step=2, fault="hang", hang_s=0.5)

if __name__ == "__main__":
    vec = SubprocessVectorEnv(slow, 2, seed=0, num_workers=2)
    vec.poll()
    vec.send_actions({0: {"a0": 0, "a1": 0}, 1: {"a0": 0, "a1": 0}})
    vec.poll()
    vec.send_actions({0: {"a0": 0, "a1": 0}, 1: {"a0": 0, "a1": 0}})
    print(os.getpid(), " ".join(str(w.process.pid) for w in vec._workers), flush=True)
    os._exit(0)  # the parent dies while both workers are inside a step
"""


def test_workers_exit_quietly_when_the_parent_dies(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(WORKER_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    parent, *pids = [int(pid) for pid in result.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    time.sleep(0.3)  # the workers' stderr is the parent's: let them write, if they would
    assert not any(_alive(pid) for pid in pids)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    assert not shm_blocks(parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # about 10 s: the workers' close deadline, then the local env's
def test_stop_is_bounded_when_every_envs_close_hangs():
    """Four workers whose envs never close, and the local env read for spaces: stop()
    used to wait 5 s per worker, one after another, then forever on the local env. Now
    the workers share one 5 s deadline, and the local env gets 5 s of its own."""
    vec = make_vec("subprocess", hanging_close, num_envs=4, num_workers=4)
    vec.get_observation_space("a0")  # the local env exists
    step_all(vec, range(4))
    pids = vec.worker_pids
    start = time.monotonic()
    vec.stop()
    assert time.monotonic() - start < 16  # (it was 4 x 5 s, and then no end)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped


def test_a_ctrl_c_during_the_shutdown_wait_kills_every_worker_at_once():
    """(Found by a probe.) A Ctrl-C in the 5 s wait for workers whose envs never close
    killed only the worker waited for; the interpreter's exit then joined the others
    (which ignore SIGINT and SIGTERM) forever."""
    vec = make_vec("subprocess", hanging_close, num_envs=3, num_workers=3)
    step_all(vec, range(3))
    pids = vec.worker_pids
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        vec.stop()
    assert time.monotonic() - start < 4
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
