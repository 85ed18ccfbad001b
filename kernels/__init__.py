"""Triton kernels, each with a plain-torch `ref_*` of the same math; kernels.registry lists them.

Importing a kernel module imports Triton; lanes.ops imports these only when Triton ops are used.
"""
