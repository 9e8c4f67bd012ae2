"""Where the lazy attention kernels find a sequence's rows: fixed-length batches or packed documents.

A kernel factory builds one ``T.prim_func`` for either layout; a :class:`Layout` supplies the buffer shapes, the
grid's sequence axis, the CTA's sequence and the index expressions, so the kernel bodies are shared:

- fixed length: Q [B, H, L, D] (K, V with Hkv heads), row vectors (LSE, Delta, ...) [B, H, L], Lens [B] int32
  (lengths without the right padding); a sequence is its batch index b.
- packed documents (``varlen``, SPEC section 4): Q [T, H, D] (heads and dims contiguous), row vectors [H, T],
  Seqs [N + 1] int32 (cu_seqlens); a sequence is its first token cu_seqlens[n], its length
  cu_seqlens[n + 1] - cu_seqlens[n]. Tiles that reach past a document's end read the next document's rows (or
  nothing past T: the copies bound-check); the kernels mask them as they mask padding, and every store of a
  varlen kernel is predicated on the row being inside its document, so no CTA writes another document's rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROW_ALIGN = 4  # the backward's row vectors: rows padded to a multiple of this many fp32 (16 bytes) for TMA loads
TMA_SMEM_ALIGN = 32  # fp32 entries: a TMA load's shared-memory destination is 128-byte aligned (each pipeline stage)


@dataclass(frozen=True)
class Layout:
    """The symbolic sizes of one layout (``T.dynamic`` variables), the static head dim D, and index expressions."""
    varlen: bool
    D: int
    H: Any
    Hkv: Any
    B: Any = None  # fixed length: batch
    L: Any = None  # fixed length: padded length
    tokens: Any = None  # varlen: T
    seqs: Any = None  # varlen: N + 1

    @staticmethod
    def make(varlen: bool, head_dim: int) -> "Layout":
        import tilelang.language as T

        if varlen:
            tokens, seqs, H, Hkv = T.dynamic("T, NS, H, Hkv")
            return Layout(True, head_dim, H, Hkv, tokens=tokens, seqs=seqs)
        B, L, H, Hkv = T.dynamic("B, L, H, Hkv")
        return Layout(False, head_dim, H, Hkv, B=B, L=L)

    def rows_shape(self, heads) -> list:
        """Q, K, V, O, dO and their gradients."""
        return [self.tokens, heads, self.D] if self.varlen else [self.B, heads, self.L, self.D]

    def vec_shape(self, heads, row_len=None) -> list:
        """One fp32 value per (head, row): LSE, Delta, dO . O; ``row_len`` (a symbolic size >= T or L) for the
        backward's vectors, whose rows are padded to a multiple of 16 bytes for TMA loads."""
        n = row_len if row_len is not None else (self.tokens if self.varlen else self.L)
        return [heads, n] if self.varlen else [self.B, heads, n]

    def inv_shape(self, row_len) -> list:
        """1/i of every row (one value per token, no head axis): [row_len] (varlen) or [B, row_len]."""
        return [row_len] if self.varlen else [self.B, row_len]

    def inv(self, X, seq, r0, n: int):
        """The region of 1/i values [r0, r0 + n) of sequence ``seq``: [n]."""
        if self.varlen:
            return X[seq + r0:seq + r0 + n]
        return X[seq, r0:r0 + n]

    def seqs_shape(self) -> list:
        return [self.seqs] if self.varlen else [self.B]

    def batch(self):
        """The grid's sequence axis."""
        return self.seqs - 1 if self.varlen else self.B

    def span(self, max_seqlen):
        """The rows the grid's block axis covers: L, or the ``max_seqlen`` scalar parameter (varlen)."""
        return max_seqlen if self.varlen else self.L

    def sequence(self, bz, Seqs):
        """(seq, lb): the CTA's sequence handle (batch index, or first token) and its length."""
        if self.varlen:
            return Seqs[bz], Seqs[bz + 1] - Seqs[bz]
        return bz, Seqs[bz]

    def live(self, m0, lb):
        """Whether the CTA of the block starting at row m0 has work: varlen, a block at or past its document's end
        exits before loading anything (the grid covers max_seqlen rows of every document); fixed length, every
        block works (padding rows are written)."""
        return m0 < lb if self.varlen else m0 < self.L

    def row_end(self, lb):
        """The end of the rows whose stored LSE is meaningful: the document's (varlen) or the padded length L
        (fixed length: padding rows have an LSE too)."""
        return lb if self.varlen else self.L

    def rows(self, X, seq, h, r0, n: int):
        """The region of rows [r0, r0 + n) of head h of sequence ``seq``: [n, D]."""
        if self.varlen:
            return X[seq + r0:seq + r0 + n, h, :]
        return X[seq, h, r0:r0 + n, :]

    def vec(self, X, seq, h, r0, n: int):
        """The region of row values [r0, r0 + n) of head h of sequence ``seq``: [n]."""
        if self.varlen:
            return X[h, seq + r0:seq + r0 + n]
        return X[seq, h, r0:r0 + n]

    def vec_pad(self) -> int:
        """Extra entries of a shared buffer that :meth:`vec_tma` fills: TMA_SMEM_ALIGN (varlen: at least ROW_ALIGN,
        and the buffer's pipeline stages stay 128-byte aligned for row blocks of a multiple of 32) or 0."""
        return TMA_SMEM_ALIGN if self.varlen else 0

    def vec_tma(self, X, seq, h, r0, n: int):
        """The region of row values [r0, r0 + n) of head h (h None: a vector without a head axis) for a TMA load
        into a shared buffer of n + :meth:`vec_pad` entries, whose entry j + :meth:`vec_offset` is row r0 + j.

        A TMA load's start in the contiguous dimension must be 16-byte aligned (an unaligned one is an illegal
        instruction on an H100) and its shared-memory destination 128-byte aligned (else a misaligned address); a
        document starts at any token, so the varlen region starts at the aligned token at or before seq + r0 and is
        :meth:`vec_pad` entries longer. Fixed length: rows start at multiples of the tile."""
        if self.varlen:
            a = seq + r0 - (seq + r0) % ROW_ALIGN
            m = n + self.vec_pad()
            return X[a:a + m] if h is None else X[h, a:a + m]
        return X[seq, r0:r0 + n] if h is None else X[seq, h, r0:r0 + n]

    def vec_offset(self, seq, r0):
        """Where row r0 sits in a buffer loaded by :meth:`vec_tma`."""
        return (seq + r0) % ROW_ALIGN if self.varlen else 0

    def store_vec_macro(self, n: int):
        """A macro ``store(frag, X, seq, h, r0, lb)``: row values [r0, r0 + n) of ``frag`` [n] into X; varlen: only
        the rows before lb (fixed length: all, padding rows included, as the fixed-length contract has them)."""
        import tilelang.language as T

        if self.varlen:
            @T.macro
            def store(frag, X, seq, h, r0, lb):
                for i in T.Parallel(n):
                    if r0 + i < lb:
                        X[h, seq + r0 + i] = frag[i]
        else:
            @T.macro
            def store(frag, X, seq, h, r0, lb):
                T.copy(frag, X[seq, h, r0:r0 + n])
        return store

    def store_inv_macro(self, n: int):
        """A macro ``store(frag, X, seq, r0, lb)``: 1/i values [r0, r0 + n) of ``frag`` [n] into X
        (:meth:`inv_shape`); varlen: only the rows before lb."""
        import tilelang.language as T

        if self.varlen:
            @T.macro
            def store(frag, X, seq, r0, lb):
                for i in T.Parallel(n):
                    if r0 + i < lb:
                        X[seq + r0 + i] = frag[i]
        else:
            @T.macro
            def store(frag, X, seq, r0, lb):
                T.copy(frag, X[seq, r0:r0 + n])
        return store

    def store_rows_macro(self, n: int):
        """A macro ``store(tile, X, seq, h, r0, lb)``: rows [r0, r0 + n) of ``tile`` [n, D] (shared) into X;
        fixed length: one bulk copy of the whole tile; varlen: only the rows before lb."""
        import tilelang.language as T

        D = self.D
        if self.varlen:
            @T.macro
            def store(tile, X, seq, h, r0, lb):
                for i, j in T.Parallel(n, D):
                    if r0 + i < lb:
                        X[seq + r0 + i, h, j] = tile[i, j]
        else:
            @T.macro
            def store(tile, X, seq, h, r0, lb):
                T.copy(tile, X[seq, h, r0:r0 + n, :])
        return store
