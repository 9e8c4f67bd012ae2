"""Helpers shared by the tests, the GPU checks and the tools: compile-only builds of every shipped kernel.

Nothing here runs at training or inference time; the backends never import this package.
"""
