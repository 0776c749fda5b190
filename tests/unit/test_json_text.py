"""cluster_preflight/verdict/json_text.py: the verdict's JSON text, the same as the standard library's, faster."""

import json
import random

import pytest

from cluster_preflight.verdict.json_text import indented

TEXTS = ["", "a", "é ü 日本", "quote \" backslash \\ slash /", "line\nbreak\ttab\rcr", "\x00\x1f\x7f", "\u2028\u2029",
         "\ud800 lone", "\U0001f600", "</script>"]
NUMBERS = [0, -1, 2 ** 70, 1.5, -0.0, 1e-05, 1e300, 3.141592653589793, float("nan"), float("inf"), float("-inf"),
           True, False, None]


def expected(value):
    return json.dumps(value, indent=2, sort_keys=True)


@pytest.mark.parametrize("value", [
    {}, [], "x", 3, None, 1.25, {"b": 1, "a": [], "c": {}}, [[[]], {}, [{}]],
    {"nodes": {"n1": {"checks": {"allreduce.ranks": {"status": "pass", "found": "ok", "details": {"n": [1, 2.5]}}}}}},
    {"z": [None, True, False], "é": "ü", "": ""},
])
def test_the_text_is_json_dumps_text(value):
    assert indented(value) == expected(value)


def test_random_trees_give_json_dumps_text():
    rng = random.Random(7)

    def tree(depth):
        roll = rng.random()
        if depth > 4 or roll < 0.4:
            return rng.choice(TEXTS + NUMBERS)
        if roll < 0.7:
            return [tree(depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice(TEXTS) + str(index): tree(depth + 1) for index in range(rng.randint(0, 4))}

    for _ in range(300):
        value = tree(0)
        assert indented(value) == expected(value)


class Text(str):
    pass


class Number(int):
    pass


@pytest.mark.parametrize("value", [
    {"checks": {"a.b": {"status": "pass", "found": "é\x1b[2J", "n": 2 ** 70, "x": float("nan"), "y": -0.0}}},
    {"hosts": ["n1", "n2", None, 1.5, float("-inf")], "deep": [[[["a", 1]]]]},
])
def test_containers_of_scalars_at_any_depth_give_json_dumps_text(value):
    assert indented(value) == expected(value)


@pytest.mark.parametrize("value", [
    {"a": (1, 2)},  # a tuple is a list in JSON
    {"a": {"b": Text("x"), "c": Number(3)}},  # subclasses of scalars: what json.dumps makes of them
    {"a": [Text("x")]},
    {1: "x", 2: "y"},  # keys that are not text
    {"a": {2: 1, 10: 2}},
])
def test_other_types_are_left_to_json_dumps(value):
    assert indented(value) == expected(value)


def test_a_files_last_line_break_is_added_to_the_text():
    assert indented({"a": [1]}, end="\n") == expected({"a": [1]}) + "\n"
    assert indented({1: "x"}, end="\n") == expected({1: "x"}) + "\n"


def test_what_json_dumps_refuses_is_refused_too():
    with pytest.raises(TypeError):
        indented({"a": {1, 2}})
    with pytest.raises(TypeError):
        indented({1: "x", "y": 2})  # mixed keys cannot be sorted
