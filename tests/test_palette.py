"""The class colour map (segadv/data/palette.py)."""

import numpy as np

from segadv.data.palette import palette


def test_palette():
    pal = palette(6)
    assert pal.shape == (6, 3) and pal.dtype == np.uint8
    assert (pal[0] == 0).all()
    assert len({tuple(c) for c in pal}) == 6
    np.testing.assert_array_equal(palette(6), pal)
