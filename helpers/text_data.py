"""Text the course's small model is trained and measured on: the Python standard library's
own docstrings, read from the running interpreter's files (nothing is downloaded).

Tokens are bytes: ids 0-255 are the UTF-8 bytes of the text, and id 256 (BOS) starts every
document. One docstring is one document. The split into training and held-out documents is
fixed by a hash of each docstring's module path, so it is the same on every machine.

``language_reference`` gives longer English prose for the pretrained model (SmolLM2, which has
its own tokenizer): sections of the Python language reference that ship with the interpreter.
"""

from __future__ import annotations

import ast
import sysconfig
import zlib
from functools import lru_cache
from pathlib import Path

import torch

BOS = 256
VOCAB_SIZE = 257
SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter", "turtledemo", "ensurepip"}


@lru_cache(maxsize=1)
def stdlib_docstrings() -> tuple[tuple[str, str], ...]:
    """(module path, docstring) for every module, class and function docstring of the standard
    library's .py files, in a fixed order; docstrings under 40 characters are left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if SKIP & set(relative.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:
                    found.append((relative.as_posix(), doc))
    return tuple(dict.fromkeys(found))  # the same docstring twice in a file counts once


def split(documents, held_out_percent: int = 5) -> tuple[list[str], list[str]]:
    """(training, held-out) docstrings; a module's documents all go to the same side."""
    train, held_out = [], []
    for module, text in documents:
        (held_out if zlib.crc32(module.encode()) % 100 < held_out_percent else train).append(text)
    return train, held_out


def encode(text: str) -> list[int]:
    """BOS followed by the UTF-8 bytes of ``text``."""
    return [BOS, *text.encode("utf-8")]


def decode(ids) -> str:
    """Text from token ids (BOS dropped; invalid UTF-8 replaced)."""
    return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


def token_stream(texts, generator: torch.Generator | None = None) -> torch.Tensor:
    """All ``texts`` encoded and concatenated into one 1-D tensor, in a shuffled order if a generator is given."""
    order = torch.randperm(len(texts), generator=generator).tolist() if generator is not None else range(len(texts))
    return torch.tensor([t for i in order for t in encode(texts[i])], dtype=torch.long)


def language_reference(topic: str) -> str:
    """One section of the Python language reference (plain text, thousands of characters), as the
    interpreter ships it for ``help()`` (``pydoc_data.topics``), e.g. ``"execmodel"``."""
    from pydoc_data.topics import topics

    if topic not in topics:
        raise ValueError(f"unknown topic {topic!r}; e.g. {', '.join(sorted(topics)[:8])} ({len(topics)} in all)")
    return topics[topic]
