"""docs/CONFIG.md is generated from the config schema; this fails when the two drift apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from marl_runner.config import RunnerConfig
from marl_runner.config_doc import render

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"


def test_committed_reference_matches_the_schema() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/CONFIG.md is out of date: run `python -m marl_runner.config_doc > docs/CONFIG.md`"
    )


def test_every_key_has_a_default_and_a_meaning() -> None:
    text = render()
    for field in dataclasses.fields(RunnerConfig):
        assert field.metadata.get("doc"), f"config key {field.name!r} has no reference text"
        assert f"| `{field.name}` |" in text
    assert "| `env` | required |" in text and "| `num_envs` | `1` |" in text
    assert "| `lstm_cell_size` |" in text and "| `agent_connectors` |" in text
