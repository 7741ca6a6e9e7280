"""Device gradients that share memory with what a step writes are stepped through a device copy, as on the
host: a shifted view of the parameter, another leaf's parameter, the state."""
import numpy as np
import pytest
from numba import cuda

import numbaopt as no


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.parametrize("rule", [no.Descent(0.1), no.chain(no.ClipNorm(1.0), no.Adam(0.1))], ids=repr)
@pytest.mark.parametrize("shift", [-2, 1])
def test_shifted_view_of_its_own_device_parameter(rule, shift):
    n = 6
    host = np.linspace(-1, 1, n + 4)
    a, b = _dev(host), _dev(host)
    sa, sb = no.setup(rule, a[2:2 + n]), no.setup(rule, b[2:2 + n])
    for _ in range(2):
        fresh = _dev(b[2 + shift:2 + shift + n].copy_to_host())
        no.update_(sa, a[2:2 + n], a[2 + shift:2 + shift + n])
        no.update_(sb, b[2:2 + n], fresh)
    np.testing.assert_array_equal(a.copy_to_host(), b.copy_to_host())


def test_device_tree_gradients_swapped_between_leaves():
    def run(fresh):
        m = {"a": _dev(np.linspace(-1, 1, 5)), "b": _dev(np.linspace(2, 3, 5))}
        s = no.setup(no.Descent(0.5), m)
        for _ in range(3):
            g = {"a": m["b"], "b": m["a"]}
            if fresh:
                g = {k: _dev(v.copy_to_host()) for k, v in g.items()}
            s, m = no.update_(s, m, g)
        return {k: v.copy_to_host() for k, v in m.items()}

    got, ref = run(False), run(True)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
