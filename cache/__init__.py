"""KV memory: the paged block pool, per-lane block tables, the KV tensors, and the prompt cache."""

from lanes.cache.block_pool import BlockPool, IntegrityError
from lanes.cache.block_table import BlockTable
from lanes.cache.kv_pool import KVPool
from lanes.cache.prompt_cache import PromptCache

__all__ = ["BlockPool", "BlockTable", "IntegrityError", "KVPool", "PromptCache"]
