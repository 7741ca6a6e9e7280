"""JAX interop against the real jax (and optax): jax.Array leaves are immutable parameters returned as jax.Arrays
of their dtype on their device or sharding; pytrees registered with jax.tree_util are containers, rebuilt with
their aux data; paths use JAX's keys. numbaopt never imports jax itself (checked in a fresh process)."""
import contextlib
import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
tu = jax.tree_util

import numbaopt as no  # noqa: E402

STEPS = 6


@contextlib.contextmanager
def x64(on: bool):
    """jax_enable_x64 set for the block, restored after it (other test modules set it at import)."""
    before = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", on)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


@tu.register_pytree_node_class
class Block:
    """A pytree node without keys (FlattenedIndexKey paths) and with aux data (``name``, ``act``)."""

    def __init__(self, w, extra, name, act=("relu", 2)):
        self.w, self.extra, self.name, self.act = w, extra, name, act

    def tree_flatten(self):
        return (self.w, self.extra), (self.name, self.act)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)


@dataclasses.dataclass
class Layer:
    """A dataclass registered with JAX: ``scale`` is a meta field (aux data), never trained."""

    w: object
    b: object
    scale: float = 1.0


tu.register_dataclass(Layer, data_fields=["w", "b"], meta_fields=["scale"])


def make_model(dtype, seed=0):
    rng = np.random.default_rng(seed)

    def r(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(dtype))

    return {"enc": Layer(r(3, 4), r(4), scale=0.5),
            "blk": Block(r(5), {"u": r(2, 2), "v": [r(3), r(1)]}, "blk0")}


def make_grads(dtype, seed=1, steps=STEPS):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        def r(*shape):
            return jnp.asarray(rng.standard_normal(shape).astype(dtype))
        out.append({"enc": Layer(r(3, 4), r(4), scale=0.5),
                    "blk": Block(r(5), {"u": r(2, 2), "v": [r(3), r(1)]}, "blk0")})
    return out


def leaves(tree):
    return tu.tree_leaves(tree)


def run_numbaopt(rule, m, gs, inplace):
    state = no.setup(rule, m)
    for g in gs:
        state, m = (no.update_ if inplace else no.update)(state, m, g)
    return state, m


def run_optax(opt, m, gs):
    import optax
    s = opt.init(m)
    for g in gs:
        u, s = opt.update(g, s, m)
        m = optax.apply_updates(m, u)
    return m


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_matches_optax_on_a_pytree(dtype, inplace):
    optax = pytest.importorskip("optax")
    tol = 1e-6 if dtype == np.float32 else 1e-12
    with x64(dtype == np.float64):
        m, gs = make_model(dtype), make_grads(dtype)
        arrays = leaves(m)
        before = [np.array(a) for a in arrays]
        want = run_optax(optax.adam(1e-2), m, gs)
        _, got = run_numbaopt(no.Adam(1e-2), m, gs, inplace)  # update_ assigns into the root dict
        assert tu.tree_structure(got) == tu.tree_structure(want)  # same types, same aux data
        for a, b in zip(leaves(got), leaves(want)):
            assert isinstance(a, jax.Array)
            assert a.dtype == dtype and a.devices() == b.devices()
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
        for a, b in zip(arrays, before):  # the JAX arrays passed in are untouched (and so is m, when pure)
            np.testing.assert_array_equal(np.asarray(a), b)
        if not inplace:
            assert leaves(m) == arrays


def test_update_and_update_agree_bitwise_and_update_returns_new_tree():
    m, gs = make_model(np.float32), make_grads(np.float32)
    _, pure = run_numbaopt(no.Adam(1e-2), m, gs, False)
    state = no.setup(no.Adam(1e-2), m)
    enc, blk = m["enc"], m["blk"]
    state, m2 = no.update_(state, m, gs[0])
    assert m2 is m  # a dict is mutable: update_ keeps it and assigns the rebuilt JAX nodes into it
    assert m2["enc"] is not enc and m2["blk"] is not blk and type(m2["blk"]) is Block
    assert m2["blk"].name == "blk0" and m2["blk"].act == ("relu", 2) and m2["enc"].scale == 0.5
    for g in gs[1:]:
        state, m2 = no.update_(state, m2, g)
    for a, b in zip(leaves(pure), leaves(m2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_meta_fields_and_aux_data_are_not_trained():
    m = make_model(np.float32)
    state = no.setup(no.Adam(1e-1), m)
    assert "scale" not in state["enc"].keys()  # a meta field is aux data, not a child
    assert state["enc"].keys() == ["w", "b"]
    _, new = no.update(state, m, make_grads(np.float32)[0])
    assert type(new["enc"]) is Layer and new["enc"].scale == 0.5
    assert type(new["blk"]) is Block and (new["blk"].name, new["blk"].act) == ("blk0", ("relu", 2))


def test_state_navigation_uses_jax_keys():
    m = make_model(np.float32)
    state = no.setup(no.Adam(1e-2), m)
    assert state["enc"].w.shape == (3, 4)
    assert state["blk"][1]["v"][0].shape == (3,)
    text = str(state)
    assert "w" in text


def test_bad_grads_name_the_path_with_jax_keys():
    m = make_model(np.float32)
    state = no.setup(no.Adam(1e-2), m)
    g = make_grads(np.float32)[0]
    bad = {"enc": Layer(g["enc"].w, jnp.ones(5, jnp.float32), 0.5), "blk": g["blk"]}
    with pytest.raises(ValueError, match=r"grads\['enc'\]\.b: shape \(5,\)"):
        no.update(state, m, bad)
    bad = {"enc": g["enc"], "blk": Block(g["blk"].w, {"u": g["blk"].extra["u"], "v": [g["blk"].extra["v"][0],
                                                                                     jnp.ones(2, jnp.float32)]}, "b")}
    with pytest.raises(ValueError, match=r"grads\['blk'\]\[1\]\['v'\]\[1\]: shape \(2,\)"):
        no.update_(state, m, bad)
    with pytest.raises(TypeError, match=r"grads\['blk'\]: expected .*Block, got dict"):
        no.update(state, m, {"enc": g["enc"], "blk": {"w": g["blk"].w}})
    with pytest.raises(ValueError, match=r"model\['enc'\]\.w: shape \(4, 3\)"):
        no.update(state, {"enc": Layer(jnp.ones((4, 3), jnp.float32), m["enc"].b, 0.5), "blk": m["blk"]}, g)
    # refused before anything was written: the state steps as a fresh one does
    _, a = no.update(state, m, g)
    _, b = no.update(no.setup(no.Adam(1e-2), m), m, g)
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_none_grads_numpy_leaves_and_frozen_leaves_inside_a_pytree():
    w = jnp.asarray(np.arange(4, dtype=np.float32))
    host = np.ones(3, np.float32)  # a writeable NumPy leaf inside a JAX pytree: written in place by update_
    steps = jnp.asarray(np.arange(3, dtype=np.int32))  # not a parameter: carried through
    m = Block(w, {"host": host, "steps": steps, "skip": jnp.ones(2, jnp.float32)}, "b")
    state = no.setup(no.Descent(0.5), m)
    g = Block(jnp.ones(4, jnp.float32), {"host": np.ones(3, np.float32), "steps": None, "skip": None}, "b")
    state, new = no.update_(state, m, g)
    assert new.extra["host"] is host
    np.testing.assert_array_equal(host, 0.5)
    assert new.extra["steps"] is steps and new.extra["skip"] is m.extra["skip"]
    np.testing.assert_array_equal(np.asarray(new.w), np.arange(4) - 0.5)
    assert int(state[1]["skip"].counters[0]) == 0 and int(state[0].counters[0]) == 1
    _, new2 = no.update(state, new, None)  # a None gradient tree: nothing moves
    assert new2 is new


def test_bare_jax_array():
    x = jnp.asarray(np.linspace(-1, 1, 7, dtype=np.float32))
    g = jnp.asarray(np.linspace(2, 3, 7, dtype=np.float32))
    assert not no.is_device_array(x)
    ref = np.asarray(x).copy()
    state = no.setup(no.Adam(1e-1), x)
    s1, x1 = no.update(state, x, g)
    assert isinstance(x1, jax.Array) and x1.dtype == jnp.float32 and x1.devices() == x.devices()
    np.testing.assert_array_equal(np.asarray(x), ref)
    leaf = no.setup(no.Adam(1e-1), ref.copy())  # the NumPy path, same kernels: bitwise equal
    _, r1 = no.update(leaf, ref.copy(), np.asarray(g))
    np.testing.assert_array_equal(np.asarray(x1), r1)
    s2, x2 = no.update_(state, x, g)
    assert s2 is state and isinstance(x2, jax.Array) and x2 is not x
    np.testing.assert_array_equal(np.asarray(x2), r1)
    with pytest.raises(ValueError, match=r"grads: shape \(3,\)"):
        no.update(state, x2, jnp.ones(3, jnp.float32))


def test_a_jax_array_twice_is_two_parameters_as_in_optax():
    optax = pytest.importorskip("optax")
    z = jnp.asarray(np.ones(3, np.float32))
    m = {"a": z, "b": z}
    gs = [{"a": jnp.full(3, float(k), jnp.float32), "b": jnp.full(3, -2.0 * k, jnp.float32)} for k in range(1, 4)]
    _, got = run_numbaopt(no.Adam(1e-1), m, gs, False)
    want = run_optax(optax.adam(1e-1), m, gs)
    for k in "ab":
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5)
    assert not np.allclose(np.asarray(got["a"]), np.asarray(got["b"]))


def test_low_precision():
    h = jnp.asarray(np.linspace(0, 1, 5, dtype=np.float16))
    with pytest.raises(TypeError, match=r"model\['h'\]: float16 .*MixedPrecision"):
        no.setup(no.Adam(1e-2), {"h": h})
    state = no.setup(no.chain(no.MixedPrecision(np.float32), no.Descent(0.25)), {"h": h})
    _, new = no.update(state, {"h": h}, {"h": jnp.ones(5, jnp.float16)})
    assert isinstance(new["h"], jax.Array) and new["h"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(new["h"]), (np.linspace(0, 1, 5, dtype=np.float32) - 0.25)
                                  .astype(np.float16))
    bf = jnp.ones(3, jnp.bfloat16)
    with pytest.raises(TypeError, match=r"model\['bf'\]: unsupported dtype bfloat16"):
        no.setup(no.Adam(1e-2), {"bf": bf})
    # a bfloat16 leaf that is not trained is carried through
    state = no.setup(lambda path, leaf: None if path.keys == ("bf",) else no.Descent(0.1), {"bf": bf, "w": h.astype(
        jnp.float32)})
    _, new = no.update(state, {"bf": bf, "w": h.astype(jnp.float32)}, {"bf": None, "w": jnp.ones(5, jnp.float32)})
    assert new["bf"] is bf


def test_traced_values_are_refused_clearly():
    x = jnp.ones(3, jnp.float32)
    state = no.setup(no.Descent(0.1), {"x": x})

    @jax.jit
    def f(x, g):
        return no.update(state, {"x": x}, {"x": g})[1]["x"]

    with pytest.raises(TypeError, match=r"model\['x'\]: a traced JAX value"):
        f(x, x)


def test_save_and_load(tmp_path):
    m, gs = make_model(np.float32), make_grads(np.float32)
    state = no.setup(no.Adam(1e-2), m)
    state, m = no.update(state, m, gs[0])
    no.save(tmp_path / "s.npz", state)
    loaded = no.load(tmp_path / "s.npz")
    s1, a = no.update(state, m, gs[1])
    s2, b = no.update(loaded, m, gs[1])
    for x, y in zip(leaves(a), leaves(b)):
        assert isinstance(y, jax.Array)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert loaded["blk"][1]["u"].shape == (2, 2)


def test_sharded_and_committed_arrays_keep_their_placement():
    code = textwrap.dedent("""
        import numpy as np, jax, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import numbaopt as no
        d = jax.devices()
        assert len(d) == 2, d
        sh = NamedSharding(Mesh(np.array(d), ("i",)), P("i"))
        a = jax.device_put(np.arange(8, dtype=np.float32), sh)
        b = jax.device_put(np.ones(3, np.float32), d[1])
        c = jnp.ones(2, jnp.float32)
        m = {"a": a, "b": b, "c": c}
        state = no.setup(no.Descent(0.5), m)
        g = {"a": jnp.ones(8, jnp.float32), "b": jnp.ones(3, jnp.float32), "c": jnp.ones(2, jnp.float32)}
        for f in (no.update, no.update_):
            _, new = f(state, m, g)
            assert new["a"].sharding == sh, new["a"].sharding
            assert new["b"].devices() == {d[1]} and new["b"].committed
            assert not new["c"].committed and new["c"].devices() == c.devices()
            np.testing.assert_array_equal(np.asarray(new["a"]), np.arange(8) - 0.5)
        print("ok")
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_numbaopt_never_imports_jax():
    code = textwrap.dedent("""
        import sys, dataclasses
        import numpy as np
        import numbaopt as no
        from numbaopt.tree import jax_models
        @dataclasses.dataclass
        class D:
            w: np.ndarray
            s: float
        m = {"d": D(np.ones(3), 1.0), "l": [np.zeros(2), (np.ones(1), 2.0)]}
        state = no.setup(no.Adam(1e-2), m)
        g = {"d": D(np.ones(3), 1.0), "l": [np.ones(2), (np.ones(1), 1.0)]}
        for _ in range(3):
            state, m = no.update_(state, m, g)
            state2, m2 = no.update(state, m, g)
        assert "jax" not in sys.modules and "jaxlib" not in sys.modules
        assert not any(jax_models.NODE_TYPES.values())  # decided once per type, without jax
        assert isinstance(m["d"], D) and m["d"].s != 1.0  # a plain dataclass: every field is trained
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_equinox_module_if_installed():
    eqx = pytest.importorskip("equinox")

    class Lin(eqx.Module):
        w: jax.Array
        n: int = eqx.field(static=True)

    m = Lin(jnp.ones(3, jnp.float32), 3)
    state = no.setup(no.Descent(0.5), m)
    _, new = no.update(state, m, Lin(jnp.ones(3, jnp.float32), 3))
    assert type(new) is Lin and new.n == 3
    np.testing.assert_array_equal(np.asarray(new.w), 0.5)


def test_flax_struct_if_installed():
    struct = pytest.importorskip("flax.struct")

    @struct.dataclass
    class P:
        w: jax.Array
        lr_scale: float = struct.field(pytree_node=False, default=2.0)

    m = P(jnp.ones(3, jnp.float32))
    state = no.setup(no.Descent(0.5), m)
    _, new = no.update(state, m, P(jnp.ones(3, jnp.float32)))
    assert type(new) is P and new.lr_scale == 2.0
    np.testing.assert_array_equal(np.asarray(new.w), 0.5)


class KeyedNode:  # flattened with dict keys, like flax's FrozenDict
    def __init__(self, d):
        self.d = d


tu.register_pytree_with_keys(
    KeyedNode, lambda n: ([(tu.DictKey(k), v) for k, v in sorted(n.d.items())], tuple(sorted(n.d))),
    lambda keys, vals: KeyedNode(dict(zip(keys, vals))))


def test_pickle_and_dict_keyed_nodes_round_trip(tmp_path):
    """A state of a JAX pytree pickles (the spec by name), and a node flattened with ``DictKey``s loads."""
    import pickle

    m = {"n": KeyedNode({"a": jnp.ones(3, jnp.float32), "b": jnp.zeros((2,), jnp.float32)})}
    g = {"n": KeyedNode({"a": jnp.full(3, 0.5, jnp.float32), "b": jnp.ones(2, jnp.float32)})}
    state = no.setup(no.Adam(1e-2), m)
    state, m = no.update(state, m, g)
    for copy_of in (lambda s: pickle.loads(pickle.dumps(s)),
                    lambda s: (no.save(tmp_path / "k.npz", s), no.load(tmp_path / "k.npz"))[1]):
        other = copy_of(state)
        s1, a = no.update(state, m, g)
        s2, b = no.update(other, m, g)
        for x, y in zip(leaves(a), leaves(b)):
            assert isinstance(y, jax.Array)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert pickle.loads(pickle.dumps(state))["n"]["a"].t == state["n"]["a"].t == 1
