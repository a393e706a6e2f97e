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
- ``flash``: attention without the n x n table: naive vs tiled (FlashAttention Algorithm 1), merging
  partial results, and the HBM traffic of each.
- ``online_softmax_panel``, ``tiling_panel``: the lesson 03 panels.
- ``measure``: peak memory and best wall time of a call; this machine's memory bandwidth.
- ``llama``: the Llama-style decoder in torch, its KV cache, generation, checkpoint loading.
- ``pretrained``: SmolLM2-135M-Instruct read from its GGUF file into ``llama``, and its tokenizer.
- ``text_data``: the byte-level text (standard-library docstrings) the model learns from, and
  English prose (the Python language reference) for the pretrained model.
- ``step_cost``: FLOPs and bytes of a forward step; arithmetic intensity.
- ``decode_timing``: timing generation step by step, or one step at chosen positions; fitting
  scaling exponents.
- ``decode_panel``: the lesson 04 panel.
- ``roofline``: chips, the roofline, the decode ceiling, the batch that fits.
- ``paged_kv``: the paged KV allocator (blocks, free list, block tables, copy-on-write).
- ``paged_attention``: attention that reads a sequence's keys and values through its block table.
- ``serving_sim``: a seeded serving workload and the memory each reservation scheme wastes.
- ``serving_panel``: the lesson 05 panel.
- ``eviction``: eviction policies and int8 for old tokens, a cache that applies them per layer and K/V head,
  chunked runs, and static policies scored in one pass.
- ``layer_sharing``: adjacent layers sharing one cache (CLA-style sharing, MiniCache-style slerp).
- ``eviction_panel``: the lesson 06 panel.
- ``panel_output``: how every panel shows a redrawn figure.
- ``checks``: the exercise checkers (``checks.core`` holds the shared machinery).
"""
