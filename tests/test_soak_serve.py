"""The serving soak, briefly: clients in both modes, killed clients and hostile requests at once."""

from __future__ import annotations

import pytest

from marl_runner.bench.soak_serve import run_soak_serve


@pytest.mark.slow
def test_a_short_serving_soak_writes_exactly_what_clients_finished():
    report = run_soak_serve(0.15, remote_clients=1, local_clients=1, killed_clients=2)
    assert report["server_exit_code"] == 0, report["server_output_tail"]
    assert report["client_errors"] == 0
    assert report["clients_finished"]["episodes"] > 0
    assert report["equal"], report
    assert report["table"]["episodes"] == report["written"]["episodes"]
    assert not any(key.endswith((" 0", " 500")) for key in report["hostile_answers"])


def test_minutes_must_be_positive():
    with pytest.raises(ValueError, match=r"minutes 0: expected a number > 0"):
        run_soak_serve(0)
