"""Proposers for speculative decoding (model drafter, n-gram, replay): arrive with issue 4."""
