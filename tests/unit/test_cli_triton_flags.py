"""Triton's command line as fastoip reads it: the deprecated ``--strict-model-config`` prints Triton's
warnings on stderr (the text Triton's qa/L0_model_config cli_messages cases look for) and keeps its meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastoip.cli import serve_options

DEPRECATED = ("Warning: '--strict-model-config' has been deprecated! Please use "
              "'--disable-auto-complete-config' instead.")
OVERRIDE = ("Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
            "'--disable-auto-complete-config'!")


def _auto_complete(root: Path, *argv: str) -> bool:
    return serve_options(["--model-repository", str(root), *argv]).repository.auto_complete


@pytest.mark.parametrize(("argv", "auto_complete", "warnings"), [
    ((), True, ()),
    (("--disable-auto-complete-config",), False, ()),
    (("--strict-model-config=true",), False, (DEPRECATED,)),
    (("--strict-model-config=false",), True, (DEPRECATED,)),
    (("--disable-auto-complete-config", "--strict-model-config=false"), False, (DEPRECATED, OVERRIDE)),
    (("--disable-auto-complete-config", "--strict-model-config=true"), False, (DEPRECATED,)),
])
def test_strict_model_config_warns_as_triton(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], auto_complete: bool,
    warnings: tuple[str, ...],
) -> None:
    assert _auto_complete(tmp_path, *argv) is auto_complete
    err = capsys.readouterr().err
    assert err.splitlines() == list(warnings)


def test_missing_repository_with_exit_on_error_false_is_a_failed_initialization(tmp_path: Path) -> None:
    """Triton's qa/L0_lifecycle test_parse_error_noexit starts: the server stays up, failed to initialize."""
    missing = tmp_path / "xyzx"
    options = serve_options([f"--model-repository={missing}", "--exit-on-error=false"])
    assert options.init_error == f"failed to stat file {missing}"
    assert options.model_repository == missing
    beside = serve_options([f"--model-repository={tmp_path}", f"--model-repository={missing}",
                            "--exit-on-error=false"])
    assert beside.init_error == f"failed to stat file {missing}"
    assert (beside.model_repository, beside.more_repositories) == (tmp_path, (missing,))
    assert serve_options([f"--model-repository={tmp_path}", "--exit-on-error=false"]).init_error == ""


@pytest.mark.parametrize("exit_flag", [(), ("--exit-on-error=true",)])
def test_missing_repository_otherwise_stops_the_start(tmp_path: Path, exit_flag: tuple[str, ...]) -> None:
    from fastoip.triton_flags import FlagError

    with pytest.raises(FlagError, match="failed to stat file"):
        serve_options([f"--model-repository={tmp_path / 'xyzx'}", *exit_flag])


@pytest.mark.parametrize(("flags", "words"), [
    (["--load-model", "m"], "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (["--model-control-mode", "poll", "--load-model", "m"], "requires setting '--model-control-mode=explicit'"),
    (["--model-control-mode", "explicit", "--load-model", "*", "--load-model", "m"],
     "Wildcard model name '*' must be the ONLY startup model if specified at all."),
])
def test_load_model_refusals_are_tritonservers(tmp_path: Path, flags: list[str], words: str) -> None:
    """tritonserver's words (command_line_parser.cc, and its core for the wildcard; Triton's OpenAI frontend tests
    read them)."""
    from fastoip.triton_flags import FlagError

    with pytest.raises(FlagError) as refused:
        serve_options([f"--model-repository={tmp_path}", *flags])
    assert words in str(refused.value)

