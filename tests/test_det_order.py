"""The deterministic dQ order's schedule arithmetic (tools/hopper_sim/det_order.py) on a grid small
enough to work by hand: causal, s 512 (8 query blocks of 64, 4 key blocks of 128; key block n sees
query blocks 2n..7), 2 heads, 4 SMs, steps of 1, adds and wake-ups free."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "hopper_sim"))
import det_order  # noqa: E402

TOY = dict(t=1.0, add=0.0, wake=0.0, add_default=0.0, sms=4)


@pytest.mark.parametrize("order,expected", [
    # Unordered: head 0's key blocks 0-3 end at 8, 6, 4, 2; head 1's take those SMs at 2, 4, 6, 8
    # in block order (8, 6, 4 and 2 steps) and all end at 10.
    (None, 10.0),
    # Ascending: key block n adds query block m after n - 1 did, which adds m at m + 1 at the
    # earliest; every key block of head 0 ends at 8, and head 1 runs 8..16.
    ("ascending", 16.0),
    # Descending with the grid reversed: head 0's key blocks 3, 2, 1, 0 never wait (n + 1 adds m two
    # steps before n) and end at 2, 4, 6, 8; head 1's key blocks 3, 2, 1, 0 start at 2, 4, 4, 6 and
    # key block 0 (8 steps) ends at 14: the longest CTA of a head runs last.
    ("descending", 14.0),
])
def test_toy_grid_worked_by_hand(order, expected):
    assert det_order.grid_time(512, 2, 1, True, order, **TOY) == expected


def test_full_attention_orders_are_mirror_images():
    """Without a mask every key block sees every query block: the two orders wait alike."""
    for s in (512, 1024):
        assert det_order.grid_time(s, 3, 2, False, "ascending") == pytest.approx(
            det_order.grid_time(s, 3, 2, False, "descending"))
