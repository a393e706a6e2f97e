"""Print the errors 8-bit storage causes on lesson 02's test-bed attention head.

For keys and for values: bf16, then int8, e4m3 and e5m2 with a scale per tensor, per channel,
per token, and an uncalibrated scale of 1.0. The same table the lesson shows.

    python -m benchmarks.kv_quant_errors
"""

from helpers.kv_quant import error_table_text

if __name__ == "__main__":
    print(error_table_text(seed=0))
