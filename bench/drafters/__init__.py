"""what drafting buys: speedups, acceptance, agreement"""
