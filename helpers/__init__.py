"""Helpers for the course on the KV cache and FlashAttention.

One module per concept:
- ``kv_cache_size``: bytes per token, cache of a batch, append step, crossover with the weights.
- ``models``: published model shapes (MHA, GQA, MQA, MLA, windows) and their parameter counts.
- ``decode_work``: key/value projection counts of generation with and without a cache.
- ``cache_size_panel``: the lesson 01 plot and its widget panel.
- ``checks``: the exercise checkers (``checks.core`` holds the shared machinery).
"""
