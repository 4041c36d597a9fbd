"""The benchmark suite runs end to end (``--smoke``) and its JSON has the promised shape.

Speeds are never asserted: CI machines vary too much for that.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from marl_runner.bench.cli import main
from marl_runner.bench.workloads import DEFAULT_WORKLOADS, SUBPROCESS_WORKLOADS

PERF_KEYS = {
    "mean_raw_obs_processing_ms",
    "mean_inference_ms",
    "mean_action_processing_ms",
    "mean_env_wait_ms",
}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["--smoke", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _positive(value: float) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_smoke_throughput_covers_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    report = _run(capsys)

    assert report["meta"]["smoke"] is True
    assert report["meta"]["torch_threads"] == 1
    assert [row["name"] for row in report["workloads"]] == list(DEFAULT_WORKLOADS)
    for row in report["workloads"]:
        for side in ("runner", "bare"):
            assert _positive(row[side]["agent_steps_per_s"]), (row["name"], side)
            assert row[side]["agent_steps"] > 0
            assert PERF_KEYS <= set(row[side]["perf"])
        assert _positive(row["ratio"])
        assert isinstance(row["meets_target"], bool)
        assert row["runner_max_rss_mb"] > 0 and row["peak_rss_mb"] > 0
        assert row["vectorize"] == "sync"


def test_smoke_against_a_torch_bare_loop_has_no_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = _run(capsys, "--bare-forward", "torch", "cheap", "connect_four")

    assert report["meta"]["bare_forward"] == "torch"
    for row in report["workloads"]:
        assert _positive(row["bare"]["agent_steps_per_s"]) and _positive(row["ratio"])
        assert row["target_ratio"] is None and row["meets_target"] is None


@pytest.mark.slow
def test_smoke_population_reports_both_bare_loops_and_memory_per_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = _run(capsys, "--population", "cheap512")
    assert [(row["name"], row["vectorize"]) for row in report["population"]] == [
        ("cheap512", "sync"), ("cheap512", "subprocess"),
    ]
    for row in report["population"]:
        assert set(row["agent_steps_per_s"]) == {"runner", "numpy", "torch"}
        assert all(_positive(rate) for rate in row["agent_steps_per_s"].values())
        assert all(_positive(us) for us in row["us_per_agent_step"].values())
        memory = row["memory"]
        # 16 float32 obs, new_obs: 128 bytes of the row; the other columns add the rest.
        assert 128 < memory["bytes_per_row"] < 400
        assert memory["batch_mb"] > 0 and memory["rows_per_batch"] > 0
        # The runner's own share: its peak beyond the build less the bare loop's, per batch.
        own_mb = memory["peak_rss_mb"] - memory["built_rss_mb"] - memory["bare_peak_beyond_build_mb"]
        assert memory["own_peak_per_batch"] == pytest.approx(own_mb / memory["batch_mb"])
        assert memory["rounds"] > 0


def test_the_numpy_bare_loop_acts_like_the_torch_one() -> None:
    """Same model and weights: the numpy forward's logits are the torch module's, and both
    honour the action mask (Connect Four's Dict obs)."""
    from marl_runner.bench.bare_loop import BareLoop
    from marl_runner.bench.workloads import get_workload

    config = get_workload("connect_four").config()
    torch_loop, numpy_loop = BareLoop(config), BareLoop(config, "numpy")
    try:
        for policy_id, policy in numpy_loop.policies.items():
            obs, mask = policy.prepare(
                [{"observation": np.full((6, 7, 2), v, np.int8), "action_mask": m}
                 for v, m in ((0, np.ones(7, np.int8)), (1, np.eye(7, dtype=np.int8)[3]))]
            )
            torch_policy = torch_loop.policies[policy_id]
            with torch.inference_mode():
                expected, _ = torch_policy.model(torch.from_numpy(obs))
            np.testing.assert_allclose(policy.numpy_model(obs)[0], expected.numpy(), atol=1e-6)
            assert policy.act(obs, mask)[1] == 3 and torch_policy.act(obs, mask)[1] == 3
        assert numpy_loop.run(min_rounds=5).agent_steps > 0
    finally:
        torch_loop.stop()
        numpy_loop.stop()
    with pytest.raises(ValueError, match="forward must be one of"):
        BareLoop(config, "jax")


@pytest.mark.slow
def test_smoke_memory_subprocess_and_profile(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    out = tmp_path / "bench.json"
    report = _run(
        capsys,
        "cheap",
        "connect_four",
        "--memory",
        "--memory-backends",
        "sync",
        "--subprocess-speedup",
        "--profile",
        "--profile-top",
        "5",
        "--profile-dir",
        str(tmp_path / "prof"),
        "--output",
        str(out),
    )

    assert json.loads(out.read_text()) == report
    assert report["workloads"] == []  # modes given: no throughput unless asked for
    assert report["memory"]["workload"] == "cheap"
    (memory,) = report["memory"]["backends"]
    assert memory["backend"] == "sync" and [p["role"] for p in memory["processes"]] == ["main"]
    assert memory["end_agent_steps"] > memory["start_agent_steps"] > 0
    assert memory["start_rss_mb"] > 0 and isinstance(memory["ok"], bool)
    assert [row["name"] for row in report["subprocess"]] == list(SUBPROCESS_WORKLOADS)
    for row in report["subprocess"]:
        assert row["num_workers"] == 2
        assert _positive(row["sync"]["agent_steps_per_s"])
        assert _positive(row["subprocess"]["agent_steps_per_s"])
        assert _positive(row["speedup"])
    assert [p["name"] for p in report["profiles"]] == ["cheap", "connect_four"]
    for profile in report["profiles"]:
        assert 0 < len(profile["top"]) <= 5
        assert (tmp_path / "prof" / f"{profile['name']}.prof").exists()


def test_smoke_runner_on_subprocess_vector_env(capsys: pytest.CaptureFixture[str]) -> None:
    report = _run(capsys, "spread", "--vectorize", "subprocess", "--num-workers", "2")

    (row,) = report["workloads"]
    assert row["vectorize"] == "subprocess" and row["num_workers"] == 2
    assert _positive(row["runner"]["agent_steps_per_s"])
    assert _positive(row["bare"]["agent_steps_per_s"])


def test_unknown_workload_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke", "nope"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err


def test_smoke_process_speedup_and_slow_sub_env(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    report = _run(
        capsys, "spread", "--process-speedup", "--slow-sub-env", "--output", str(out)
    )

    assert json.loads(out.read_text()) == report
    assert report["workloads"] == []
    (row,) = report["process_speedup"]  # only the named workload among kaz, spread, cheap
    assert row["name"] == "spread"
    for key in ("bare_speedup", "runner_speedup", "runner_subprocess_over_bare_sync"):
        assert _positive(row[key]), key
    slow = report["slow_sub_env"]
    assert [(r["num_envs_per_poll"], r["slow_sub_env"]) for r in slow] == [
        (3, False), (3, True), (2, False), (2, True),
    ]
    assert all(r["others_env_steps_per_s"] > 0 for r in slow)


def test_all_includes_the_process_modes_but_not_the_soaks(monkeypatch) -> None:
    import marl_runner.bench.cli as cli

    args = cli.build_parser().parse_args(["--all"])
    ran = []
    measured = (
        "compare_workload", "memory_growth", "subprocess_speedup", "vector_speedup", "slow_sub_env"
    )
    for name in measured:
        monkeypatch.setattr(cli, name, lambda *a, _name=name, **k: ran.append(_name) or [])
    sections = cli._measure(args, ["spread"], cli._settings(args), lambda _: None)
    assert set(ran) == set(measured)
    assert {"workloads", "memory", "subprocess", "process_speedup", "slow_sub_env"} == set(sections)
    assert "profiles" not in sections


@pytest.mark.parametrize(("equal", "code"), [(True, 0), (False, 1)])
def test_soak_serve_runs_alone_and_its_exit_code_says_if_anything_was_lost(
    monkeypatch, capsys, tmp_path: Path, equal: bool, code: int
) -> None:
    from marl_runner.bench import soak_serve

    seen = {}

    def fake_run(minutes: float, **kwargs) -> dict:
        seen.update(minutes=minutes, **kwargs)
        return {
            "minutes": minutes, "equal": equal, "server_exit_code": 0, "client_errors": 0,
            "table": {"episodes": 3, "env_steps": 30},
            "written": {"episodes": 3, "env_steps": 30, "batches": 3},
            "clients_finished": {"episodes": 3, "env_steps": 30},
            "clients_killed": 0, "hostile_answers": {}, "server_start": {}, "server_end": {},
            "server_per_minute": [{"rss_mb": 1.0, "threads": 2, "open_files": 3}],
        }

    monkeypatch.setattr(soak_serve, "run_soak_serve", fake_run)
    out = tmp_path / "deep" / "soak.json"
    assert main(["--soak-serve", "0.5", "--seed", "4", "--output", str(out)]) == code
    assert seen["minutes"] == 0.5 and seen["seed"] == 4
    assert json.loads(out.read_text())["equal"] is equal
    printed = capsys.readouterr().out
    assert "server RSS MB after each minute: [1.0]" in printed
    assert "server open files after each minute: [3]" in printed


def test_process_round_times_table_shows_each_subprocess_sampler() -> None:
    from rich.console import Console

    from marl_runner.bench.report import process_round_times_table

    times = {"main_wait": 3.76, "main_ipc": 0.17, "worker_env": 3.4, "worker_busy": 3.48}
    row = {
        "name": "kaz",
        "per_round_ms": {
            "bare_subprocess": {**times, "pickled_share": 0.0},
            "runner_subprocess": {**times, "main_ipc": 0.66, "pickled_share": 0.25},
        },
    }
    console = Console(record=True, width=200)
    console.print(process_round_times_table([row]))
    text = console.export_text()
    assert "bare subprocess" in text and "runner subprocess" in text
    assert "0.66" in text and "25%" in text and "3.76" in text


@pytest.mark.slow
def test_smoke_external_serves_both_client_settings_and_writes_every_episode(tmp_path) -> None:
    out = tmp_path / "external.json"
    assert main(["--smoke", "--external", "--output", str(out)]) == 0
    served = json.loads(out.read_text())["served"]
    assert [(row["clients"], row["processes"]) for row in served] == [(16, 2), (64, 4)]
    for row in served:
        assert row["errors"] == 0, row["first_errors"]
        assert row["episodes_written"] == row["episodes_finished"] > 0
        assert _positive(row["calls_per_s"]) and row["p50_ms"] <= row["p99_ms"]


def test_the_external_table_shows_the_replaced_stack_beside_the_measured_one() -> None:
    from rich.console import Console

    from marl_runner.bench.external import print_external

    row = {"clients": 16, "processes": 2, "calls_per_s": 1234.0, "p50_ms": 8.1, "p99_ms": 17.9,
           "errors": 0, "episodes_finished": 5, "episodes_written": 5, "server_cpu_us": 400.0,
           "client_cpu_us": 300.0, "first_errors": []}
    console = Console(record=True, width=200)
    print_external(console, {"duration_s": 10, "served": [row], "codec": []})
    text = console.export_text()
    assert "1,234" in text and "17.9" in text  # measured
    assert "hand-built stack" in text and "745" in text and "69.4" in text  # the one replaced
