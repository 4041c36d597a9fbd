"""``python -m marl_runner.bench.image_memory``: what an image observation costs in a batch.

Samples pistonball (457x120x3 RGB crop per piston) through the runner with
several agent connector chains and measures, from the batches themselves:

- **bytes per row** of ``obs`` + ``new_obs`` together (what a training batch
  holds per agent step; both columns are materialised when a fragment is
  built);
- **agent steps/s** sampling with a ``RandomPolicy`` (no model, so the
  numbers show the connectors and the batch building, not a network), median
  of ``--repeats`` windows of ``--samples`` calls to ``sample()``.

``float32 flat`` is the layout image observations had before they were kept
as uint8 (``ObsPreprocessorConnector`` then ``FlattenDataAgentConnector``
reproduces it exactly: 403,200 floats per obs).

    python -m marl_runner.bench.image_memory            # the table
    python -m marl_runner.bench.image_memory --json     # the same as JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from marl_runner.config import RunnerConfig
from marl_runner.policy.torch_utils import limit_inference_threads
from marl_runner.sampling.runner import EnvRunner

PISTONBALL = "pettingzoo.butterfly.pistonball_v6:parallel_env"
PRE = "ObsPreprocessorConnector"
GRAY = "GrayscaleAgentConnector"
STACK = "ViewRequirementAgentConnector"


def _resize(size: int) -> dict[str, Any]:
    return {"name": "ResizeAgentConnector", "height": size, "width": size}


#: name -> (agent connector chain, frames stacked)
CHAINS: dict[str, tuple[list[Any] | None, int]] = {
    "float32 flat (before)": ([PRE, "FlattenDataAgentConnector"], 1),
    "uint8 native (default chain)": (None, 1),
    "uint8 grayscale": ([PRE, GRAY], 1),
    "uint8 grayscale, 84x84": ([PRE, GRAY, _resize(84)], 1),
    "uint8 grayscale, 84x84, 4 frames": ([PRE, GRAY, _resize(84), STACK], 4),
    "uint8 grayscale, 64x64, 4 frames (example)": ([PRE, GRAY, _resize(64), STACK], 4),
}


def chain_config(chain: list[Any] | None, frames: int, args: argparse.Namespace) -> RunnerConfig:
    policy: dict[str, Any] = {"policy_class": "RandomPolicy", "agent_connectors": chain}
    if frames > 1:
        policy["config"] = {"view_requirements": {"obs": {"frames": frames}}}
    return RunnerConfig.from_dict(
        {
            "env": {
                "name": PISTONBALL,
                "config": {"n_pistons": args.pistons, "max_cycles": 125, "continuous": False},
            },
            "num_envs": args.num_envs,
            "rollout_fragment_length": args.fragment_length,
            "seed": 0,
            "policies": {"p": policy},
        }
    )


def measure(name: str, chain: list[Any] | None, frames: int, args: argparse.Namespace) -> dict:
    with EnvRunner(chain_config(chain, frames, args)) as runner:
        obs_space = runner.get_spaces()["p"][0]
        batch = runner.sample().policy_batches["p"]  # warm-up, and the batch to weigh
        rows = len(batch)
        per_row = (batch["obs"].nbytes + batch["new_obs"].nbytes) / rows
        rates = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            steps = sum(runner.sample().agent_steps() for _ in range(args.samples))
            rates.append(steps / (time.perf_counter() - start))
    return {
        "chain": name,
        "policy_obs_space": str(obs_space),
        "obs_dtype": str(batch["obs"].dtype),
        "bytes_per_row": per_row,
        "rows_per_gib": int(2**30 // per_row),
        "agent_steps_per_s": statistics.median(rates),
    }


def render(results: list[dict], args: argparse.Namespace) -> str:
    before = results[0]["bytes_per_row"]
    lines = [
        f"pistonball, {args.pistons} pistons, {args.num_envs} sub-envs, fragments of "
        f"{args.fragment_length} env steps, RandomPolicy, torch threads 1",
        "",
        "| chain | policy obs space | obs + new_obs bytes/row | float32 / this | rows per GiB "
        "| agent steps/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['chain']} | `{r['policy_obs_space']}` | {r['bytes_per_row']:,.0f} "
            f"| {before / r['bytes_per_row']:,.1f}x | {r['rows_per_gib']:,} "
            f"| {r['agent_steps_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pistons", type=int, default=20, help="pistons (agents) per env")
    parser.add_argument("--num-envs", type=int, default=2, help="sub-envs")
    parser.add_argument(
        "--fragment-length", type=int, default=10, help="env steps per sub-env per sample()"
    )
    parser.add_argument("--samples", type=int, default=3, help="sample() calls per window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows; median reported")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    limit_inference_threads(1)
    results = []
    for name, (chain, frames) in CHAINS.items():
        results.append(measure(name, chain, frames, args))
        print(f"measured: {name}", file=sys.stderr, flush=True)
    print(json.dumps(results, indent=2) if args.json else render(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
