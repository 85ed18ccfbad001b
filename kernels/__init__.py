"""Triton kernels, each with a plain-torch `ref_*` of the same math: arrive with issue 6.

Until then every op runs through lanes.ops (plain torch, batch-invariant on the CPU).
"""
