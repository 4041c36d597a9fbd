"""`marl-runner serve --max-workers N --idle-timeout S --request-timeout S --min-body-rate K`
reach the server's settings (concurrency limit, keep-alive timeout, body deadline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marl_runner.cli import main
from marl_runner.serving import server as server_module

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "serve_drones.yaml"


def test_the_capacity_flags_reach_the_server_settings(monkeypatch, capsys):
    built: list[Any] = []

    class Recorded(server_module.PolicyServer):
        """Builds the real server, keeps its settings, then refuses to serve."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            settings = self.settings
            built.append((settings.max_concurrency, settings.idle_timeout_s,
                          settings.request_timeout_s, settings.min_body_rate))
            self.close()
            raise OSError("recorded; not serving")

    monkeypatch.setattr(server_module, "PolicyServer", Recorded)
    code = main(["serve", str(CONFIG), "--port", "0", "--max-workers", "7", "--idle-timeout", "2.5",
                 "--request-timeout", "3", "--min-body-rate", "16"])
    assert code == 2 and "recorded; not serving" in capsys.readouterr().err
    assert main(["serve", str(CONFIG), "--port", "0", "--set", "num_envs=40"]) == 2
    assert main(["serve", str(CONFIG), "--port", "0", "--set", "num_envs=60"]) == 2
    # Without the flags: the defaults (2 x num_envs + 16 requests at once, 5 s, 10 s, 64 KiB/s).
    assert built == [(7, 2.5, 3.0, 16 * 1024), (96, 5.0, 10.0, 64 * 1024),
                     (136, 5.0, 10.0, 64 * 1024)]


@pytest.mark.parametrize(
    "flag, value, expected",
    [("--max-workers", "0", "expected a positive integer, got 0"),
     ("--idle-timeout", "0", "expected a number of seconds > 0, got 0"),
     ("--idle-timeout", "nan", "expected a number of seconds > 0, got nan"),
     ("--request-timeout", "-1", "expected a number of seconds > 0, got -1"),
     ("--min-body-rate", "0", "expected a number of KiB/s > 0, got 0"),
     ("--min-body-rate", "fast", "expected a number of KiB/s > 0, got 'fast'")],
)
def test_bad_capacity_values_are_refused_naming_the_value(capsys, flag, value, expected):
    with pytest.raises(SystemExit) as exited:
        main(["serve", str(CONFIG), flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and expected in err, err
