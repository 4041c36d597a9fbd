"""How many episodes a batch holds: what `serve` counts, writes and reports."""

from __future__ import annotations

import numpy as np

from marl_runner.batch import MultiAgentBatch


def num_episodes(batch: MultiAgentBatch) -> int:
    """Distinct episode ids over all policies (an episode's agents may map to several)."""
    ids = [pb["eps_id"] for pb in batch.policy_batches.values() if "eps_id" in pb and len(pb)]
    return len(np.unique(np.concatenate(ids))) if ids else 0
