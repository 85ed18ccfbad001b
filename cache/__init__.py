"""KV memory: the paged block pool, per-lane block tables and the KV tensors they index."""

from cache.block_pool import BlockPool, IntegrityError
from cache.block_table import BlockTable
from cache.kv_pool import KVPool

__all__ = ["BlockPool", "BlockTable", "IntegrityError", "KVPool"]
