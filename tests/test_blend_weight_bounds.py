"""What a blend's exact weights and its length may cost (issue 23, item 4): a weight whose exact fraction is
astronomically large or fine (``Decimal("1e-99999999")``, a fraction over 10**99999999) is refused naming it before
it is converted, as is a length no dataset can have; every float and long double is still taken exactly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import varstore
from varstore.errors import VarstoreError
from varstore.torch import BlendedDataset

SOURCES = {"a": list(range(3)), "b": list(range(5))}
# The promised bounds: an exact weight's numerator and denominator have at most 16,512 bits, and a Decimal's may
# reach 10**4970, the largest power of ten below 2**16512 (4970 * log2(10) = 16,510.0; 4971 * log2(10) = 16,513.3).
WEIGHT_BITS = 16_512
DECIMAL_SCALE = 4970
# How long the data-path subprocess may take before the test fails: a safety net against the hang it guards
# against (minutes of big-integer arithmetic), far above the seconds importing torch takes on a busy machine.
SUBPROCESS_SAFETY_NET_S = 600


class Unconvertible(Decimal):
    """A Decimal that fails the test if anything converts it to a fraction: the refusal must come first."""

    def as_integer_ratio(self) -> tuple[int, int]:
        raise AssertionError(f"{self!r} was converted to an exact fraction before its size was judged")


def blend_with(weight: object) -> BlendedDataset:
    return BlendedDataset(SOURCES, {"a": weight, "b": 1}, num_samples=10)


@pytest.mark.parametrize("spelling", ["1e-99999999", "1e+99999999", "3" * 5000, "0." + "3" * 5000, "1e-4971"])
def test_a_decimal_weight_beyond_the_bound_is_refused_naming_it_before_it_is_converted(spelling: str) -> None:
    with pytest.raises(VarstoreError, match=r"the weight of source 'a' \(segment at 0\) is .*round it"):
        blend_with(Unconvertible(spelling))


@pytest.mark.parametrize(
    ("spelling", "value"),
    [("1e-4970", Fraction(1, 10**DECIMAL_SCALE)), ("1e4969", Fraction(10 ** (DECIMAL_SCALE - 1))),
     ("9" * DECIMAL_SCALE, Fraction(10**DECIMAL_SCALE - 1)),
     ("0." + "7" * (DECIMAL_SCALE - 1) + "1", Fraction(7 * (10 ** (DECIMAL_SCALE - 1) - 1) // 9 * 10 + 1, 10**DECIMAL_SCALE))],
)
def test_a_decimal_weight_within_the_bound_is_taken_exactly(spelling: str, value: Fraction) -> None:
    blend = blend_with(Decimal(spelling))
    exact = BlendedDataset(SOURCES, {"a": value, "b": 1}, num_samples=10)
    assert blend._segments[0].root.numerator == exact._segments[0].root.numerator
    assert blend._segments[0].root.denominator == exact._segments[0].root.denominator


def test_fractions_and_integers_are_bounded_by_the_bits_of_their_numerator_and_denominator() -> None:
    for weight in (Fraction(1, 2 ** (WEIGHT_BITS - 1)), Fraction(2**WEIGHT_BITS - 1, 3), 2**WEIGHT_BITS - 1):
        blend_with(weight)
    for weight in (Fraction(1, 2**WEIGHT_BITS), Fraction(2**WEIGHT_BITS, 3), 2**WEIGHT_BITS, 10**(10**6)):
        with pytest.raises(VarstoreError, match=r"the weight of source 'a' .*-bit numerator or denominator.*round it"):
            blend_with(weight)


def test_every_float_and_long_double_is_within_the_bound() -> None:
    quad_smallest = Fraction(1, 2**16494)  # the smallest IEEE quad (aarch64's long double): 2**-(16382 + 112)
    for info in (np.finfo(np.float64), np.finfo(np.longdouble)):
        for weight in (info.smallest_subnormal, info.max):
            blend_with(weight)
    blend_with(quad_smallest)
    blend_with(Decimal.from_float(5e-324))  # the smallest float's exact decimal expansion: 751 digits, exponent -1074


def test_a_blend_longer_than_an_index_can_count_is_refused_and_the_longest_one_has_a_len() -> None:
    for num_samples in (sys.maxsize + 1, 10**30, 10**5000):
        with pytest.raises(VarstoreError, match=r"num_samples must be at least 1 and at most .* not "):
            BlendedDataset(SOURCES, {"a": 1, "b": 1}, num_samples=num_samples)
    for number in (float("inf"), float("nan")):
        with pytest.raises(VarstoreError, match="num_samples must be an integer"):
            BlendedDataset(SOURCES, {"a": 1, "b": 1}, num_samples=number)
    longest = BlendedDataset(SOURCES, {"a": 1, "b": 1}, num_samples=sys.maxsize)
    assert len(longest) == sys.maxsize


@pytest.mark.timeout(SUBPROCESS_SAFETY_NET_S + 300)
def test_a_data_path_weight_beyond_the_bound_is_refused_naming_it_without_computing_it(tmp_path: Path) -> None:
    for name in ("web", "code"):
        with varstore.ShardedWriter(tmp_path / name) as writer:
            writer.extend([b"x", b"y"])
    code = textwrap.dedent("""
        from varstore.errors import VarstoreError
        from varstore.torch import BlendedDataset
        try:
            BlendedDataset.from_data_path("1e-99999999 web 1 code", num_samples=10)
        except VarstoreError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=SUBPROCESS_SAFETY_NET_S)
    assert done.returncode == 0, done.stderr
    assert "the weight of source 'web' (segment at 0) is Decimal('1E-99999999')" in done.stdout
    web, code = tmp_path / "web", tmp_path / "code"
    spelled = BlendedDataset.from_data_path(f"3/10 {web} 0.7 {code}", num_samples=10)  # ratios are still weights
    assert spelled.describe(10)[str(web)].samples == 3
