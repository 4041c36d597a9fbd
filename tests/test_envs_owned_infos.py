"""What `vectorize: sync` keeps of a step's infos: new dicts, or one shared empty dict."""

from __future__ import annotations

import numpy as np

from marl_runner.envs.owned_copies import owned_infos


def test_empty_infos_become_one_shared_empty_dict_not_the_envs() -> None:
    given = {"a": {}, "b": {}}
    kept = owned_infos(given)
    assert kept == given and kept is not given
    assert kept["a"] is kept["b"] and kept["a"] is not given["a"]
    given["a"]["later"] = 1  # the env fills its dict afterwards
    assert kept["a"] == {}


def test_an_info_with_content_is_a_new_dict_holding_the_envs_values() -> None:
    inner = np.zeros(2)
    given = {"a": {"t": 1, "pos": inner}, "b": {}}
    kept = owned_infos(given)
    given["a"]["t"] = 2  # the env updates its dict in place next step
    given["a"]["new"] = 3
    assert kept["a"] == {"t": 1, "pos": inner} and kept["b"] == {}
    assert kept["a"]["pos"] is inner  # values are not copied (documented)


def test_infos_that_are_not_dicts_keep_their_values() -> None:
    """None, 0 and arrays (whose `==` has no one truth value) are kept as given, beside
    a dict, which is copied."""
    for odd in (None, 0, np.zeros(0), np.zeros(3)):
        kept = owned_infos({"a": odd, "b": {}})
        assert kept["b"] == {}
        assert type(kept["a"]) is type(odd)
        if isinstance(odd, np.ndarray):
            np.testing.assert_array_equal(kept["a"], odd)
        else:
            assert kept["a"] == odd
    assert owned_infos({}) == {}
