"""make_policy_mapping_fn: callables, import paths, glob dicts and the single-policy default."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.imports import ImportPathError
from examples.mappings import by_prefix, by_seat, shared
from marl_runner.mapping import PolicyMappingError, make_policy_mapping_fn

KAZ_AGENTS = ["archer_0", "archer_1", "knight_0", "knight_1"]


def test_single_policy_needs_no_mapping() -> None:
    fn = make_policy_mapping_fn(None, ["shared"])
    assert [fn(a, None) for a in KAZ_AGENTS] == ["shared"] * 4
    assert fn("x", episode=object(), runner=object()) == "shared"


@pytest.mark.parametrize("ids", [[], ["a", "b"]])
def test_no_mapping_with_other_than_one_policy(ids: list[str]) -> None:
    with pytest.raises(ValueError, match=rf"required when there are {len(ids)} policies"):
        make_policy_mapping_fn(None, ids)


def test_callable_is_checked_and_gets_only_the_kwargs_it_takes() -> None:
    seen: dict[str, Any] = {}

    def plain(agent_id: str, episode: Any) -> str:
        return agent_id.split("_")[0]

    def wants_runner(agent_id: str, episode: Any, runner: Any = None) -> str:
        seen["runner"] = runner
        return "archer"

    def takes_all(agent_id: str, episode: Any, **kwargs: Any) -> str:
        seen.update(kwargs)
        return "knight"

    ids = ["archer", "knight"]
    assert make_policy_mapping_fn(plain, ids)("archer_0", None, runner=1, worker=2) == "archer"
    assert (
        make_policy_mapping_fn(wants_runner, ids)("knight_0", None, runner=1, worker=2) == "archer"
    )
    assert seen == {"runner": 1}
    assert make_policy_mapping_fn(takes_all, ids)("archer_0", None, runner=3, worker=4) == "knight"
    assert seen == {"runner": 3, "worker": 4}


def test_callable_returning_unknown_id() -> None:
    fn = make_policy_mapping_fn(lambda agent_id, episode: "zombie", ["archer", "knight"])
    with pytest.raises(ValueError) as info:
        fn("archer_0", None)
    message = str(info.value)
    assert "'zombie'" in message and "'archer_0'" in message and "'archer', 'knight'" in message


def test_live_policy_ids_follow_added_policies() -> None:
    policy_map = {"archer": object()}
    fn = make_policy_mapping_fn(by_prefix, policy_map.keys())
    with pytest.raises(ValueError, match="'knight'"):
        fn("knight_0", None)
    policy_map["knight"] = object()
    assert fn("knight_0", None) == "knight"


def test_import_path() -> None:
    fn = make_policy_mapping_fn("examples.mappings:by_prefix", ["archer", "knight"])
    assert [fn(a, None) for a in KAZ_AGENTS] == ["archer", "archer", "knight", "knight"]


def test_bad_import_paths() -> None:
    with pytest.raises(ImportPathError, match="has no attribute 'by_nothing'"):
        make_policy_mapping_fn("examples.mappings:by_nothing", ["a"])
    with pytest.raises(TypeError, match="names a float, not a function"):
        make_policy_mapping_fn("math:pi", ["a"])


def test_glob_dict_first_match_in_order_wins() -> None:
    fn = make_policy_mapping_fn(
        {"archer_0": "lead", "archer_*": "archer", "*": "rest"}, ["lead", "archer", "rest"]
    )
    assert [fn(a, None) for a in KAZ_AGENTS] == ["lead", "archer", "rest", "rest"]
    assert fn(7, None) == "rest"  # non-string agent ids are matched as str()


def test_errors_of_the_user_function_pass_through() -> None:
    def broken(agent_id: str, episode: object) -> str:
        raise KeyError(agent_id)

    with pytest.raises(KeyError):
        make_policy_mapping_fn(broken, ["a"])("x", None)
    assert issubclass(PolicyMappingError, ValueError)


def test_glob_dict_answers_repeat_without_matching_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import marl_runner.mapping as mapping

    fn = make_policy_mapping_fn({"archer_*": "archer", "*": "rest"}, ["archer", "rest"])
    first = [fn(a, None) for a in KAZ_AGENTS]
    monkeypatch.setattr(mapping.fnmatch, "fnmatchcase", lambda *a: pytest.fail("matched again"))
    assert [fn(a, None) for a in KAZ_AGENTS] == first == ["archer", "archer", "rest", "rest"]
    with pytest.raises(pytest.fail.Exception):
        fn("knight_9", None)  # a new name is matched


def test_glob_dict_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import marl_runner.mapping as mapping

    monkeypatch.setattr(mapping, "_MAX_MATCHED_NAMES", 8)
    fn = make_policy_mapping_fn({"*": "rest"}, ["rest"])
    for i in range(100):  # an env that mints a fresh agent id per episode
        assert fn(f"agent_{i}", None) == "rest"
    assert len(fn._matched) <= 8


def test_glob_dict_is_case_sensitive() -> None:
    fn = make_policy_mapping_fn({"Archer_*": "a", "*": "b"}, ["a", "b"])
    assert fn("archer_0", None) == "b"


def test_agent_matching_no_glob() -> None:
    fn = make_policy_mapping_fn({"archer_*": "archer", "knight_*": "knight"}, ["archer", "knight"])
    with pytest.raises(PolicyMappingError) as info:
        fn("zombie_3", None)
    message = str(info.value)
    assert "'zombie_3'" in message and "'archer_*', 'knight_*'" in message


def test_glob_dict_naming_unknown_policy() -> None:
    with pytest.raises(
        ValueError, match=r"'knight_\*' maps to unknown policy id 'knight'.*'archer'"
    ):
        make_policy_mapping_fn({"archer_*": "archer", "knight_*": "knight"}, ["archer"])
    with pytest.raises(ValueError, match="empty"):
        make_policy_mapping_fn({}, ["archer"])


def test_unsupported_spec() -> None:
    with pytest.raises(TypeError, match="expected a callable"):
        make_policy_mapping_fn(42, ["a"])  # type: ignore[arg-type]


def test_example_mapping_functions() -> None:
    assert [by_prefix(a, None) for a in KAZ_AGENTS] == ["archer", "archer", "knight", "knight"]
    assert by_seat("player_0", None) == "player_0"
    assert by_seat("player_2", None, runner=None) == "player_2"
    with pytest.raises(ValueError, match="player_<n>"):
        by_seat("archer_0", None)
    assert shared("agent_2", None, worker=None) == "shared"
