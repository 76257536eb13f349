"""The KV cache's bookkeeping: a pool of fixed-size blocks, per-sequence block tables, reference
counts, and (optionally) prefix sharing by chained block hashes.

A block's hash covers its tokens and, through the previous block's hash, every token before it,
so equal hashes mean equal prefixes; the tokens are compared too, against hash collisions.
Only full blocks whose K/V have been computed are hashed, and a sequence always computes at
least its last token itself, so the logits it samples from exist.

Each sequence that holds blocks also has a row of `block_tables`, an array kept up to date as
blocks are added, so a step's block tables are one gather of rows instead of a copy of every
sequence's list.

A model whose sliding-window layers sit beside full-attention ones (gpt-oss) keeps two tables per
sequence, both from this one pool (as vLLM's hybrid allocator does; a block holds one group's
layers): `block_table` for the full layers and `window_table` for the window layers, whose blocks
wholly before the window are freed as it moves (their entries are -1, and 0 in `window_tables`).
So a long sequence holds about half the blocks it would if every layer kept every token. Prefix
caching covers full-attention models only.
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
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, sliding_window: int | None = None
    ):
        """`sliding_window`: the window layers' window in tokens, where the model has both kinds of layer."""
        assert not (enable_prefix_caching and sliding_window), "prefix caching covers full-attention models only"
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in least-recently-freed order; a freed block keeps its hash until reused.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        self.num_prefix_hit_tokens = 0  # tokens taken from the prefix cache instead of computed
        self.block_tables = np.zeros((0, 0), dtype=np.int32)  # row seq.block_row: its block table, 0-padded
        # Row seq.block_row: its window table, 0 where freed or past its end (None without window layers).
        self.window_tables = None if sliding_window is None else np.zeros((0, 0), dtype=np.int32)
        self.free_rows: list[int] = []

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """The free blocks that `num_new_tokens` more tokens of `seq` take (in each table it has)."""
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table)) * (1 if self.sliding_window is None else 2)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give `seq` the blocks to hold `num_new_tokens` more tokens; False, changing nothing but
        the release of window blocks it no longer needs, when too few are free."""
        if seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return True  # they fit its blocks (most decodes): the scheduler's hot path, kept short
        if self.sliding_window is not None:
            self.release_window_blocks(seq)
        needed = self.blocks_needed(seq, num_new_tokens)
        if needed > len(self.free_block_ids):
            return False
        for _ in range(needed if self.sliding_window is None else needed // 2):
            self._append_block(seq, self._take_block())
            if self.sliding_window is not None:
                self._append_window_block(seq, self._take_block())
        return True

    def _take_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash is not None:  # evict its cached prefix
            if self.hash_to_block_id.get(block.hash) == block_id:
                del self.hash_to_block_id[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def release_window_blocks(self, seq: Sequence) -> None:
        """Free `seq`'s window blocks whose tokens are all before the window of its next query (at
        position num_computed_tokens, which sees keys from num_computed_tokens - window + 1 on; a
        speculative rollback never goes below it)."""
        first_needed = max(0, seq.num_computed_tokens - self.sliding_window + 1) // self.block_size
        for index in range(seq.window_freed, min(first_needed, len(seq.window_table))):
            self._unref(seq.window_table[index])
            seq.window_table[index] = -1
            self.window_tables[seq.block_row, index] = 0
            seq.window_freed = index + 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_ids[block_id] = None

    def _append_window_block(self, seq: Sequence, block_id: int) -> None:
        # After _append_block, which gave it its row and the width for one more entry.
        self.window_tables[seq.block_row, len(seq.window_table)] = block_id
        seq.window_table.append(block_id)

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
        def grown(table: np.ndarray) -> np.ndarray:
            bigger = np.zeros((rows, width), dtype=np.int32)
            bigger[: table.shape[0], : table.shape[1]] = table
            return bigger

        self.block_tables = grown(self.block_tables)
        if self.window_tables is not None:
            self.window_tables = grown(self.window_tables)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s blocks; shared ones stay while others hold them. Tail blocks go last in
        the free order, so a cached prefix outlives the request's own tail."""
        for block_id in reversed(seq.block_table):
            self._unref(block_id)
        for block_id in reversed(seq.window_table[seq.window_freed :]):
            self._unref(block_id)
        if seq.block_row is not None:
            self.block_tables[seq.block_row, : len(seq.block_table)] = 0
            if self.window_tables is not None:
                self.window_tables[seq.block_row, : len(seq.window_table)] = 0
            self.free_rows.append(seq.block_row)
            seq.block_row = None
        seq.block_table, seq.window_table, seq.window_freed = [], [], 0
        seq.block_hashes = []

    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks holding a prefix of a new sequence; return how many tokens they hold
        (the scheduler counts them as computed)."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:  # (never with window layers)
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
            held = seq.block_table + seq.window_table[seq.window_freed :]
            assert len(set(held)) == len(held), f"{seq} holds a block twice"
            assert all(b == -1 for b in seq.window_table[: seq.window_freed]), f"{seq}: a freed window entry"
            if seq.block_table:
                row = self.block_tables[seq.block_row]
                assert (
                    row[: len(seq.block_table)].tolist() == seq.block_table and not row[len(seq.block_table) :].any()
                ), f"{seq}: its block-table row is not its block table"
            if self.window_tables is not None and seq.block_table:
                assert len(seq.window_table) == len(seq.block_table), f"{seq}: its two tables differ in length"
                row = self.window_tables[seq.block_row]
                assert row.tolist() == [max(b, 0) for b in seq.window_table] + [0] * (
                    len(row) - len(seq.window_table)
                ), f"{seq}: its window-table row is not its window table"
            for block_id in held:
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
