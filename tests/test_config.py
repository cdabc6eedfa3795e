"""Configuration precedence: argument > ``paralela.config(...)`` > PARALELA_* > default."""

from __future__ import annotations

import threading

import pytest

import paralela
from paralela._config import UNSET, resolve
from paralela.errors import ConfigError


def thread_name(_: object) -> str:
    return threading.current_thread().name


def ran_in(backend_setting: dict[str, str]) -> set[str]:
    """Names of the threads that ran a small map, with the given ``backend=`` argument."""
    return set(paralela.map(thread_name, range(8), workers=2, **backend_setting))


MAIN = {threading.main_thread().name}


def test_default_when_nothing_is_set() -> None:
    assert resolve("workers", UNSET, 7) == 7
    assert resolve("backend", UNSET, "processes") == "processes"


def test_environment_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_WORKERS", "3")
    monkeypatch.setenv("PARALELA_BACKEND", "threads")
    monkeypatch.setenv("PARALELA_RETRIES", "5")
    assert resolve("workers", UNSET, None) == 3
    assert resolve("backend", UNSET, "processes") == "threads"
    assert resolve("retries", UNSET, 2) == 5


def test_config_beats_environment_and_argument_beats_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARALELA_WORKERS", "3")
    with paralela.config(workers=4):
        assert resolve("workers", UNSET, None) == 4
        assert resolve("workers", 5, None) == 5
    assert resolve("workers", UNSET, None) == 3


def test_none_and_zero_are_values_not_unset() -> None:
    with paralela.config(workers=4, retries=3):
        assert resolve("workers", None, 1) is None
        assert resolve("retries", 0, 2) == 0


def test_nested_config_overrides_and_restores() -> None:
    with paralela.config(backend="threads", workers=2) as outer:
        assert (outer.backend, outer.workers) == ("threads", 2)
        with paralela.config(workers=6) as inner:
            assert (inner.backend, inner.workers) == ("threads", 6)
        assert resolve("workers", UNSET, None) == 2
    assert resolve("backend", UNSET, "processes") == "processes"


def test_config_is_restored_after_an_exception() -> None:
    with pytest.raises(KeyError), paralela.config(retries=9):
        raise KeyError("x")
    assert resolve("retries", UNSET, 2) == 2


def test_empty_environment_value_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_WORKERS", "")
    assert resolve("workers", UNSET, 7) == 7


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("yes", True), (" ON ", True), ("0", False), ("no", False)]
)
def test_progress_from_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool
) -> None:
    monkeypatch.setenv("PARALELA_PROGRESS", raw)
    assert resolve("progress", UNSET, None) is expected


@pytest.mark.parametrize(
    ("var", "name"), [("PARALELA_WORKERS", "workers"), ("PARALELA_RETRIES", "retries")]
)
def test_bad_environment_value_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, var: str, name: str
) -> None:
    monkeypatch.setenv(var, "many")
    with pytest.raises(ConfigError, match=rf"{var}='many' is not understood \(it sets '{name}'\)"):
        resolve(name, UNSET, None)


def test_bad_environment_value_fails_map_before_work(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setenv("PARALELA_RETRIES", "lots")
    with pytest.raises(ConfigError, match="PARALELA_RETRIES"):
        paralela.map(calls.append, range(3), backend="sequential")
    assert calls == []


def test_negative_retries_from_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_RETRIES", "-1")
    with pytest.raises(ConfigError, match="PARALELA_RETRIES='-1' is not understood"):
        paralela.map(abs, range(3), backend="sequential")


def test_an_explicit_argument_wins_over_a_bad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_RETRIES", "lots")
    assert paralela.map(abs, [-1, -2], backend="sequential", retries=0) == [1, 2]


# The backend setting is visible: "sequential" runs in the calling (main) thread,
# "threads" in paralela's pool threads.


def test_map_backend_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_BACKEND", "sequential")
    assert ran_in({}) == MAIN


def test_map_backend_config_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_BACKEND", "threads")
    with paralela.config(backend="sequential"):
        assert ran_in({}) == MAIN


def test_map_backend_argument_beats_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALELA_BACKEND", "sequential")
    with paralela.config(backend="sequential"):
        names = ran_in({"backend": "threads"})
    assert names
    assert all(name.startswith("paralela") for name in names)


def test_unknown_backend_from_environment_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARALELA_BACKEND", "gpu-cluster")
    with pytest.raises(ConfigError, match="PARALELA_BACKEND='gpu-cluster' is not understood"):
        paralela.map(abs, [1])


def test_unset_is_falsy_and_reads_well() -> None:
    assert not UNSET
    assert repr(UNSET) == "UNSET"
    assert paralela.UNSET is UNSET


@pytest.mark.parametrize(
    ("var", "name", "raw", "allowed"),
    [
        ("PARALELA_PROGRESS", "progress", "maybe", "1, true, yes, on, 0, false, no, off"),
        ("PARALELA_WORKERS", "workers", "0", "a whole number of workers, at least 1"),
        ("PARALELA_WORKERS", "workers", "2.5", "a whole number of workers, at least 1"),
        ("PARALELA_RETRIES", "retries", "-1", "a whole number of retries, 0 or more"),
        ("PARALELA_BACKEND", "backend", "gpu-cluster", "processes, sequential, slurm, threads"),
        ("PARALELA_START_METHOD", "start_method", "fork", "spawn"),
    ],
)
def test_a_value_not_understood_names_the_variable_and_the_values_allowed(
    monkeypatch: pytest.MonkeyPatch, var: str, name: str, raw: str, allowed: str
) -> None:
    monkeypatch.setenv(var, raw)
    with pytest.raises(ConfigError) as info:
        resolve(name, UNSET, None)
    message = str(info.value)
    assert f"{var}={raw!r} is not understood" in message
    assert allowed in message
    assert "unset it" in message


def test_progress_off_values_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw in ("off", "FALSE", " 0 "):
        monkeypatch.setenv("PARALELA_PROGRESS", raw)
        assert resolve("progress", UNSET, None) is False


def test_a_map_with_a_progress_value_not_understood_fails_before_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setenv("PARALELA_PROGRESS", "sometimes")
    with pytest.raises(ConfigError, match="PARALELA_PROGRESS='sometimes' is not understood"):
        paralela.map(calls.append, range(3), backend="sequential")
    assert calls == []
