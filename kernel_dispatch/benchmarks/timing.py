"""Timing on one device: warm-up, L2 flushed before every timed run, CUDA events around each run,
median and spread of the repeats, and the peak memory of one run; several callables timed in alternation
(:meth:`Timer.measure_interleaved`), so that each sees the same span of the card's clocks and power cap.

On a CPU (the ``--quick`` smoke) the same calls time with ``time.perf_counter`` and report no memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np
import torch

FLUSH_BYTES = 256 * 2**20  # several times the L2 of an H100 (50 MB) or H200 (60 MB)


@dataclass(frozen=True)
class Settings:
    """How many runs one measurement makes.

    warmup: untimed runs after the first call (which compiles and is timed apart as first_call_s).
    min_reps / max_reps: bounds on the timed runs; within them, as many as fit in budget_s.
    rounds: :meth:`Timer.measure_interleaved` splits each callable's timed runs over this many rounds.
    """

    warmup: int = 3
    min_reps: int = 5
    max_reps: int = 50
    budget_s: float = 0.3
    rounds: int = 10


@dataclass(frozen=True)
class Prepared:
    """What :meth:`Timer.prepare` learnt of a callable: its first call (seconds, compilation included), the peak
    memory of one run (MiB, None on CPU) and how many timed runs fit the budget."""

    first_call_s: float
    peak_mib: float | None
    reps: int


class Timer:
    """Times callables on ``device`` with the L2 flushed before every timed run."""

    def __init__(self, device: str | torch.device, settings: Settings | None = None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.settings = settings or Settings()
        self._flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=self.device) if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def flush_l2(self) -> None:
        """Overwrite a buffer larger than the L2 so the next run starts with a cold cache."""
        if self._flush is not None:
            self._flush.zero_()

    def release(self) -> None:
        """Return cached blocks to the device (after an out-of-memory error, between shapes)."""
        if self.cuda:
            torch.cuda.empty_cache()

    def _wall_ms(self, fn: Callable[[], object]) -> float:
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return (time.perf_counter() - t) * 1e3

    def _repeat_ms(self, fn: Callable[[], object], reps: int) -> list[float]:
        if not self.cuda:
            out = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e3)
            return out
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self.flush_l2()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def peak_mib(self, fn: Callable[[], object]) -> float | None:
        """Peak memory of one run of ``fn`` in MiB above what was allocated before it (None on CPU)."""
        if not self.cuda:
            return None
        self.sync()
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        out = fn()
        self.sync()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del out
        return peak / 2**20

    def prepare(self, fn: Callable[[], object]) -> Prepared:
        """First call (timed apart), warm-up, peak memory, and the number of timed runs that fit the budget."""
        s = self.settings
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        first_call_s = time.perf_counter() - t0
        for _ in range(s.warmup):
            fn()
        peak = self.peak_mib(fn)
        estimate = max(self._wall_ms(fn), 1e-3)
        reps = int(min(s.max_reps, max(s.min_reps, s.budget_s * 1e3 // estimate)))
        return Prepared(round(first_call_s, 3), None if peak is None else round(peak, 1), reps)

    @staticmethod
    def summarize(times_ms: list[float], prepared: Prepared) -> dict:
        """The :meth:`measure` dict of the timed runs ``times_ms``."""
        times = np.array(times_ms)
        q1, med, q3 = np.percentile(times, [25, 50, 75])
        return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3), "min_ms": float(times.min()),
                "max_ms": float(times.max()), "reps": len(times_ms), "first_call_s": prepared.first_call_s,
                "peak_mib": prepared.peak_mib}

    def measure(self, fn: Callable[[], object]) -> dict:
        """Time ``fn``: first call, warm-up, peak memory, then the timed repeats.

        Returns a dict of milliseconds (median_ms, q1_ms, q3_ms, min_ms, max_ms), the number of
        repeats, first_call_s (seconds, compilation included) and peak_mib (None on CPU).
        """
        p = self.prepare(fn)
        return self.summarize(self._repeat_ms(fn, p.reps), p)

    def measure_interleaved(self, fns: dict[Hashable, Callable[[], object]]) -> dict[Hashable, dict | Exception]:
        """Time every callable of ``fns`` in alternation, for ratios between them that the card's state cannot move.

        Each is prepared as by :meth:`measure` (first call, warm-up, peak memory, its number of timed runs), then
        ``settings.rounds`` rounds run, every other one in reverse order, in which each callable makes one untimed
        run and then its share of timed runs (its reps over the rounds, rounded up). Under a power cap the clocks
        fall as the card heats and rise in a pause, so callables timed one after the other see different clocks;
        here every one is timed across the same span. Returns per key the :meth:`measure` dict, or the exception
        the callable raised (it then leaves the later rounds).
        """
        out: dict[Hashable, dict | Exception] = {}
        live: dict[Hashable, Prepared] = {}
        for key, fn in fns.items():
            try:
                live[key] = self.prepare(fn)
            except Exception as e:  # noqa: BLE001 (the caller reports it; the others still run)
                out[key] = e
                self.release()
        rounds = max(1, self.settings.rounds)
        times: dict[Hashable, list[float]] = {key: [] for key in live}
        for r in range(rounds):
            for key in list(live) if r % 2 == 0 else list(live)[::-1]:
                if key not in live:
                    continue
                try:
                    fns[key]()
                    times[key] += self._repeat_ms(fns[key], -(-live[key].reps // rounds))
                except Exception as e:  # noqa: BLE001
                    out[key] = e
                    del live[key]
                    self.release()
        out.update({key: self.summarize(times[key], p) for key, p in live.items()})
        return {key: out[key] for key in fns}


def copy_bandwidth_gbps(timer: Timer, nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 B/s), counting bytes read plus bytes written.

    Times ``dst.copy_(src)`` of a large tensor (1 GiB on CUDA, 64 MiB on CPU) like any other run.
    """
    nbytes = nbytes or (2**30 if timer.cuda else 64 * 2**20)

    def copy_ms() -> float:
        src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=timer.device)
        dst = torch.empty_like(src)
        return timer.measure(lambda: dst.copy_(src))["median_ms"]

    ms = copy_ms()
    timer.release()
    return 2 * nbytes / (ms * 1e-3) / 1e9
