"""A check on generated CUDA: no shared buffer goes back to the TMA producer while an async wgmma reads it.

TileLang's pipeliner releases a stage of a pipelined shared buffer (``mbarrier[empty].arrive()``) after
the buffer's last read in program order. ``T.wgmma_gemm`` only issues the GEMM, so a kernel that issues
it and releases the buffer before ``T.wait_wgmma`` lets the producer's next TMA load overwrite operands
the tensor cores are still reading: a race neither the compiler nor a small test notices. A kernel that
issues ``T.wgmma_gemm`` must read the buffer once more after the wait (``touch = X_s[0, 0]``) to move the
release there. This check replays the consumer code (every committed wgmma group, every wait) and fails
when a release meets an in-flight reader; the shipped kernels use synchronous ``T.gemm`` and pass.
``reads_before_arrival`` fails an elementwise read of a TMA-loaded buffer before its barrier wait, and
``unfenced_stores`` a TMA store of a staged output tile without a barrier and an async-proxy fence after
the threads wrote it.
"""
from __future__ import annotations

import re

_WAIT = re.compile(r"mbarrier\[(.+?)\]\.wait\(")
_TMA = re.compile(r"tma_load\([^,]+, mbarrier\[.+?\], \(&\(\(\(\w+\*\)(\w+)\)")
_DESC = re.compile(r"initialize_wgmma_descriptor<[^>]*>\(\w+, \(&\(\(\(\w+\*\)(\w+)\)")
_WAIT_WGMMA = re.compile(r"(?:wait_wgmma|warpgroup_wait)<(\d+)>")
_ARRIVE = re.compile(r"mbarrier\[(.+?)\]\.arrive\(\)")
_SUFFIX = re.compile(r"\b([A-Za-z]\w*?)_\d+\b")


def _barrier(expr: str) -> str:
    """A barrier index with the loop variable's codegen suffix dropped (producer ``k``, consumer ``k_1``)."""
    return _SUFFIX.sub(r"\1", expr)


def release_violations(src: str) -> list[str]:
    """Lines of the consumer code of ``src`` (a warp-specialized TileLang CUDA kernel) that release a
    shared buffer still read by an uncompleted wgmma group; [] when there are none (or no async wgmma)."""
    if "warpgroup_reg_alloc<" not in src:
        return []
    producer, consumer = src.split("warpgroup_reg_alloc<", 1)
    empty_of: dict[str, str] = {}  # producer's "buffer free" barrier -> the buffer it then loads
    waited = None
    for line in producer.splitlines():
        if m := _WAIT.search(line):
            waited = _barrier(m.group(1))
        if (m := _TMA.search(line)) and waited is not None:
            empty_of.setdefault(waited, m.group(1))
    assert empty_of, "no producer TMA stage found: the parser no longer matches TileLang's output"
    in_flight: list[set[str]] = []  # committed wgmma groups not yet waited for, oldest first
    reading: set[str] = set()
    bad = []
    for no, line in enumerate(consumer.splitlines(), 1):
        if m := _DESC.search(line):
            reading.add(m.group(1))
        if "warpgroup_commit_batch" in line:
            in_flight.append(reading)
            reading = set()
        if m := _WAIT_WGMMA.search(line):
            keep = int(m.group(1))
            in_flight = in_flight[len(in_flight) - keep:] if keep else []
        if (m := _ARRIVE.search(line)) and _barrier(m.group(1)) in empty_of:
            buf = empty_of[_barrier(m.group(1))]
            if any(buf in g for g in in_flight):
                bad.append(f"consumer line {no}: releases {buf} while a wgmma reading it is in flight: {line.strip()}")
    return bad


_ONCE_TMA = re.compile(r"tma_load\([^,]+, mbarrier\[(\d+)\], \(&\(\(\(\w+\*\)(\w+)\)")


def reads_before_arrival(src: str) -> list[str]:
    """Lines of ``src`` that touch a shared buffer after a one-off TMA load into it (constant barrier index)
    was issued and before any wait on that barrier; [] when there are none."""
    lines = src.splitlines()
    bad = []
    for no, line in enumerate(lines):
        m = _ONCE_TMA.search(line)
        if not m:
            continue
        bar, buf = m.groups()
        use = re.compile(rf"\(\w+\*\){buf}\)")
        for later_no in range(no + 1, len(lines)):
            later = lines[later_no]
            if f"mbarrier[{bar}].wait(" in later:
                break
            if use.search(later) and "tma_load" not in later and "initialize_wgmma_descriptor" not in later:
                bad.append(f"line {later_no + 1}: touches {buf} before mbarrier[{bar}] says its TMA load "
                           f"arrived: {later.strip()[:120]}")
    return bad


_TMA_STORE = re.compile(r"tma_store\((\w+), \(&\(\(\(\w+\*\)(\w+)\)")
_BAR = re.compile(r"__sync_thread_partial\(|__syncthreads\(\)")


def unfenced_stores(src: str) -> list[str]:
    """TMA stores in ``src`` that read a shared buffer without, since the threads' last write to it, a barrier
    (every thread's write done) and then a ``fence_proxy_async`` (the writes visible to the TMA unit); []
    when every store is fenced."""
    bad, lines = [], src.splitlines()
    for n, line in enumerate(lines):
        if not (m := _TMA_STORE.search(line)):
            continue
        desc, buf = m.groups()
        last = max((i for i in range(n) if f"{buf})[" in lines[i] and "tma_" not in lines[i]
                    and "descriptor" not in lines[i]), default=None)
        if last is None:
            bad.append(f"line {n + 1}: {desc} stores {buf}, which no thread wrote")
            continue
        between = lines[last + 1:n]
        bar = next((i for i, ln in enumerate(between) if _BAR.search(ln)), None)
        if bar is None or not any("fence_proxy_async" in ln for ln in between[bar:]):
            bad.append(f"line {n + 1}: {desc} stores {buf} without a barrier and an async-proxy fence after "
                       f"the write at line {last + 1}")
    return bad


def top_level_barriers(src: str, loop_header: str) -> int:
    """Barriers (``__sync_thread_partial`` or ``__syncthreads``) at the top level of the body of the first loop
    whose header contains ``loop_header`` (not inside any ``if`` of the body): the ones every iteration runs."""
    lines = src.splitlines()
    start = next((i for i, ln in enumerate(lines) if "for (" in ln and loop_header in ln), None)
    if start is None:
        raise ValueError(f"no loop with {loop_header!r} in the source")
    depth, count = 0, 0
    for ln in lines[start:]:
        if depth == 1 and _BAR.search(ln):
            count += 1
        depth += ln.count("{") - ln.count("}")
        if depth <= 0 and ln.strip() == "}":
            break
    return count
