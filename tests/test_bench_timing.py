"""Timer.measure_interleaved: candidates timed in alternation, so a card that slows as it heats (an H200 at its
power cap) moves every candidate's time alike; a failing candidate leaves the rounds with its exception."""
from __future__ import annotations

import pytest

from kernel_dispatch.benchmarks.common import Candidate, run_candidates
from kernel_dispatch.benchmarks.timing import Settings, Timer


class HeatingCard:
    """A fake device: every call costs ``cost * clock_factor`` ms, and every call slows the clock by 1 %."""

    def __init__(self):
        self.factor = 1.0
        self.calls: list[str] = []
        self.last = 0.0

    def fn(self, name: str, cost: float):
        def run():
            self.calls.append(name)
            self.last = cost * self.factor
            self.factor *= 1.01
        return run


def fake_timer(card: HeatingCard, settings: Settings) -> Timer:
    timer = Timer("cpu", settings)

    def repeat_ms(fn, reps):
        out = []
        for _ in range(reps):
            fn()
            out.append(card.last)
        return out
    timer._repeat_ms = repeat_ms
    timer._wall_ms = lambda fn: (fn(), 1.0)[1]
    return timer


def test_interleaved_ratio_holds_while_the_card_slows():
    """One after the other, the second candidate is timed on a slower clock; in alternation the ratio of the
    medians stays within 5 % of the true 2.0 (one after the other it is 2.0 * 1.01^k off)."""
    settings = Settings(warmup=2, min_reps=40, max_reps=40, budget_s=0.0, rounds=10)
    card = HeatingCard()
    one_by_one = {n: fake_timer(card, settings).measure(card.fn(n, c)) for n, c in (("a", 1.0), ("b", 2.0))}
    sequential = one_by_one["b"]["median_ms"] / one_by_one["a"]["median_ms"]
    card = HeatingCard()
    got = fake_timer(card, settings).measure_interleaved({"a": card.fn("a", 1.0), "b": card.fn("b", 2.0)})
    interleaved = got["b"]["median_ms"] / got["a"]["median_ms"]
    assert sequential > 2.0 * 1.4  # the drift the alternation removes
    assert interleaved == pytest.approx(2.0, rel=0.05)
    assert got["a"]["reps"] == got["b"]["reps"] == 40


def test_rounds_alternate_and_reverse():
    """Each round runs every candidate once untimed then its share of timed runs; odd rounds go in reverse."""
    settings = Settings(warmup=0, min_reps=4, max_reps=4, budget_s=0.0, rounds=2)
    card = HeatingCard()
    fake_timer(card, settings).measure_interleaved({"a": card.fn("a", 1.0), "b": card.fn("b", 1.0)})
    rounds = "".join(card.calls[4:])  # after each one's first call and its estimate run (no memory run on a CPU)
    assert "".join(card.calls[:4]) == "aabb"
    assert rounds == "a" * 3 + "b" * 3 + "b" * 3 + "a" * 3  # (1 untimed + 2 timed) per candidate and round


def test_a_failing_candidate_leaves_the_rounds():
    """A candidate raising in its first call, or in round 2, gets its exception; the others keep their runs."""
    settings = Settings(warmup=0, min_reps=6, max_reps=6, budget_s=0.0, rounds=3)
    card = HeatingCard()
    count = {"late": 0}

    def late():
        count["late"] += 1
        if count["late"] > 6:
            raise RuntimeError("out of memory in round 2")

    def early():
        raise ValueError("bad shape")
    got = fake_timer(card, settings).measure_interleaved({"ok": card.fn("ok", 1.0), "late": late, "early": early})
    assert isinstance(got["early"], ValueError) and isinstance(got["late"], RuntimeError)
    assert got["ok"]["reps"] == 6 and got["ok"]["median_ms"] > 0
    assert list(got) == ["ok", "late", "early"]


def test_run_candidates_records_errors_reasons_and_checks():
    """run_candidates: a candidate with a reason is not run, an error becomes the record's error, the checks run
    only where the forward ran."""
    settings = Settings(warmup=0, min_reps=2, max_reps=2, budget_s=0.0, rounds=2)
    card = HeatingCard()

    def broken():
        raise RuntimeError("no kernel for this shape")
    cands = [Candidate("golden", forward=card.fn("g", 1.0), fwd_bwd=card.fn("g2", 2.0), check=lambda: {"ok": 1}),
             Candidate("triton", reason="needs a GPU"),
             Candidate("tilelang", forward=broken, fwd_bwd=card.fn("t2", 1.0), check=lambda: {"ok": 2})]
    recs = run_candidates(cands, fake_timer(card, settings))
    assert [r["backend"] for r in recs] == ["golden", "triton", "tilelang"]
    assert recs[0]["fwd"]["reps"] == 2 and recs[0]["fwd_bwd"]["reps"] == 2 and recs[0]["check"] == {"ok": 1}
    assert recs[1]["fwd"] is None and recs[1]["check"] is None and recs[1]["reason"] == "needs a GPU"
    assert recs[2]["fwd"] == {"error": "RuntimeError: no kernel for this shape"} and recs[2]["check"] is None
    assert recs[2]["fwd_bwd"]["reps"] == 2
