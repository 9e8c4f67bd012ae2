"""Rebuild data/austen.txt from Debian's r-cran-janeaustenr package (how the corpus was made).

    apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb pkg
    python data/extract_janeaustenr.py pkg/usr/lib/R/site-library/janeaustenr/data/Rdata data/austen.txt

The package stores each novel as an R character vector (one element per line of the Project
Gutenberg text) in R's lazy-load database: ``Rdata.rdx`` (gzip) indexes ``Rdata.rdb``, whose
entries are zlib-compressed R serializations (XDR format). This reader handles only the types
those files use.
"""
from __future__ import annotations

import gzip
import struct
import sys
import zlib

NOVELS = ("prideprejudice", "sensesensibility", "persuasion", "northangerabbey")
_NIL, _REF, _SYM, _PAIRLIST, _CHAR, _LGL, _INT, _REAL, _STR, _VEC = 254, 255, 1, 2, 9, 10, 13, 14, 16, 19


class _Reader:
    """A minimal reader of R's XDR serialization (version 2 or 3)."""

    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.data, self.pos, self.refs = data, 2, []
        version = self._int()
        self.pos += 8  # writer and minimal reader R versions
        if version == 3:
            self.pos += 4 + self._int()  # native encoding name

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def item(self):
        flags = self._int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in (_NIL, 253, 242, 251):  # NULL, global env, empty env, missing arg
            return None
        if kind == _REF:
            return self.refs[(flags >> 8 or self._int()) - 1]
        if kind == _SYM:
            sym = ("symbol", self.item())
            self.refs.append(sym)
            return sym
        if kind == _PAIRLIST:
            attrs = self.item() if has_attr else None  # noqa: F841 (read to advance)
            tag = self.item() if has_tag else None
            head = self.item()
            return [(tag, head)] + (self.item() or [])
        if kind == _CHAR:
            n = self._int()
            if n == -1:
                return None
            s = self.data[self.pos:self.pos + n].decode("utf-8")
            self.pos += n
            return s
        n = self._int()
        if kind in (_LGL, _INT):
            value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif kind == _REAL:
            value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        elif kind in (_STR, _VEC):
            value = [self.item() for _ in range(n)]
        else:
            raise ValueError(f"R type {kind} not handled (offset {self.pos})")
        if has_attr:
            value = (value, self.item())
        return value


def _named(value) -> dict:
    """{name: element} of an R list that carries a ``names`` attribute."""
    items, attrs = value
    names = next(v for (tag, v) in attrs if tag == ("symbol", "names"))
    return dict(zip(names, items))


def read_lazyload(base: str) -> dict[str, list]:
    """{variable name: value} of an R lazy-load database ``base``.rdx / ``base``.rdb."""
    with open(base + ".rdx", "rb") as f:
        index = _named(_Reader(gzip.decompress(f.read())).item())
    with open(base + ".rdb", "rb") as f:
        blob = f.read()
    out = {}
    for name, (offset, length) in _named(index["variables"]).items():
        value = _Reader(zlib.decompress(blob[offset + 4:offset + length])).item()
        out[name] = value[0] if isinstance(value, tuple) else value
    return out


def main(base: str, dest: str) -> None:
    novels = read_lazyload(base)
    text = "\n\n\n".join("\n".join(line or "" for line in novels[name]).strip() for name in NOVELS) + "\n"
    with open(dest, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
    print(f"{dest}: {len(text.encode())} bytes from {', '.join(NOVELS)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
