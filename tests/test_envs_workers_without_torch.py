"""Env workers do not load torch: about 190 MB less per worker (marl_runner/__init__.py).

In-process tests cannot see it: tests/conftest.py starts their fork server with the
runner (and torch) loaded, so that test envs defined in test modules start fast. This
test runs a runner in a fresh interpreter, as a user's script does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A script's top level runs again in each worker (multiprocessing does so, to find what
# the script defines): this one imports the runner, and so torch, under its main guard,
# as `marl-runner sample` does (docs/ENVS.md, "__main__:Race").
SCRIPT = """
from pathlib import Path

if __name__ == "__main__":
    from marl_runner import EnvRunner, RunnerConfig

    config = RunnerConfig.from_dict({
        "env": {"name": "marl_runner.bench.envs:CheapEnv", "api": "multi_agent"},
        "num_envs": 2, "vectorize": "subprocess", "num_workers": 2,
        "rollout_fragment_length": 4, "policies": {"shared": {}},
    })
    with EnvRunner(config) as runner:
        assert runner.sample().env_steps() == 8
        for pid in runner.env.worker_pids:
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "libtorch" not in maps, f"env worker {pid} has torch loaded"
    print("OK")
"""


@pytest.mark.slow  # a fresh interpreter that imports torch, and two workers
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps (Linux)")
def test_env_workers_of_a_users_script_do_not_load_torch(tmp_path: Path) -> None:
    script = tmp_path / "sample_with_workers.py"
    script.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr
