"""Block manager bookkeeping: blocks allocated and freed round trip, a double free is caught, and
reference counts are right with shared prefixes (the scheduler's use of it: test_scheduler.py)."""

import pytest

from sut.engine.block_manager import BlockManager
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence


def seq(tokens, request_id=0, max_tokens=8):
    return Sequence(request_id, tokens, SamplingParams(max_tokens=max_tokens), max_tokens)


def compute(s: Sequence, n: int, bm: BlockManager):
    s.num_computed_tokens += n
    bm.cache_computed_blocks(s)


def test_allocate_and_free_round_trip():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq(list(range(10)))
    assert bm.blocks_needed(s, 10) == 3
    bm.allocate(s, 10)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    compute(s, 10, bm)
    assert bm.blocks_needed(s, 2) == 0  # 12 tokens still fit in 3 blocks
    assert bm.blocks_needed(s, 3) == 1
    bm.check_invariants([s])
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == []
    bm.check_invariants([])


def test_double_free_is_caught():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = seq([1, 2, 3])
    bm.allocate(a, 3)
    table = list(a.block_table)
    bm.free(a)
    a.block_table = table
    with pytest.raises(AssertionError, match="freed twice"):
        bm.free(a)


def test_prefix_sharing_counts_references():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    prefix = list(range(100, 112))  # three full blocks
    a = seq(prefix + [1, 2], request_id="a")
    bm.allocate(a, a.num_tokens)
    compute(a, a.num_tokens, bm)
    b = seq(prefix + [7], request_id="b")
    assert bm.match_prefix(b) == 12
    assert b.block_table == a.block_table[:3]
    assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2, 2]
    bm.allocate(b, b.num_uncomputed_tokens)
    bm.check_invariants([a, b])
    # A prompt that is exactly the cached prefix still computes its last token itself.
    c = seq(prefix, request_id="c")
    assert bm.match_prefix(c) == 8
    bm.allocate(c, c.num_uncomputed_tokens)
    bm.check_invariants([a, b, c])
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:3]] == [2, 2, 1]
    bm.free(b)
    bm.free(c)
    bm.check_invariants([])
    assert bm.num_free_blocks == 16
    # Freed blocks keep their hashes until reused, so a later identical prefix still hits.
    d = seq(prefix + [9], request_id="d")
    assert bm.match_prefix(d) == 12
    bm.free(d)


def test_no_sharing_when_prefix_caching_is_off():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(12)) + [1])
    bm.allocate(a, a.num_tokens)
    compute(a, a.num_tokens, bm)
    b = seq(list(range(12)) + [2])
    assert bm.match_prefix(b) == 0 and b.block_table == []


def test_window_table_frees_blocks_that_left_the_window():
    """With window layers beside full ones a sequence holds two tables from one pool; the window
    table's blocks wholly before its next query's window go back as it moves (position p sees
    keys p - window + 1 .. p)."""
    bm = BlockManager(num_blocks=40, block_size=4, sliding_window=6)
    s = seq(list(range(30)))
    assert bm.blocks_needed(s, 30) == 16  # 8 positions' blocks, in each table
    assert bm.allocate(s, 30)
    assert len(s.block_table) == len(s.window_table) == 8 and bm.num_free_blocks == 24
    compute(s, 30, bm)
    bm.check_invariants([s])
    for _ in range(3):  # decodes at positions 30, 31 fit the 8 blocks; 32 needs a ninth
        assert bm.allocate(s, 1)
        compute(s, 1, bm)
    # Released when a new block was taken: position 32 sees keys from 27 on, so blocks 0-5 (tokens
    # 0-23) left the window, and block 6 stays.
    assert s.window_freed == 6 and s.window_table[:6] == [-1] * 6
    assert len(s.block_table) == 9 and bm.num_free_blocks == 40 - 9 - 3
    assert (bm.window_tables[s.block_row, :6] == 0).all() and bm.window_tables[s.block_row, 6:9].all()
    bm.check_invariants([s])
    bm.free(s)
    assert bm.num_free_blocks == 40 and s.window_table == [] and s.window_freed == 0
    bm.check_invariants([])


def test_window_blocks_are_freed_before_a_failed_allocation_is_refused():
    """Released window blocks count for the allocation that releases them; one that still does not
    fit changes nothing else."""
    bm = BlockManager(num_blocks=12, block_size=4, sliding_window=4)
    s = seq(list(range(20)))
    assert bm.allocate(s, 20) and bm.num_free_blocks == 2  # 5 + 5 blocks
    compute(s, 20, bm)
    assert bm.allocate(s, 4)  # position 20 sees 17..20: blocks 0-3 go back, then 1 + 1 new ones
    assert bm.num_free_blocks == 4 and s.window_freed == 4
    compute(s, 4, bm)
    assert not bm.allocate(s, 40)  # 10 more blocks in each table: too many even after releasing
    assert len(s.block_table) == 6 and s.window_freed == 5
    bm.check_invariants([s])
