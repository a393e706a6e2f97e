"""Helpers for the course on the KV cache and FlashAttention.

One module per concept:
- ``kv_cache_size``: bytes per token, cache of a batch, append step, crossover with the weights.
- ``models``: published model shapes (MHA, GQA, MQA, MLA, windows) and their parameter counts.
- ``decode_work``: key/value projection counts of generation with and without a cache.
- ``cache_size_panel``: the lesson 01 plot and its widget panel.
- ``attention``: exact NumPy attention: softmax, causal mask, MHA, GQA and MQA.
- ``mla``: multi-head latent attention: the latent cache, expanded on use or absorbed.
- ``kv_quant``: int8 and float8 storage of keys and values, scales, and the errors they cause.
- ``cache_shrink_panel``: the lesson 02 panel (layout and storage -> cache size and error).
- ``panel_output``: how every panel shows a redrawn figure.
- ``checks``: the exercise checkers (``checks.core`` holds the shared machinery).
"""
