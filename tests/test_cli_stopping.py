"""SIGTERM stops a command as Ctrl-C does (the sampling run's own test is in
test_cli_metrics_out: a complete log, the summary, exit 143)."""

from __future__ import annotations

import os
import signal
import time

import pytest

import marl_runner.cli.app as app
from marl_runner.cli import main
from marl_runner.cli.stopping import GracefulStop, Terminated, sigterm_as_interrupt


def _sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises at once


def test_the_first_sigterm_raises_later_ones_wait_for_the_clean_up() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    cleaned_up = False
    with sigterm_as_interrupt():
        try:
            _sigterm_self()
            raise AssertionError("SIGTERM raised nothing")
        except Terminated:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the clean-up goes on
            time.sleep(0.1)
            cleaned_up = True
    assert cleaned_up
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize(("interrupt", "exit_code"), [(KeyboardInterrupt, 130), (Terminated, 143)])
def test_a_command_without_clean_up_of_its_own_says_it_was_interrupted(
    monkeypatch, capsys, interrupt, exit_code
) -> None:
    def interrupted(args) -> int:
        raise interrupt

    monkeypatch.setitem(app.COMMANDS, "plot", interrupted)
    assert main(["plot", "runs/none"]) == exit_code
    err = capsys.readouterr().err
    assert err == "marl-runner plot: interrupted\n"


def test_a_first_signal_asks_a_second_stops_at_once_and_the_handlers_come_back() -> None:
    asked: list[bool] = []
    previous_int = signal.getsignal(signal.SIGINT)
    with GracefulStop(lambda: asked.append(True)) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert asked == [True] and stop.requested and stop.exit_code == 130
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises at once
    assert asked == [True]
    assert signal.getsignal(signal.SIGINT) is previous_int


def test_after_a_sigterm_the_clean_up_is_not_cut_short() -> None:
    """A SIGTERM that asked the run to stop: later ones are ignored while the command
    cleans up, as after the first SIGTERM of any command."""
    previous = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt():
        with GracefulStop(lambda: None) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            assert stop.exit_code == 143
        os.kill(os.getpid(), signal.SIGTERM)  # during the clean-up: ignored
        time.sleep(0.1)
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_hang_up_stops_the_run_as_sigterm_does() -> None:
    """(Found by a probe.) A closed terminal (SIGHUP) ended the run on the spot: the
    rows since the last batch lost, no last metrics record."""
    asked: list[bool] = []
    previous = signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)
    # As a command runs it: after a hang-up, SIGTERM stays ignored until the command's
    # own handler is taken down (else this test process would ignore it from now on).
    with sigterm_as_interrupt():
        with GracefulStop(lambda: asked.append(True)) as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert asked == [True] and stop.exit_code == 129
            with pytest.raises(Terminated):
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(5)  # the handler raises at once
    assert (signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)) == previous
