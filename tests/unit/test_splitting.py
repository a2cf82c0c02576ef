"""Splitting is deterministic and partitions the key space (DESIGN 5)."""

from hypothesis import given
from hypothesis import strategies as st

from framework.splitting import (
    MAX_RANGES,
    boundaries_of,
    ranges_from_boundaries,
    refine_buckets,
    rows_per_range_for,
)

keys = st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=1, max_size=400,
                unique=True).map(sorted)


@given(keys, st.integers(min_value=1, max_value=50))
def test_ranges_tile_min_to_max_plus_one_without_gap_or_overlap(sorted_keys, per):
    ranges = ranges_from_boundaries(boundaries_of(sorted_keys, per), sorted_keys[-1])
    assert ranges[0][0] == sorted_keys[0]
    assert ranges[-1][1] == sorted_keys[-1] + 1
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end == start  # no gap, no overlap
    assert all(lo < hi for lo, hi in ranges)


@given(keys, st.integers(min_value=1, max_value=50))
def test_every_key_falls_in_exactly_one_range_with_equal_row_counts(sorted_keys, per):
    ranges = ranges_from_boundaries(boundaries_of(sorted_keys, per), sorted_keys[-1])
    counts = [sum(lo <= k < hi for k in sorted_keys) for lo, hi in ranges]
    assert sum(counts) == len(sorted_keys)
    # Equal rows, not equal key widths: all but the last range hold exactly `per`.
    assert all(c == per for c in counts[:-1])
    assert 1 <= counts[-1] <= per


@given(keys, st.integers(min_value=1, max_value=50))
def test_splitting_is_deterministic(sorted_keys, per):
    first = ranges_from_boundaries(boundaries_of(sorted_keys, per), sorted_keys[-1])
    again = ranges_from_boundaries(boundaries_of(list(sorted_keys), per), sorted_keys[-1])
    assert first == again


def test_skewed_keys_give_equal_rows_not_equal_widths():
    skewed = list(range(1, 901)) + [10**12 + i for i in range(100)]
    ranges = ranges_from_boundaries(boundaries_of(skewed, 250), skewed[-1])
    counts = [sum(lo <= k < hi for k in skewed) for lo, hi in ranges]
    assert counts == [250, 250, 250, 250]


@given(st.integers(min_value=0, max_value=10**11))
def test_range_size_caps_the_number_of_subtasks(row_count):
    per = rows_per_range_for(row_count)
    assert per >= 1
    assert -(-row_count // per) <= MAX_RANGES


bucket_edges = st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=2,
                        max_size=60, unique=True).map(sorted)


@given(bucket_edges, st.integers(min_value=1, max_value=500))
def test_refined_buckets_tile_their_key_space_without_gap_or_overlap(edges, ranges):
    """The sampled split's second level (DESIGN 5): whatever the buckets, the
    ranges cut from them tile [first edge, last edge) and every bucket edge is
    a range boundary."""
    boundaries = refine_buckets(edges, ranges)
    tiled = ranges_from_boundaries(boundaries, edges[-1] - 1)
    assert tiled[0][0] == edges[0] and tiled[-1][1] == edges[-1]
    assert all(lo < hi for lo, hi in tiled)
    assert all(a[1] == b[0] for a, b in zip(tiled, tiled[1:], strict=False))
    assert set(edges[:-1]) <= set(boundaries)
    assert refine_buckets(list(edges), ranges) == boundaries  # deterministic


def test_refined_buckets_of_dense_keys_are_even_and_as_many_as_asked():
    # 3 buckets of a dense key space, 10 ranges: shares 3, 4, 3 (rounded).
    boundaries = refine_buckets([0, 3_000, 7_000, 10_000], 10)
    widths = [hi - lo for lo, hi in ranges_from_boundaries(boundaries, 9_999)]
    assert widths == [1_000] * 10
