"""Exercise checkers: one module per lesson, sharing ``core``."""
