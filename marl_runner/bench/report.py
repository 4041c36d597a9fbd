"""Rich tables for the terminal; the same data goes out as JSON with ``--json``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from marl_runner.bench.machine_load import load_note

PERF_COLUMNS = (
    ("mean_env_wait_ms", "env wait"),
    ("mean_raw_obs_processing_ms", "obs proc."),
    ("mean_inference_ms", "inference"),
    ("mean_action_processing_ms", "action proc."),
)


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _verdict(row: dict[str, Any]) -> str:
    if row["meets_target"] is None:
        return "-"
    return "[green]yes[/]" if row["meets_target"] else "[red]no[/]"


def throughput_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Runner vs bare loop (agent steps/s, median of repeats)")
    least_work = any("least_work" in row for row in rows)
    columns = [
        ("workload", "left"),
        ("envs", "right"),
        ("vectorize", "left"),
        ("runner", "right"),
        ("bare loop", "right"),
        ("ratio", "right"),
        ("target", "right"),
        ("met", "center"),
    ]
    if least_work:
        columns += [("least-work loop", "right"), ("its ratio", "right")]
    for name, justify in (*columns, ("runner RSS MB", "right"), ("peak RSS MB", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        cells = [
            row["name"],
            str(row["num_envs"]),
            row["vectorize"],
            _rate(row["runner"]["agent_steps_per_s"]),
            _rate(row["bare"]["agent_steps_per_s"]),
            f"{row['ratio']:.2f}",
            "-" if row["target_ratio"] is None else f">= {row['target_ratio']:.2f}",
            _verdict(row),
        ]
        if least_work:
            cells += [_rate(row["least_work"]["agent_steps_per_s"]), f"{row['least_work_ratio']:.2f}"]
        table.add_row(*cells, f"{row['runner_max_rss_mb']:.0f}", f"{row['peak_rss_mb']:.0f}")
    return table


def perf_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title="Where the time goes (ms per round; runner: its perf stats; "
        "wall: timed window / rounds)"
    )
    table.add_column("workload")
    table.add_column("side")
    for _, label in PERF_COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("sum", justify="right")
    table.add_column("wall", justify="right")
    for row in rows:
        for side in ("runner", "bare"):
            perf = row[side]["perf"]
            values = [perf.get(key, 0.0) for key, _ in PERF_COLUMNS]
            table.add_row(
                row["name"],
                "bare loop" if side == "bare" else side,
                *(f"{v:.3f}" for v in values),
                f"{sum(values):.3f}",
                f"{row[side]['wall_ms_per_round']:.3f}",
            )
    return table


def _ok(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]no[/]"


def memory_table(result: dict[str, Any]) -> Table:
    """One row per process of each backend (main, env workers, actors), then their sum."""
    limit = result["limit_pct"]
    table = Table(
        title=f"RSS growth on workload {result['workload']!r}, per backend and process "
        f"(limit {limit:g}% per process)"
    )
    for name in ("backend", "process", "pid"):
        table.add_column(name)
    for name in ("from (agent steps)", "RSS MB", "to (agent steps)", "RSS MB ", "growth"):
        table.add_column(name, justify="right")
    table.add_column(f"< {limit:g}%", justify="center")
    skipped = [f"{b['backend']} skipped: {b['skipped']}" for b in result["backends"] if "skipped" in b]
    table.caption = "; ".join(skipped) or None
    for backend in result["backends"]:
        name = backend["backend"]
        if "skipped" in backend:
            continue
        steps = (f"{backend['start_agent_steps']:,}", f"{backend['end_agent_steps']:,}")
        rows = list(backend["processes"])
        if len(rows) > 1:
            rows.append({**backend, "role": "all (sum)", "pid": ""})
        for row in rows:
            table.add_row(
                name,
                row["role"],
                str(row["pid"]),
                steps[0],
                f"{row['start_rss_mb']:.1f}",
                steps[1],
                f"{row['end_rss_mb']:.1f}",
                f"{row['growth_pct']:+.2f}%",
                _ok(row["ok"]),
            )
    return table


def subprocess_table(rows: list[dict[str, Any]]) -> Table:
    modes = [m for m in ("subprocess", "subprocess_async") if any(m in row for row in rows)]
    table = Table(title="Runner: vectorize subprocess vs sync (agent steps/s; cores used)")
    columns = ["workload", "envs", "workers", "sync"]
    for mode in modes:
        short = "async" if mode == "subprocess_async" else "subprocess"
        columns += [short, f"speedup {short}"]
    for name in columns:
        table.add_column(name, justify="left" if name == "workload" else "right")
    for row in rows:
        cells = [
            row["name"],
            str(row["num_envs"]),
            str(row["num_workers"]),
            _mode_cell(row["sync"]),
        ]
        for mode, key in (("subprocess", "speedup"), ("subprocess_async", "speedup_async")):
            if mode in modes:
                present = mode in row
                cells += [
                    _mode_cell(row[mode]) if present else "-",
                    f"{row[key]:.2f}x" if present else "-",
                ]
        table.add_row(*cells)
    return table


def _mode_cell(result: dict[str, Any]) -> str:
    cores = result.get("cpu_cores")
    return _rate(result["agent_steps_per_s"]) + (f" ({cores:.2f})" if cores is not None else "")


_BREAKDOWN_COLUMNS = (
    ("wall", "wall_ms"),
    ("main busy", "main_busy_ms"),
    ("main IPC", "main_ipc_ms"),
    ("main waits", "main_wait_ms"),
    ("worker env", "worker_env_ms"),
    ("worker ovh.", "worker_overhead_ms"),
    ("worker idle", "worker_idle_ms"),
    ("polls", "polls_per_round"),
)


def subprocess_breakdown_table(rows: list[dict[str, Any]]) -> Table:
    """ms per round (one step of every sub-env); worker columns are per worker."""
    table = Table(
        title="Subprocess: ms per round (every sub-env stepped once); worker columns per worker; "
        "sync: runner env wait"
    )
    for name in ("workload", "mode", "sync env wait", *(c for c, _ in _BREAKDOWN_COLUMNS)):
        table.add_column(name, justify="left" if name in ("workload", "mode") else "right")
    for row in rows:
        sync_wait = row["sync"]["perf"].get("mean_env_wait_ms", float("nan"))
        for mode in ("subprocess", "subprocess_async"):
            breakdown = (row.get(mode) or {}).get("breakdown")
            if not breakdown:
                continue
            table.add_row(
                row["name"],
                "async" if mode == "subprocess_async" else "default",
                f"{sync_wait:.2f}",
                *(f"{breakdown[key]:.2f}" for _, key in _BREAKDOWN_COLUMNS),
            )
    return table


#: ``--process-speedup`` columns: header, row key, whether the value is a ratio.
_PROCESS_SPEEDUP_COLUMNS = (
    ("bare sync", "bare_sync", False),
    ("bare subp.", "bare_subprocess", False),
    ("bare ratio", "bare_speedup", True),
    ("runner sync", "runner_sync", False),
    ("runner subp.", "runner_subprocess", False),
    ("runner ratio", "runner_speedup", True),
    ("runner subp. / bare sync", "runner_subprocess_over_bare_sync", True),
)


def process_speedup_table(rows: list[dict[str, Any]]) -> Table:
    """``--process-speedup``: env steps/s per side and vector env, and the ratios."""
    table = Table(title="Bare loop and runner over sync and subprocess sub-envs (env steps/s)")
    table.add_column("workload")
    table.add_column("envs", justify="right")
    for name, _, _ in _PROCESS_SPEEDUP_COLUMNS:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            row["name"],
            str(row["num_envs"]),
            *(
                f"{row[key]:.2f}x" if ratio else _rate(row[key])
                for _, key, ratio in _PROCESS_SPEEDUP_COLUMNS
            ),
        )
    return table


#: ``--process-speedup`` per-round columns: header, key of ``per_round_ms``.
_ROUND_TIME_COLUMNS = (
    ("main waits", "main_wait"),
    ("main IPC", "main_ipc"),
    ("worker env", "worker_env"),
    ("worker busy", "worker_busy"),
)


def process_round_times_table(rows: list[dict[str, Any]]) -> Table:
    """``--process-speedup``: where a subprocess sampler's round goes, so a speed-up short
    of its target says whether the main process, IPC or the workers' envs hold it."""
    table = Table(
        title="Subprocess samplers: ms per round (worker columns: one worker); pickled: "
        "share of steps"
    )
    for name in ("workload", "sampler", *(c for c, _ in _ROUND_TIME_COLUMNS), "pickled"):
        table.add_column(name, justify="left" if name in ("workload", "sampler") else "right")
    for row in rows:
        for sampler, times in (row.get("per_round_ms") or {}).items():
            table.add_row(
                row["name"],
                sampler.replace("_", " "),
                *(f"{times[key]:.2f}" for _, key in _ROUND_TIME_COLUMNS),
                f"{times['pickled_share']:.0%}",
            )
    return table


def slow_sub_env_table(rows: list[dict[str, Any]]) -> Table:
    """``--slow-sub-env``: what the other sub-envs keep when one is slow."""
    table = Table(
        title="One slow sub-env: the others' env steps/s (kept: over no slow sub-env, "
        "every poll waiting for all)"
    )
    for name in ("per poll", "slow sub-env", "others steps/s", "slow steps/s", "kept"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            str(row["num_envs_per_poll"]),
            "yes" if row["slow_sub_env"] else "no",
            _rate(row["others_env_steps_per_s"]),
            _rate(row["slow_env_steps_per_s"]),
            f"{row['others_kept']:.2f}",
        )
    return table


def profile_table(result: dict[str, Any], key: str = "top") -> Table:
    scope = "all code" if key == "top" else "runner code only"
    table = Table(
        title=f"cProfile of the runner on {result['name']!r}, {scope}: top by own time "
        f"({result['agent_steps_per_s_profiled']:,.0f} agent steps/s while profiled)"
    )
    for name in ("function", "calls", "tottime s", "% of all", "cumtime s"):
        table.add_column(name, justify="left" if name == "function" else "right")
    for row in result[key]:
        table.add_row(
            row["function"],
            f"{row['ncalls']:,}",
            f"{row['tottime_s']:.3f}",
            f"{row['tottime_pct']:.1f}",
            f"{row['cumtime_s']:.3f}",
        )
    return table


def population_table(rows: list[dict[str, Any]]) -> Table:
    """``--population``: runner and bare loops per workload and vector env, and memory."""
    table = Table(title="Populations: runner vs bare loop (numpy and torch forward)")
    for column in (
        "workload", "vectorize", "runner steps/s", "us/step runner", "us/step bare numpy",
        "us/step bare torch", "ratio (numpy)", "ratio (torch)", "target", "peak RSS/batch",
        "beyond bare's/batch", "bytes/row",
    ):
        table.add_column(column, justify="left" if column in ("workload", "vectorize") else "right")
    for row in rows:
        us, memory = row["us_per_agent_step"], row["memory"]
        target = row["target_ratio"]
        table.add_row(
            row["name"], row["vectorize"], f"{row['agent_steps_per_s']['runner']:,.0f}",
            f"{us.get('runner', float('nan')):.2f}", f"{us.get('numpy', float('nan')):.2f}",
            f"{us.get('torch', float('nan')):.2f}", f"{row['ratio_numpy']:.2f}",
            f"{row['ratio_torch']:.2f}", "-" if target is None else f">= {target:.2f}",
            f"{memory['peak_beyond_build_per_batch']:.2f}x", f"{memory['own_peak_per_batch']:.2f}x",
            f"{memory['bytes_per_row']:,.0f}",
        )
    return table


def print_report(console: Console, report: dict[str, Any]) -> None:
    """Every table the report has data for."""
    rows = report.get("workloads") or []
    if rows:
        console.print(throughput_table(rows))
        console.print(perf_table(rows))
    if report.get("memory"):
        console.print(memory_table(report["memory"]))
    if report.get("subprocess"):
        console.print(subprocess_table(report["subprocess"]))
        console.print(subprocess_breakdown_table(report["subprocess"]))
    if report.get("process_speedup"):
        console.print(process_speedup_table(report["process_speedup"]))
        console.print(process_round_times_table(report["process_speedup"]))
    if report.get("slow_sub_env"):
        console.print(slow_sub_env_table(report["slow_sub_env"]))
    if report.get("population"):
        console.print(population_table(report["population"]))
    for result in report.get("profiles") or []:
        console.print(profile_table(result, "top"))
        console.print(profile_table(result, "top_runner_code"))
    meta = report["meta"]
    console.print(
        f"torch threads {meta['torch_threads']}, {meta['cpu_count']} CPUs, "
        f"{'bare loop forward in numpy, ' if meta.get('bare_forward') == 'numpy' else ''}"
        f"{meta['duration_s']} s x {meta['repeats']} windows after {meta['warmup_s']} s warm-up"
        f"{' (smoke: numbers mean nothing)' if meta['smoke'] else ''}; "
        f"total {report['total_s']:.1f} s; other processes used "
        f"{meta['other_cpus']:.2f} CPUs on average"
    )
    note = load_note(meta["other_cpus"], meta["cpu_count"])
    if note is not None:
        console.print(f"[bold yellow]warning:[/] {note}")
