"""docs/CONFIG.md is generated from the config schema (`marl-runner config-doc`); this fails
when the two drift apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from marl_runner.cli import main
from marl_runner.config import RunnerConfig
from marl_runner.config.reference import render
from marl_runner.envs.vector_backends import vector_backend, vector_backend_names, vector_keys

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"


def test_committed_reference_matches_the_schema() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/CONFIG.md is out of date: run `marl-runner config-doc > docs/CONFIG.md`"
    )


def test_every_key_has_a_default_and_a_meaning() -> None:
    text = render()
    for field in dataclasses.fields(RunnerConfig):
        assert field.metadata.get("doc"), f"config key {field.name!r} has no reference text"
        if field.name != "vector_options":  # not a key: the backends' keys, each in a row
            assert f"| `{field.name}` |" in text
    for key in vector_keys().values():
        assert key.doc and f"| `{key.name}` | `" in text
    assert "| `env` | required |" in text and "| `num_envs` | `1` |" in text
    assert "| `num_envs_per_poll` | `null` | subprocess/ray: the fewest sub-envs" in text
    assert "| `lstm_cell_size` |" in text and "| `agent_connectors` |" in text


def test_each_backend_lists_its_keys() -> None:
    text = render()
    assert "## `vectorize` backends" in text
    for name in vector_backend_names():
        keys = ", ".join(f"`{key.name}`" for key in vector_backend(name).keys) or "none"
        assert f"| `{name}` | {vector_backend(name).doc} | {keys} |" in text
    assert "| `subprocess` | Sub-envs in worker processes on this machine. | `num_workers`" in text


def test_config_doc_command_prints_and_writes_the_reference(tmp_path, capsys) -> None:
    assert main(["config-doc"]) == 0
    assert capsys.readouterr().out == render()
    out = tmp_path / "CONFIG.md"
    assert main(["config-doc", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render()


def test_model_keys_come_from_the_models() -> None:
    """One table of model keys: the models' own, shown in the reference and used by the checks."""
    from marl_runner import config
    from marl_runner.policy import models

    assert config.MODEL_KEYS is models.MODEL_KEYS
    for model_type, keys in models.MODEL_KEYS.items():
        assert f"### `type: {model_type}`" in render()
        for key in keys:
            assert f"| `{key}` |" in render()
