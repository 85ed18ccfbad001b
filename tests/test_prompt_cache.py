"""Prompt cache bookkeeping: exact block ids, refcounts, eviction order, the byte budget."""

from __future__ import annotations

import random

import pytest

from lanes.cache import BlockPool, IntegrityError, PromptCache


def _cache(num_blocks=8, max_blocks=4):
    pool = BlockPool(num_blocks)
    return pool, PromptCache(pool, "model-a", max_blocks)


def test_keys_chain_over_content_salt_and_model():
    _, cache = _cache()
    toks = list(range(10))
    keys = cache.chain_keys(toks, 4, "", [])
    assert len(keys) == 2  # only full blocks
    assert cache.chain_keys(toks + [10, 11], 4, "", keys)[:2] == keys  # extends, keeps the prefix
    assert cache.chain_keys([0, 1, 2, 3, 9, 9, 9, 9], 4, "", [])[0] == keys[0]
    assert cache.chain_keys([0, 1, 2, 3, 9, 9, 9, 9], 4, "", [])[1] != keys[1]
    assert cache.chain_keys(toks, 4, "salt", [])[0] != keys[0]
    other = PromptCache(BlockPool(2), "model-b", 2)
    assert other.chain_keys(toks, 4, "", [])[0] != keys[0]
    # the second block's key depends on the first block's tokens
    assert cache.chain_keys([9, 1, 2, 3] + toks[4:8], 4, "", [])[1] != keys[1]


def test_publish_match_release_refcounts_and_eviction_order():
    pool, cache = _cache(num_blocks=6, max_blocks=3)
    lane_a = cache.allocate(3)
    assert lane_a == [0, 1, 2]
    keys = [b"k0", b"k1", b"k2"]
    for k, b in zip(keys, lane_a, strict=True):
        assert cache.publish(k, b)
    assert [pool.refcount(b) for b in lane_a] == [2, 2, 2]
    cache.check_integrity([lane_a])
    cache.release(lane_a)  # lane ends: blocks stay, cached only, evictable in order 0, 1, 2
    assert [pool.refcount(b) for b in lane_a] == [1, 1, 1] and pool.num_free == 3
    cache.check_integrity([])
    lane_b = cache.match([b"k0", b"k1", b"zz", b"k2"])  # longest prefix only
    assert lane_b == [0, 1] and pool.refcount(0) == 2
    assert cache.num_available == 3 + 1  # free 3, evictable block 2
    lane_c = cache.allocate(4)  # needs one eviction: block 2, the only unowned cached block
    assert lane_c == [3, 4, 5, 2]
    assert not cache.is_cached(2) and cache.num_evicted == 1
    cache.check_integrity([lane_b, lane_c])
    cache.release(lane_b)
    cache.release(lane_c)
    cache.check_integrity([])
    # blocks 0 and 1 were released last: they are now at the back of the LRU order
    assert cache.num_available == 6


def test_budget_is_never_exceeded():
    pool, cache = _cache(num_blocks=8, max_blocks=2)
    owned = cache.allocate(4)
    assert cache.publish(b"a", owned[0]) and cache.publish(b"b", owned[1])
    assert not cache.publish(b"c", owned[2])  # full, and both cached blocks are owned
    cache.release(owned[:1])  # block 0 now evictable
    assert cache.publish(b"c", owned[2])  # evicts block 0 to stay within budget
    assert cache.num_cached == 2 and not cache.is_cached(owned[0])
    cache.check_integrity([owned[1:]])


def test_same_key_twice_keeps_the_first_block():
    pool, cache = _cache()
    a, b = cache.allocate(2)
    assert cache.publish(b"k", a)
    assert not cache.publish(b"k", b)  # another lane computed the same content: not kept
    assert cache.publish(b"k", a)  # idempotent for the same block
    assert pool.refcount(a) == 2 and pool.refcount(b) == 1
    with pytest.raises(IntegrityError):
        cache.publish(b"other", a)


def test_random_sequences_keep_integrity():
    rng = random.Random(1)
    pool, cache = _cache(num_blocks=32, max_blocks=12)
    lanes: list[list[int]] = []
    next_key = 0
    for _ in range(3000):
        r = rng.random()
        if r < 0.35 and cache.num_available:
            lanes.append(cache.allocate(rng.randint(1, min(4, cache.num_available))))
        elif r < 0.5 and lanes:
            lane = rng.choice(lanes)
            b = rng.choice(lane)
            if not cache.is_cached(b):
                cache.publish(f"k{next_key}".encode(), b)
                next_key += 1
        elif r < 0.65:
            keys = [f"k{rng.randrange(max(next_key, 1))}".encode() for _ in range(2)]
            got = cache.match(keys)
            if got:
                lanes.append(got)
        elif lanes:
            cache.release(lanes.pop(rng.randrange(len(lanes))))
        cache.check_integrity(lanes)
        assert cache.num_cached <= cache.max_blocks


@pytest.mark.parametrize("chunk", [128, 256])
def test_a_request_ending_in_its_last_prompt_chunk_publishes_it(llama_dir, chunk):
    """max_tokens=1 ends the request in the forward of its last prompt chunk; that chunk's whole
    blocks still reach the prompt cache (before, 128 and 0 of these 192 tokens were found)."""
    from lanes import EngineConfig, SamplingParams, build_engine

    engine = build_engine(str(llama_dir), EngineConfig(prefill_chunk=chunk))
    prompt = [(7 * i) % 300 + 3 for i in range(200)]
    longer = prompt + [5, 6, 7] * 10
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=1))
    assert out.finish_reason == "length"
    assert engine.cached_prefix_len(longer) == 192  # 12 whole blocks of the 200-token prompt
