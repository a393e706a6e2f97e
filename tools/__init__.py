"""Course tooling: generating exercises from solutions, executing notebooks."""
