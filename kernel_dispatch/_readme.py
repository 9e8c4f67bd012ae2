"""Generated blocks of the README: text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers,
rewritten by the code that owns them (the support table by ``kernel_dispatch.info``, the speed summary by
``kernel_dispatch.bench --docs``) and compared with their generators by the tests."""
from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def block(text: str, name: str) -> str:
    """The stripped text between the ``name`` markers of ``text``; ValueError naming them when absent."""
    start, end = markers(name)
    if start not in text or end not in text:
        raise ValueError(f"README: expected the markers {start} and {end}")
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def replace_block(path: str | Path, name: str, body: str) -> None:
    """Rewrite the text between the ``name`` markers of the file at ``path`` with ``body``."""
    path = Path(path)
    text = path.read_text()
    block(text, name)  # both markers present
    start, end = markers(name)
    head, rest = text.split(start, 1)
    path.write_text(f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}")
