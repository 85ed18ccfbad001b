"""how fast the engine runs: decode, prefill, rounds, overlap, device rounds"""
