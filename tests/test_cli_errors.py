"""The CLI's one error-handling context and its shared options (``paralela.cli._errors``,
``paralela.cli._options``): every command exits with the same codes for the same errors,
and spells a shared option the same way."""

from __future__ import annotations

import errno

import click
import pytest
import typer

from paralela.backends import Terminated
from paralela.cli._errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RENDEZVOUS,
    EXIT_RUN_DIR,
    EXIT_TERMINATED,
    EXIT_USAGE,
    EXIT_WORKER_DIED,
    USAGE_OR_FAILED,
    handling_errors,
    kept_from_notes,
    resume_hint,
    said_with_notes,
)
from paralela.errors import (
    ConfigError,
    FingerprintMismatchError,
    MissingExtraError,
    RendezvousError,
    RunStoreError,
    TaskError,
    WorkerDiedError,
)


def exit_of(
    exc: BaseException, capsys: pytest.CaptureFixture[str], **kwargs: object
) -> tuple[int, str]:
    with pytest.raises(typer.Exit) as info, handling_errors(**kwargs):  # type: ignore[arg-type]
        raise exc
    return info.value.exit_code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("bad option"), EXIT_USAGE),
        (RunStoreError("cannot use it"), EXIT_USAGE),
        (WorkerDiedError(-9, indices=[3]), EXIT_WORKER_DIED),
        (FingerprintMismatchError("another computation"), EXIT_RUN_DIR),
        (RendezvousError("rank 1 missing"), EXIT_RENDEZVOUS),
        (
            TaskError("it raised", index=None, item_repr="", remote_traceback="", exc_type="E"),
            EXIT_FAILED,
        ),
        (MissingExtraError("optuna", "sweep", "A sweep"), EXIT_FAILED),
    ],
)
def test_each_error_of_paralela_exits_with_its_code_and_one_line(
    exc: BaseException, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    got, err = exit_of(exc, capsys)
    assert got == code
    assert err == f"Error: {exc}\n"


def test_ctrl_c_and_sigterm_say_what_was_kept(capsys: pytest.CaptureFixture[str]) -> None:
    kept = "Finished chunks are kept in run; run again to resume."
    assert exit_of(KeyboardInterrupt(), capsys, kept=kept) == (
        EXIT_INTERRUPTED,
        f"Error: Interrupted. {kept}\n",
    )
    code, err = exit_of(Terminated(), capsys, kept=kept)
    assert code == EXIT_TERMINATED
    assert err == f"Error: Stopped by SIGTERM (scancel, a time limit or preemption). {kept}\n"


def test_a_command_s_codes_come_before_the_common_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_of(RunStoreError("full"), capsys, codes=USAGE_OR_FAILED)[0] == EXIT_FAILED
    assert exit_of(ConfigError("bad"), capsys, codes=USAGE_OR_FAILED)[0] == EXIT_USAGE
    usage = ((MissingExtraError, EXIT_USAGE),)
    assert exit_of(MissingExtraError("x", "y", "z"), capsys, codes=usage)[0] == EXIT_USAGE
    # a type in codes that is not paralela's is handled too
    assert exit_of(OSError(errno.ENOSPC, "full"), capsys, codes=((OSError, 1),))[0] == 1


def test_explain_has_the_first_word_and_say_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    def explain(exc: Exception) -> None:
        if isinstance(exc, OSError):
            typer.echo("Error: explained", err=True)
            raise typer.Exit(EXIT_FAILED)

    assert exit_of(OSError("disk"), capsys, explain=explain) == (EXIT_FAILED, "Error: explained\n")
    error = ConfigError("bad")
    error.add_note("paralela: pass --workers 2")
    assert exit_of(error, capsys, say=said_with_notes) == (
        EXIT_USAGE,
        "Error: bad Pass --workers 2\n",
    )


def test_what_is_not_paralela_s_is_raised_as_it_is() -> None:
    with pytest.raises(ZeroDivisionError), handling_errors():
        1 / 0  # noqa: B018
    with pytest.raises(typer.Exit) as info, handling_errors(codes=((RuntimeError, 9),)):
        raise typer.Exit(7)  # a fail() inside the block: its own code, not codes'
    assert info.value.exit_code == 7
    with pytest.raises(click.BadParameter), handling_errors():
        raise click.BadParameter("no")


def test_the_resume_hints() -> None:
    assert resume_hint("run", "tasks") == "Finished tasks are kept in run; run again to resume."
    assert resume_hint(None, "shards") == (
        "Pass --run-dir DIR to keep finished shards, so that running again resumes."
    )
    interrupt = KeyboardInterrupt()
    assert kept_from_notes("The sweep was interrupted.")(interrupt) == "The sweep was interrupted."
    interrupt.add_note("12 trials are kept; run it again to go on.")
    assert (
        kept_from_notes("-")(interrupt)
        == "12 trials are kept; run the same command again to go on."
    )


SHARED = {
    "workers", "run_dir", "progress", "retries", "option", "json_out", "json_", "quiet", "gpus",
    "overwrite", "encoding", "input_format", "slurm_partition", "timeout_min",
}  # fmt: skip
# Options of the same name that mean another thing: not the shared one.
OWN = {
    ("scale", "workers"),  # a list of counts, 1,2,4,8: not a worker count
    ("info", "run_dir"),  # directories whose filesystem to check, not the command's own
    ("stage", "overwrite"),  # DEST's files, not --output's
}


def test_a_shared_option_is_spelled_the_same_in_every_command() -> None:
    from paralela.cli._commands import app

    spellings: dict[str, set[tuple[str, ...]]] = {}
    for command in app.registered_commands:
        assert command.callback is not None
        name = command.name or command.callback.__name__
        group = typer.main.get_command_from_info(
            command, pretty_exceptions_short=False, rich_markup_mode=None
        )
        for param in group.params:
            if param.param_type_name != "option" or param.name not in SHARED:
                continue
            if (name, param.name) in OWN:
                continue
            option = "json" if param.name in ("json_out", "json_") else param.name
            spellings.setdefault(option, set()).add(tuple(sorted(param.opts)))
    assert spellings["workers"] == {("--workers", "-w")}
    assert spellings["run_dir"] == {("--run-dir", "-d")}
    assert spellings["progress"] == {("--progress",)}
    assert spellings["slurm_partition"] == {("--partition", "--slurm-partition")}
    assert all(len(s) == 1 for s in spellings.values()), spellings
