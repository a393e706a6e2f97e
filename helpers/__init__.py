"""Helpers for the course on the KV cache and FlashAttention.

One module per concept:
- ``units``: sizes in bytes (GiB, GB), the number formats and their bytes, argument checks.
- ``kv_cache_size``: bytes per token, cache of a batch, append step, crossover with the weights.
- ``models``: published model shapes (MHA, GQA, MQA, MLA, windows) and their parameter counts.
- ``decode_work``: key/value projection counts of generation with and without a cache.
- ``attention``: exact NumPy attention: softmax, causal mask, MHA, GQA and MQA.
- ``mla``: multi-head latent attention: the latent cache, expanded on use or absorbed.
- ``kv_quant``: int8 and float8 storage of keys and values, scales, and the errors they cause.
- ``flash``: attention without the n x n table: naive vs tiled (FlashAttention Algorithm 1), merging
  partial results, and the HBM traffic of each.
- ``measure``: peak memory and best wall time of a call; this machine's memory bandwidth.
- ``llama``: the Llama-style decoder in torch, its KV cache, generation, checkpoint loading.
- ``pretrained``: SmolLM2-135M-Instruct read from its GGUF file into ``llama``, and its tokenizer.
- ``text_data``: the byte-level text (standard-library docstrings) the model learns from, and
  English prose (the Python language reference) for the pretrained model.
- ``step_cost``: FLOPs and bytes of a forward step; arithmetic intensity.
- ``decode_timing``: timing generation step by step, or one step at chosen positions; fitting
  scaling exponents.
- ``roofline``: chips, the roofline, the decode ceiling, the batch that fits.
- ``paged_kv``: the paged KV allocator (blocks, free list, block tables, copy-on-write).
- ``paged_attention``: attention that reads a sequence's keys and values through its block table.
- ``serving_sim``: a seeded serving workload and the memory each reservation scheme wastes.
- ``eviction``: eviction policies and int8 for old tokens, a cache that applies them per layer and K/V head,
  chunked runs, and static policies scored in one pass.
- ``layer_sharing``: adjacent layers sharing one cache (CLA-style sharing, MiniCache-style slerp).
- ``eviction_results``: SmolLM2's stored eviction measurements and what lesson 06 reads off them.
- ``panels``: the widget panels, one module per lesson panel (the only modules that need ipywidgets),
  and ``panels.output``, how every panel shows a redrawn figure.
- ``checks``: the exercise checkers (``checks.core`` holds the shared machinery).
"""
