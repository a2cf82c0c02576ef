"""Keys read back as jsonb text (``framework.keys.decode``): a single integer
key takes a fast path, every other key goes through one exact decoder; both
give what the stored JSON says, numbers digit for digit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from framework.keys import END, decode, encode


@pytest.mark.parametrize("key", [0, 7, 12345678901234567890, -5, (1, "a"), ("b",),
                                 (Decimal("1.50"), 2), (Decimal("-0.001"),), END])
def test_a_key_decodes_to_what_was_encoded(key):
    decoded = decode(encode(key))
    assert decoded == key and type(decoded) is type(key)


def test_numbers_in_a_key_stay_exact():
    assert decode("[0.1000000000000000055511151231257827]") == (
        Decimal("0.1000000000000000055511151231257827"),)


def test_digits_that_are_not_ascii_are_not_an_integer_key():
    with pytest.raises(ValueError):
        decode("\u00b2")  # '²' is a digit to str.isdigit, not JSON
