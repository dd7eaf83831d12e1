"""The batch harness's plain-data messages: what the judge decodes from the program process.

The program process is hostile; the judge only ever builds new built-in objects from its bytes,
and refuses anything else as malformed (the test then fails).
"""

from __future__ import annotations

import math

import pytest

from sandcell.batch._harness import MAX_DEPTH, Malformed, Unsendable, decode, encode

VALUES: list[object] = [
    None,
    True,
    False,
    0,
    -7,
    10**5000,  # beyond int("...") digit limits: sent in hexadecimal
    1.5,
    -0.0,
    math.inf,
    complex(1.25, -2),
    "",
    "naïve \ud800 surrogate",
    b"\x00\xff",
    [1, [2, (3, {4})]],
    (),
    {"a": 1, 2: [None], (1, 2): frozenset({"x"})},
    set(),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_plain_data_round_trips_exactly(value: object) -> None:
    back = decode(encode(value))
    assert back == value
    assert type(back) is type(value)


def test_nan_round_trips() -> None:
    back = decode(encode(math.nan))
    assert isinstance(back, float) and math.isnan(back)


def test_a_subclass_with_its_own_eq_arrives_as_the_builtin() -> None:
    class Yes(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    class Text(str):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    assert decode(encode(Yes(4))) == 4 and type(decode(encode(Yes(4)))) is int
    assert decode(encode(Yes(4))) != 5
    assert type(decode(encode([Text("a")]))[0]) is str  # type: ignore[index]


@pytest.mark.parametrize(
    "value", [object(), lambda: 1, iter([1]), type], ids=["object", "function", "iterator", "type"]
)
def test_objects_are_not_sent(value: object) -> None:
    with pytest.raises(Unsendable):
        encode(value)


def test_cycles_and_deep_nesting_are_not_sent() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(Unsendable):
        encode(loop)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"X",
        b"I12",  # no terminator
        b"Izz;",
        b"Dxyz;",  # not a float
        b"S5:abc",  # shorter than its count
        b"S99999999999999:",
        b"L2:N",  # fewer items than counted
        b"M1:L0:N",  # an unhashable key
        b"E1:L0:",
        b"NN",  # trailing bytes
        b"L1:" * (MAX_DEPTH + 5) + b"N",
        b"S2:\xff\xfe",  # not UTF-8
    ],
)
def test_malformed_messages_are_refused(raw: bytes) -> None:
    with pytest.raises(Malformed):
        decode(raw)
