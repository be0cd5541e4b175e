"""``RAG_UVLOOP``: which event loop the services' commands run on (inference.eventloop)."""

import argparse
import asyncio

import pytest

from inference.eventloop import LoopSettingError, command, loop_name, ray_environment, run, use_uvloop


async def _which_loop() -> str:
    await asyncio.sleep(0)  # the loop really runs a task switch, not just constructed
    return loop_name()


@pytest.mark.parametrize(
    ("setting", "expected"), [("auto", "uvloop"), ("on", "uvloop"), (" ON ", "uvloop"), ("off", "asyncio")]
)
def test_run_uses_the_loop_the_setting_selects(setting: str, expected: str) -> None:
    # uvloop is one of Mnemo's dependencies, so "auto" selects it here.
    assert run(_which_loop(), environ={"RAG_UVLOOP": setting}) == expected


def test_auto_is_the_default() -> None:
    assert use_uvloop({}) is True
    assert run(_which_loop(), environ={}) == "uvloop"


def test_an_unknown_setting_is_a_loud_error_naming_the_variable() -> None:
    with pytest.raises(LoopSettingError, match="RAG_UVLOOP must be one of auto, on, off, not 'fast'"):
        run(_which_loop(), environ={"RAG_UVLOOP": "fast"})


def test_ray_workers_get_the_same_choice() -> None:
    assert ray_environment({"RAG_UVLOOP": "off"}) == {"RAY_USE_UVLOOP": "0"}
    assert ray_environment({"RAG_UVLOOP": "auto"}) == {"RAY_USE_UVLOOP": "1"}


def test_a_command_with_a_bad_setting_exits_2_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def main(args: argparse.Namespace) -> int:
        return 0

    monkeypatch.setenv("RAG_UVLOOP", "sometimes")
    assert command(main, "mnemo drain")(argparse.Namespace()) == 2
    assert "mnemo drain: RAG_UVLOOP must be one of" in capsys.readouterr().err
    monkeypatch.setenv("RAG_UVLOOP", "off")
    assert command(main, "mnemo drain")(argparse.Namespace()) == 0
