"""The step cost's knots and basis (bandit/stats/steps.py): interpolation equal to numpy's, the last segment
extended beyond the last knot, and knots that reach every union of drafts."""

import numpy as np
import pytest

from bandit.stats import steps


@pytest.mark.parametrize("k, d", [(4, 8), (8, 6), (1, 1), (3, 2)])
def test_knots_cover_every_single_draft_and_the_largest_union(k, d):
    kn = steps.knots_for(k, d)
    assert kn[: k + 1] == tuple(range(1, k + 2))  # every block of one drafter has a knot of its own
    assert kn[-1] == 1 + d * k  # the union of every draft is the last
    assert all(a < b for a, b in zip(kn, kn[1:]))


def test_basis_interpolates_as_numpy_and_extends_the_last_segment():
    rng = np.random.default_rng(0)
    kn = steps.knots_for(4, 8)
    f = np.sort(rng.uniform(1, 100, len(kn)))
    q = rng.integers(1, kn[-1] + 1, 500)
    np.testing.assert_allclose(steps.basis(q, kn) @ f, np.interp(q, kn, f), rtol=1e-12)
    slope = (f[-1] - f[-2]) / (kn[-1] - kn[-2])
    assert steps.basis([kn[-1] + 7], kn)[0] @ f == pytest.approx(f[-1] + 7 * slope)
    np.testing.assert_allclose(steps.basis(q, kn).sum(1), 1.0)


def test_summed_adds_each_groups_passes():
    kn = (1, 2, 3, 5)
    got = steps.summed([1, 1, 4, 2], [0, 0, 1, 1], 3, kn)
    np.testing.assert_allclose(got, [[2, 0, 0, 0], [0, 1, 0.5, 0.5], [0, 0, 0, 0]])
