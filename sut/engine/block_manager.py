"""The KV cache's bookkeeping: a pool of fixed-size blocks, per-sequence block tables, reference
counts, and (optionally) prefix sharing by chained block hashes.

A block's hash covers its tokens and, through the previous block's hash, every token before it,
so equal hashes mean equal prefixes; the tokens are compared too, against hash collisions.
Only full blocks whose K/V have been computed are hashed, and a sequence always computes at
least its last token itself, so the logits it samples from exist.

Each sequence that holds blocks also has a row of `block_tables`, an array kept up to date as
blocks are added, so a step's block tables are one gather of rows instead of a copy of every
sequence's list.
"""

from collections import OrderedDict

import numpy as np

from sut.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in least-recently-freed order; a freed block keeps its hash until reused.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        self.num_prefix_hit_tokens = 0  # tokens taken from the prefix cache instead of computed
        self.block_tables = np.zeros((0, 0), dtype=np.int32)  # row seq.block_row: its block table, 0-padded
        self.free_rows: list[int] = []

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give `seq` the blocks to hold `num_new_tokens` more tokens; False, changing nothing, when
        too few are free."""
        if seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return True  # they fit its blocks (most decodes): the scheduler's hot path, kept short
        needed = self.blocks_needed(seq, num_new_tokens)
        if needed > len(self.free_block_ids):
            return False
        for _ in range(needed):
            block_id, _ = self.free_block_ids.popitem(last=False)
            block = self.blocks[block_id]
            assert block.ref_count == 0
            if block.hash is not None:  # evict its cached prefix
                if self.hash_to_block_id.get(block.hash) == block_id:
                    del self.hash_to_block_id[block.hash]
                block.hash, block.token_ids = None, ()
            block.ref_count = 1
            self._append_block(seq, block_id)
        return True

    def _append_block(self, seq: Sequence, block_id: int) -> None:
        if seq.block_row is None:
            if not self.free_rows:  # grow: double the rows
                old = self.block_tables.shape[0]
                self._resize(max(16, 2 * old), self.block_tables.shape[1])
                self.free_rows = list(range(self.block_tables.shape[0] - 1, old - 1, -1))
            seq.block_row = self.free_rows.pop()
        index = len(seq.block_table)
        if index >= self.block_tables.shape[1]:
            self._resize(self.block_tables.shape[0], max(16, 2 * index))
        self.block_tables[seq.block_row, index] = block_id
        seq.block_table.append(block_id)

    def _resize(self, rows: int, width: int) -> None:
        grown = np.zeros((rows, width), dtype=np.int32)
        grown[: self.block_tables.shape[0], : self.block_tables.shape[1]] = self.block_tables
        self.block_tables = grown

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s blocks; shared ones stay while others hold them. Tail blocks go last in
        the free order, so a cached prefix outlives the request's own tail."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} freed twice"
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        if seq.block_row is not None:
            self.block_tables[seq.block_row, : len(seq.block_table)] = 0
            self.free_rows.append(seq.block_row)
            seq.block_row = None
        seq.block_table = []
        seq.block_hashes = []

    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks holding a prefix of a new sequence; return how many tokens they hold
        (the scheduler counts them as computed)."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        tokens, size = seq.token_ids, self.block_size
        hashes: list[int] = []
        parent = None
        for i in range((len(tokens) - 1) // size):
            chunk = tuple(tokens[i * size : (i + 1) * size])
            parent = hash((parent, chunk))
            block_id = self.hash_to_block_id.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            self._append_block(seq, block_id)
            hashes.append(parent)
        seq.block_hashes = hashes
        self.num_prefix_hit_tokens += len(hashes) * size
        return len(hashes) * size

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Hash the blocks of `seq` that became full and computed, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        hashes = seq.block_hashes
        tokens, size = seq.token_ids, self.block_size
        for i in range(len(hashes), seq.num_computed_tokens // size):
            chunk = tuple(tokens[i * size : (i + 1) * size])
            h = hash((hashes[-1] if hashes else None, chunk))
            hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block_id:
                block.hash, block.token_ids = h, chunk
                self.hash_to_block_id[h] = block.block_id

    def check_invariants(self, live_sequences) -> None:
        """Raise AssertionError unless every block is either free or held by exactly its ref count
        of live sequences (used by tests: no leak, no double free, shared counts right)."""
        holders = [0] * self.num_blocks
        rows = [seq.block_row for seq in live_sequences if seq.block_table]
        assert len(set(rows)) == len(rows) and not set(rows) & set(self.free_rows), "a block-table row is shared"
        for seq in live_sequences:
            assert len(set(seq.block_table)) == len(seq.block_table), f"{seq} holds a block twice"
            if seq.block_table:
                row = self.block_tables[seq.block_row]
                assert (
                    row[: len(seq.block_table)].tolist() == seq.block_table and not row[len(seq.block_table) :].any()
                ), f"{seq}: its block-table row is not its block table"
            for block_id in seq.block_table:
                holders[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == holders[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count}, held by {holders[block.block_id]}"
            )
            assert (block.ref_count == 0) == (block.block_id in self.free_block_ids), (
                f"block {block.block_id}: ref_count {block.ref_count} but free={block.block_id in self.free_block_ids}"
            )
        for h, block_id in self.hash_to_block_id.items():
            assert self.blocks[block_id].hash == h, f"hash map points to block {block_id} with another hash"
