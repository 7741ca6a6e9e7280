"""``load`` of damaged, crafted and inconsistent checkpoints: every refusal is a CheckpointError naming the file
and what is wrong; nothing is allocated or imported on the strength of a header. Fuzzers over the file's bytes
and over its header hold every outcome to "an equal (or valid) state, or CheckpointError". That files of real
stepped states still load is tests/test_persist.py's part."""
import copy
import io
import json
import os
import struct
import subprocess
import sys
import time
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numbaopt as no
from numbaopt.persist.codec import enc_node
from numbaopt.persist.files import MAX_HEADER_BYTES
from numbaopt.tree.state import core

TREE_MODEL = {"a": np.ones(3), "b": [np.ones((2, 2))]}
ADAM = "numbaopt.rules.adaptive:Adam"


def _tree():
    state = no.setup(no.Adam(0.01), {"a": np.ones(3), "b": [np.ones((2, 2))]})
    state, _ = no.update(state, TREE_MODEL, {"a": np.full(3, 0.5), "b": [np.full((2, 2), -1.0)]})
    return state


def _leaf():
    state = no.setup(no.Adam(0.01), np.ones(4))
    state, _ = no.update(state, np.ones(4), np.full(4, 0.25))
    return state


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("good")
    states = {"tree": _tree(), "leaf": _leaf()}
    for kind, s in states.items():
        no.save(d / f"{kind}.npz", s)
    return {kind: (d / f"{kind}.npz", s) for kind, s in states.items()}


def contents(path):
    """``(header, arrays)`` of a checkpoint, read with numpy (the test's own files are trusted)."""
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    return json.loads(bytes(data.pop("__header__")).decode()), data


def rewrite(path, header, data, raw_header=None):
    """Write ``data`` and ``header`` (or the bytes ``raw_header``) as a checkpoint at ``path``."""
    arrays = dict(data)
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    arrays["__header__"] = np.frombuffer(raw, np.uint8)
    np.savez(path, **arrays)
    return path


def fingerprint(state):
    """What a state is: its repr and every array and counter, bitwise."""
    if isinstance(state, no.Leaf):
        parts = [a.tobytes() for a in state.arrays] + [state.counters.tobytes(), state.hp.tobytes()]
        return repr(state), parts, None if state.master is None else state.master.tobytes()
    c = core(state)
    parts = [(tuple(a.tobytes() for a in g.arenas), g.C.tobytes(), g.hp.tobytes()) for g in c.groups]
    return repr(state), parts, c.frozen.tobytes(), [str(p) for p in c.structure.paths]


# --------------------------------------------------------------------------------------------------
# the corpus: (name, base file, edit of (header, arrays), message fragment)


def _h(fn):
    """An edit of the header only."""
    def edit(h, d):
        fn(h)
    return edit


def _set(path, value):
    def fn(h):
        node = h
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return _h(fn)


def _counters(name, col, values):
    def edit(h, d):
        c = d[name].copy()
        if c.ndim == 2:
            c[:, col] = values
        else:
            c[:] = values
        d[name] = c
    return edit


def _mixed_precision(**change):
    """The leaf described as a float16 parameter under MixedPrecision (its arrays stay float64)."""
    def fn(h):
        h["leaf"].update(dtype="<f2", rule={"chain": [
            {"rule": "numbaopt.rules.stages:MixedPrecision", "values": {"master": "float32"}}, h["leaf"]["rule"]]})
        h["leaf"].update(change)
    return _h(fn)


_RULE = ("groups", 0, "rule")
_LR = _RULE + ("values", "lr")
_LINEAR = {"schedule": "numbaopt.schedules:linear", "state": {"start": 0.1, "end": 0.0, "steps": 10}}


def _schedule(**change):
    s = copy.deepcopy(_LINEAR)
    s["state"].update(change)
    return s


HEADER_CASES = [
    ("wrong-format", "tree", _set(("format",), "other"), "not a numbaopt tree state file"),
    ("wrong-version", "tree", _set(("version",), 99), "format version 99"),
    ("unknown-kind", "tree", _set(("kind",), "forest"), "unknown state kind 'forest'"),
    ("extra-field", "tree", _set(("extra",), 1), "unknown ['extra']"),
    ("huge-shape-tree", "tree", _set(("units", 0, "shape"), [2 ** 45]), "g0_a0 is float64[7], expected float64[3"),
    ("huge-shape-leaf", "leaf", _set(("leaf", "shape"), [2 ** 45]), "leaf_a0 is float64[4], expected float64[3"),
    ("overflowing-shape", "leaf", _set(("leaf", "shape"), [2 ** 40, 2 ** 40]), "elements (at most 2**48)"),
    ("negative-dim", "leaf", _set(("leaf", "shape"), [-4]), "shape[0]=-4 is outside [0"),
    ("bool-dim", "leaf", _set(("leaf", "shape"), [True, 4]), "shape[0] is bool True, expected an integer"),
    ("float-dim", "leaf", _set(("leaf", "shape"), [4.0]), "shape[0] is float 4.0, expected an integer"),
    ("too-many-dims", "leaf", _set(("leaf", "shape"), [1] * 65), "65 dimensions"),
    ("shape-not-list", "leaf", _set(("leaf", "shape"), "4"), "shape is str, expected a list"),
    ("bool-n-arrays", "leaf", _set(("leaf", "n_arrays"), True), "n_arrays is bool True, expected an integer"),
    ("wrong-n-arrays", "leaf", _set(("leaf", "n_arrays"), 3), "3 state arrays"),
    ("int-as-bool", "tree", _set(("tree", "trained"), 1), "trained is int 1, expected true or false"),
    ("bool-leaf-position", "tree", _set(("tree", "children", 0, "leaf"), False), "expected an integer"),
    ("leaf-order", "tree", _set(("tree", "children", 0, "leaf"), 1), "depth-first order"),
    ("bool-member", "tree", _set(("groups", 0, "members"), [False, True]), "members[0] is bool"),
    ("members-swapped", "tree", _set(("groups", 0, "members"), [1, 0]), "do not match the leaf table"),
    ("member-out-of-range", "tree", _set(("groups", 0, "members"), [0, 7]), "members[1]=7 is outside [0, 1]"),
    ("pos-u-swapped", "tree", _set(("pos_u",), [1, 0]), "tie table does not match"),
    ("pos-u-out-of-range", "tree", _set(("pos_u",), [0, 5]), "pos_u[1]=5 is outside [0, 1]"),
    ("trained-not-param", "tree", _set(("pos_param",), [False, True]), "trained but not a parameter"),
    ("frozen-length", "tree", _set(("frozen",), [False]), "frozen has 1 entries, expected 2"),
    ("two-groups", "tree", _set(("units", 0, "device"), 0), "belongs to no group, or to two"),
    ("no-such-group", "tree", _set(("units", 1, "group"), 3), "a group the file does not describe"),
    ("tied-untieable", "tree", _set(("units", 0, "tieable"), "yes"), "tieable is str"),
    ("list-as-dict", "tree", _set(("tree", "spec"), "list"), "a builtins:dict container described as 'list'"),
    ("list-entry-index", "tree", _set(("tree", "children", 1, "entries", 0, 1), ["i", 5]), "not the indices 0..0"),
    ("dict-entry-attr", "tree", _set(("tree", "entries", 0, 0), "attr"), "a dict entry that is not a key"),
    ("entry-kind", "tree", _set(("tree", "entries", 0, 0), "eval"), "entry kind 'eval'"),
    ("duplicate-key", "tree", _set(("tree", "entries", 1), ["key", ["s", "a"]]), "the same key twice"),
    ("key-tag", "tree", _set(("tree", "entries", 0, 1), ["x", "a"]), "unknown key tag 'x'"),
    ("children-length", "tree", _set(("tree", "children"), [{"leaf": 0}]), "children has 1 entries, expected 2"),
    ("master-flag", "tree", _set(("groups", 0, "masters"), [True, False]), "master copy flag does not match"),
    ("group-dtype", "tree", _set(("groups", 0, "dtype"), "<f4"), "computes in float64, not float32"),
    ("object-param-dtype", "tree", _set(("units", 0, "dtype"), "|O"), "'|O' is not a parameter dtype"),
    ("float16-without-master", "leaf", _set(("leaf", "dtype"), "<f2"), "float16 parameters are not computed"),
    ("master-without-mixed-precision", "leaf", _set(("leaf", "master"), True), "float64 with a master copy"),
    ("mixed-precision-without-master", "leaf", _mixed_precision(master=False), "float16 parameter computed in float32"),
    ("gpu-with-master", "leaf", _mixed_precision(master=True, device=True), "GPU state with a master copy"),
    # code named by the file: looked up among the classes that exist, never imported
    ("rule-os-system", "tree", _set(_RULE + ("rule",), "os:system"), "os:system is not a numbaopt Rule"),
    ("rule-numpy-lazy", "tree", _set(_RULE + ("rule",), "numpy:f2py.Rule"), "numpy:f2py.Rule is not a numbaopt Rule"),
    ("rule-unimported", "leaf", _set(("leaf", "rule", "rule"), "this:s"), "not imported (this)"),
    ("rule-schedule-class", "tree", _set(_RULE + ("rule",), "numbaopt.schedules:linear"), "is not a numbaopt Rule"),
    ("rule-name-int", "tree", _set(_RULE + ("rule",), 5), "rule is int 5, expected a string"),
    ("rule-values-list", "tree", _set(_RULE + ("values",), []), "values is list, expected an object"),
    ("rule-unknown-name", "tree", _set(_RULE + ("values", "evil"), 1), "Adam has no hyperparameter or option ['evil']"),
    ("lr-inf", "tree", _set(_LR, float("inf")), "lr=inf is not finite"),
    ("lr-nan", "leaf", _set(("leaf", "rule", "values", "lr"), float("nan")), "lr is NaN"),
    ("lr-huge-int", "tree", _set(_LR, 10 ** 400), "integer of 401 digits"),
    ("lr-string", "tree", _set(_LR, "0.1"), "must be a real number"),
    ("lr-object", "tree", _set(_LR, {"evil": 1}), "not a number, string, list, tuple or schedule"),
    ("lr-rule-as-schedule", "tree", _set(_LR, {"schedule": ADAM, "state": {}}), "is not a numbaopt Schedule"),
    ("schedule-injected", "tree", _set(_LR, _schedule(values=[1, 2])), "differ from what its constructor makes"),
    ("schedule-bad-value", "tree", _set(_LR, _schedule(steps=-3)), "steps=-3 must be in [1"),
    ("schedule-inf", "tree", _set(_LR, _schedule(start=float("inf"))), "must be a finite number"),
    ("schedule-missing", "tree", _set(_LR, {"schedule": _LINEAR["schedule"], "state": {"start": 0.1}}),
     "cannot be rebuilt"),
    ("chain-stage-misplaced", "tree",
     _set(_RULE, {"chain": [{"rule": ADAM, "values": {}},
                            {"rule": "numbaopt.rules.stages:MixedPrecision", "values": {"master": "float32"}}]}),
     "must be the first member"),
    # counters: t, tp, count, skipped
    ("t-negative", "tree", _counters("g0_C", 0, [-5, -5, 0, 0]), "t=-5 is outside [0, 2**53]"),
    ("t-huge", "tree", _counters("g0_C", 1, [2 ** 62, 2 ** 62, 0, 0]), "t=4611686018427387904 is outside"),
    ("t-int64-max", "leaf", _counters("leaf_C", 0, [2 ** 63 - 1] * 2 + [0, 0]), "is outside [0, 2**53]"),
    ("skipped-negative", "leaf", _counters("leaf_C", 0, [1, 1, 0, -1]), "skipped=-1 is outside"),
    ("tp-not-t", "leaf", _counters("leaf_C", 0, [1, 5, 0, 0]), "without an AccumGrad tp equals t"),
    ("count-without-accum", "leaf", _counters("leaf_C", 0, [1, 1, 1, 0]), "without an AccumGrad"),
    # arrays
    ("missing-array", "tree", lambda h, d: d.pop("g0_a1"), "group 0: array g0_a1 is missing"),
    ("extra-array", "tree", lambda h, d: d.update(zzz=np.ones(1)), "unexpected ['zzz']"),
    ("wrong-dtype", "tree", lambda h, d: d.update(g0_a0=d["g0_a0"].astype(np.float32)),
     "g0_a0 is float32[7], expected float64[7]"),
    ("wrong-size", "leaf", lambda h, d: d.update(leaf_a1=np.ones(5)), "leaf_a1 is float64[5], expected float64[4]"),
    ("float-counters", "tree", lambda h, d: d.update(g0_C=d["g0_C"].astype(np.float64)), "g0_C is float64"),
    ("uint64-counters", "leaf", lambda h, d: d.update(leaf_C=np.full(4, 2 ** 64 - 1, np.uint64)), "dtype uint64"),
    ("big-endian", "leaf", lambda h, d: d.update(leaf_a0=d["leaf_a0"].astype(">f8")), "dtype >f8"),
    ("object-array", "leaf", lambda h, d: d.update(leaf_a0=np.array([None, 1], dtype=object)), "dtype object"),
    ("fortran-counters", "tree", lambda h, d: d.update(g0_C=np.asfortranarray(d["g0_C"])), "Fortran order"),
    ("3d-array", "leaf", lambda h, d: d.update(leaf_a0=np.ones((1, 1, 4))), "shape (1, 1, 4)"),
]


@pytest.mark.parametrize("name, base, edit, fragment", HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_crafted_header_or_arrays_are_refused(good, tmp_path, name, base, edit, fragment):
    header, data = contents(good[base][0])
    edit(header, data)
    path = rewrite(tmp_path / f"{name}.npz", header, data)
    with pytest.raises(no.CheckpointError) as info:
        no.load(path)
    assert str(info.value).startswith(f"load: {path}"), str(info.value)
    assert fragment in str(info.value), str(info.value)


def _deep(raw_header, depth):
    """The header with the lr replaced by a list nested ``depth`` deep (bytes: json.dumps would recurse)."""
    return raw_header.replace(b'"lr": 0.01', b'"lr": ' + b"[" * depth + b"]" * depth)


def _zip(members, compression=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name" is the point of one case
        with zipfile.ZipFile(buf, "w", compression) as zf:
            for name, payload in members:
                zf.writestr(name, payload)
    return buf.getvalue()


def _npy(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _patch_directory(raw, member, offset, fmt, value):
    """``raw`` with a field of ``member``'s central directory entry (``offset`` from its signature) set."""
    raw = bytearray(raw)
    at = raw.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", raw, at + 28)[0]
        if raw[at + 46:at + 46 + name_len] == member.encode():
            struct.pack_into(fmt, raw, at + offset, value)
            return bytes(raw)
        at = raw.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"no member {member}")


def _huge_npy_header(raw):
    """The tree file with g0_a1's .npy header claiming 2**45 elements (its data stays 7)."""
    zf = zipfile.ZipFile(io.BytesIO(raw))
    members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    members = [(n, p.replace(b"(7,)", b"(35184372088832,)") if n == "g0_a1.npy" else p) for n, p in members]
    return _zip(members)


def _bomb(raw):
    zf = zipfile.ZipFile(io.BytesIO(raw))
    members = [(i.filename, zf.read(i)) for i in zf.infolist()] + [("zeros.npy", _npy(np.zeros(2 ** 23)))]
    return _zip(members, zipfile.ZIP_DEFLATED)


def _crc(raw):
    """The last byte of leaf_a0's data flipped (its .npy header intact: only the CRC-32 can tell)."""
    info = zipfile.ZipFile(io.BytesIO(raw)).getinfo("leaf_a0.npy")
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    at = info.header_offset + 30 + name_len + extra_len + info.compress_size - 1
    return raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1:]


BYTE_CASES = [
    ("empty", "tree", lambda raw: b"", "not a readable numbaopt state file"),
    ("text", "tree", lambda raw: b"step,loss\n1,0.5\n", "not a readable numbaopt state file"),
    ("npy", "tree", lambda raw: _npy(np.ones(3)), "not a readable numbaopt state file"),
    ("truncated-half", "tree", lambda raw: raw[: len(raw) // 2], "not a readable numbaopt state file"),
    ("truncated-end", "leaf", lambda raw: raw[:-1], "not a readable numbaopt state file"),
    ("zip-without-header", "tree", lambda raw: _zip([("x.npy", _npy(np.ones(2)))]), "it has no header"),
    ("zip-text-member", "tree", lambda raw: _zip([("readme.txt", b"hi")]), "'readme.txt' is not an array"),
    ("zip-directory", "tree", lambda raw: _zip([("sub/", b"")]), "'sub/' is not an array"),
    ("header-not-json", "tree", lambda raw: _zip([("__header__.npy", _npy(np.frombuffer(b"{nope", np.uint8)))]),
     "its header is not JSON"),
    ("header-not-utf8", "tree", lambda raw: _zip([("__header__.npy", _npy(np.frombuffer(b"\xff\xfe", np.uint8)))]),
     "its header is not JSON"),
    ("header-float", "tree", lambda raw: _zip([("__header__.npy", _npy(np.ones(3)))]), "expected uint8 bytes"),
    ("header-list", "tree", lambda raw: _zip([("__header__.npy", _npy(np.frombuffer(b"[]", np.uint8)))]),
     "not a numbaopt tree state file"),
    ("duplicate-member", "leaf", lambda raw: _zip([("x.npy", _npy(np.ones(1)))] * 2), "'x.npy' appears twice"),
    ("compression-method", "leaf", lambda raw: _patch_directory(raw, "leaf_a0.npy", 10, "<H", 99),
     "compression method 99"),
    ("encrypted", "leaf", lambda raw: _patch_directory(raw, "leaf_a0.npy", 8, "<H", 1), "is encrypted"),
    ("declared-size", "leaf", lambda raw: _patch_directory(raw, "leaf_a0.npy", 24, "<I", 2 ** 31),
     "declares 2147483648 bytes"),
    ("npy-header-huge", "tree", _huge_npy_header, "its .npy header says float64[35184372088832]"),
    ("zip-bomb", "tree", _bomb, "a zip bomb?"),
    ("bad-crc", "leaf", _crc, "Bad CRC-32"),
]


@pytest.mark.parametrize("name, base, make, fragment", BYTE_CASES, ids=[c[0] for c in BYTE_CASES])
def test_damaged_files_are_refused(good, tmp_path, name, base, make, fragment):
    path = tmp_path / f"{name}.npz"
    path.write_bytes(make(good[base][0].read_bytes()))
    with pytest.raises(no.CheckpointError) as info:
        no.load(path)
    assert str(info.value).startswith(f"load: {path}"), str(info.value)
    assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("depth", [600, 100_000])
def test_deep_json_is_refused_before_parsing(good, tmp_path, depth):
    header, data = contents(good["tree"][0])
    path = rewrite(tmp_path / "deep.npz", header, data, raw_header=_deep(json.dumps(header).encode(), depth))
    with pytest.raises(no.CheckpointError, match=f"its header nests {depth + 5} levels deep"):  # 5: to the lr
        no.load(path)


def test_unterminated_string_of_escaped_quotes_is_refused_quickly(good, tmp_path):
    """The depth scan is linear: a scan retrying from every escaped quote would take minutes here."""
    header, data = contents(good["leaf"][0])
    raw = b'{"format": "' + b'\\"[' * 100_000
    start = time.perf_counter()
    with pytest.raises(no.CheckpointError, match="its header is not JSON"):
        no.load(rewrite(tmp_path / "quotes.npz", header, data, raw_header=raw))
    assert time.perf_counter() - start < 10


def test_oversized_header_is_refused(good, tmp_path):
    header, data = contents(good["leaf"][0])
    raw = json.dumps(header).encode() + b" " * MAX_HEADER_BYTES
    with pytest.raises(no.CheckpointError, match=f"its header is {len(raw)} bytes"):
        no.load(rewrite(tmp_path / "big.npz", header, data, raw_header=raw))


def test_file_that_cannot_be_opened_is_not_a_checkpoint_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        no.load(tmp_path / "missing.npz")
    with pytest.raises(IsADirectoryError):
        no.load(tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_is_refused_before_it_is_read():
    with pytest.raises(no.CheckpointError, match="load: /dev/zero is not a regular file"):
        no.load("/dev/zero")  # zipfile would read it to its (absent) end


def test_named_modules_are_never_imported(good, tmp_path):
    """A clean interpreter: loading files that name ``numpy:f2py.Rule`` (numpy's lazy ``__getattr__`` would
    import numpy.f2py), ``this:s`` (prints when imported) and ``os:system`` imports and runs nothing."""
    header, data = contents(good["tree"][0])
    paths = []
    for k, name in enumerate(["numpy:f2py.Rule", "this:s", "os:system", "numpy.f2py:Rule"]):
        h = copy.deepcopy(header)
        h["groups"][0]["rule"]["rule"] = name
        paths.append(str(rewrite(tmp_path / f"m{k}.npz", h, data)))
    h = copy.deepcopy(header)
    h["tree"]["type"] = "this:Mapping"  # a container type is matched by name when a model is met: loads
    paths.append(str(rewrite(tmp_path / "type.npz", h, data)))
    script = (
        "import sys, numbaopt, numpy\n"
        "before = {m for m in ('numpy.f2py', 'this') if m in sys.modules}\n"
        "assert not before, before\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        print('loaded', type(numbaopt.load(p)).__name__)\n"
        "    except numbaopt.CheckpointError as e:\n"
        "        print('refused', e)\n"
        "print('imported', [m for m in ('numpy.f2py', 'this') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused") == 4 and "loaded StateTree" in out.stdout, out.stdout
    assert "imported []" in out.stdout and "Zen of Python" not in out.stdout, out.stdout


# --------------------------------------------------------------------------------------------------
# fuzzers


def _outcome(path, reference):
    """Load ``path``: a CheckpointError, a DeviceUnavailable (the file was made GPU state, and this process
    has no GPU), or a state equal to ``reference`` (None: any state that takes a step, and saves and loads
    back equal). Any other exception fails the test."""
    try:
        state = no.load(path)
    except no.CheckpointError:
        return "refused"
    except no.DeviceUnavailable:
        return "needs a GPU"
    if reference is not None:
        assert fingerprint(state) == fingerprint(reference)
    else:
        _steps(state)
    again = path.with_name("again.npz")
    no.save(again, state)
    assert fingerprint(no.load(again)) == fingerprint(state)
    return "loaded"


def _steps(state):
    """A state that loaded takes a step (with a model of its structure where that is the tree's own)."""
    if isinstance(state, no.Leaf):
        x = np.ones(state.shape, state.param_dtype)
        no.update(state, x, np.ones_like(x))
        return
    s = core(state).structure
    if enc_node(s.root) == enc_node(core(_tree()).structure.root) and s.u_shape == [(3,), (2, 2)][:s.n_unique]:
        no.update(state, TREE_MODEL, {"a": np.ones(3), "b": [np.ones((2, 2))]})


_BYTE_OPS = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2 ** 20), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 2 ** 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 2 ** 20), st.integers(0, 255)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["tree", "leaf"]), ops=st.lists(_BYTE_OPS, min_size=1, max_size=4))
def test_fuzz_bytes(good, tmp_path_factory, kind, ops):
    path, state = good[kind]
    raw = bytearray(path.read_bytes())
    for op, at, value in ops:
        at %= len(raw) + 1
        if op == "flip" and at < len(raw):
            raw[at] ^= value
        elif op == "truncate":
            del raw[at:]
        elif op == "insert":
            raw[at:at] = bytes([value])
    target = tmp_path_factory.getbasetemp() / "fuzz_bytes.npz"
    target.write_bytes(bytes(raw))
    _outcome(target, state)  # the zip's CRC-32s cover every array: what loads is the state saved


def _paths(node, prefix=()):
    """Every place in a JSON document: ``(key, key, ...)`` to each value."""
    out = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out += _paths(v, prefix + (k,))
    return out


_STRINGS = st.sampled_from(["<f8", "<f4", "<c16", "|O", "dict", "list", "tuple", "builtins:list", "key", "index",
                            "attr", ADAM, "numbaopt.rules.basic:Momentum", "os:system", "numbaopt.schedules:linear",
                            "s", "i", "t", "leaf", "tree", "float32", ""])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 8), st.integers(-2 ** 70, 2 ** 70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), _STRINGS)
_JSON = st.recursive(_SCALARS, lambda kids: st.lists(kids, max_size=3) |
                     st.dictionaries(st.sampled_from(["leaf", "rule", "values", "schedule", "state", "tuple", "lr",
                                                      "chain", "x"]), kids, max_size=3), max_leaves=6)


def _nearby(v):
    """Values a small edit of ``v`` gives (most files a fuzzer makes should be nearly right)."""
    if isinstance(v, bool):
        return st.sampled_from([not v, int(v)])
    if isinstance(v, int):
        return st.integers(v - 2, v + 2) | st.sampled_from([2 ** 53, 2 ** 53 + 1, 2 ** 63, float(v)])
    if isinstance(v, float):
        return st.floats(0, 1) | st.sampled_from([v * 2, -v, 0.0, float("inf"), float("nan")])
    if isinstance(v, str):
        return _STRINGS
    if isinstance(v, list):
        return st.sampled_from([v[:-1], v + v[-1:], v[::-1]] if v else [[0], [None]])
    return _JSON


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["tree", "leaf"]), data=st.data())
def test_fuzz_header(good, tmp_path_factory, kind, data):
    header, arrays = contents(good[kind][0])
    for _ in range(data.draw(st.integers(1, 3))):
        # the format and version are the specific tests' (they would take a fuzzer's every fifth example)
        place = data.draw(st.sampled_from([p for p in _paths(header) if p not in (("format",), ("version",))]))
        node = header
        for k in place[:-1]:
            node = node[k]
        old = node[place[-1]]
        node[place[-1]] = data.draw(st.one_of(_nearby(old), _nearby(old), _nearby(old), _JSON))
    target = rewrite(tmp_path_factory.getbasetemp() / "fuzz_header.npz", header, arrays)
    _outcome(target, None)
