"""KV memory: the paged block pool, per-lane block tables, the KV tensors, and the prompt cache."""

from cache.block_pool import BlockPool, IntegrityError
from cache.block_table import BlockTable
from cache.kv_pool import KVPool
from cache.prompt_cache import PromptCache

__all__ = ["BlockPool", "BlockTable", "IntegrityError", "KVPool", "PromptCache"]
