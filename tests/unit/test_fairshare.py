from __future__ import annotations

import math

import pytest

from trainhouse.scheduler.fairshare import UsageLedger


def test_usage_decays_with_the_half_life() -> None:
    ledger = UsageLedger({"ann": 100.0}, at=0.0, half_life=10.0)
    ledger.advance(10.0, [])
    assert ledger.values["ann"] == pytest.approx(50.0)
    ledger.advance(30.0, [])
    assert ledger.values["ann"] == pytest.approx(12.5)


def test_running_jobs_accrue_and_starts_are_charged() -> None:
    ledger = UsageLedger(at=0.0, half_life=1e12, entry_seconds=300.0)
    ledger.charge_start("bob", 0.5)
    assert ledger.values["bob"] == pytest.approx(150.0)
    ledger.advance(100.0, [("bob", 0.5), ("cy", 1.0)])
    assert ledger.values["bob"] == pytest.approx(200.0)
    assert ledger.values["cy"] == pytest.approx(100.0)


def test_accrual_matches_the_exact_integral_closely() -> None:
    # a constant rate r for T seconds with decay: r * h / ln2 * (1 - 2^(-T/h))
    h, r, total = 3600.0, 1.0, 7200.0
    ledger = UsageLedger(at=0.0, half_life=h)
    for k in range(1, 73):
        ledger.advance(k * 100.0, [("ann", r)])
    exact = r * h / math.log(2) * (1 - 2 ** (-total / h))
    assert ledger.values["ann"] == pytest.approx(exact, rel=1e-3)


def test_time_never_runs_backwards_and_half_life_must_be_positive() -> None:
    ledger = UsageLedger({"ann": 1.0}, at=50.0)
    ledger.advance(40.0, [("ann", 1.0)])
    assert ledger.values == {"ann": 1.0} and ledger.at == 50.0
    with pytest.raises(ValueError, match="half-life"):
        UsageLedger(at=0.0, half_life=0)
