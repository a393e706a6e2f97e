"""Print the errors 8-bit storage causes on lesson 02's test-bed attention head.

For keys and for values: bf16, then int8, e4m3 and e5m2 with a scale per tensor, per channel,
per token, and an uncalibrated scale of 1.0. The same table the lesson shows.

    python -m benchmarks.kv_quant_errors
"""

from helpers.kv_quant import error_table


def main() -> None:
    print(f"{'stored':7} {'format':6} {'scale':13} {'tensor error':>13} {'weight moved':>13} {'output error':>13}")
    for r in error_table(seed=0):
        print(f"{r['which']:7} {r['fmt']:6} {r['scaling']:13} {100 * r['reconstruction']:>12.2f}% "
              f"{100 * r['weights_tv']:>12.2f}% {100 * r['output']:>12.2f}%")


if __name__ == "__main__":
    main()
