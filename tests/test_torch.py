"""PyTorch models with real torch (CPU): modules, parameters()/named_parameters(), grads, autograd versions."""
import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numbaopt as no  # noqa: E402


class Net(torch.nn.Module):
    """Linear + BatchNorm + a frozen parameter + a tied weight (b.weight is a.weight). ``a`` has no bias: before
    a BatchNorm its gradient would be rounding noise, which Adam amplifies into steps of size lr."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 5, bias=False)
        self.bn = torch.nn.BatchNorm1d(5)
        self.b = torch.nn.Linear(5, 5)
        self.b.weight = self.a.weight
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 5), requires_grad=False)

    def forward(self, x):
        return self.b(torch.tanh(self.bn(self.a(x)))) * self.scale


def make(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return Net().to(dtype)


def batches(n, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 5, generator=g, dtype=dtype), torch.randn(16, 5, generator=g, dtype=dtype))
            for _ in range(n)]


def backward(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss


def snapshot(model):
    return {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
def test_module_trains_like_torch_adam(dtype, tol):
    ours, ref = make(dtype), make(dtype)
    ids = {n: id(p) for n, p in ours.named_parameters()}
    opt = torch.optim.Adam(ref.parameters())  # the same defaults as no.Adam()
    state = no.setup(no.Adam(), ours)
    for x, y in batches(6, dtype):
        backward(ref, x, y)
        opt.step()
        backward(ours, x, y)
        buffers = {n: b.clone() for n, b in ours.named_buffers()}
        state, out = no.update_(state, ours, ours)  # the module as its own gradient: each parameter's .grad
        assert out is ours
        for n, b in ours.named_buffers():  # running statistics: moved by forward only, never by the step
            assert torch.equal(b, buffers[n]), n
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert p.dtype == dtype
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=n)
    for n, b in ref.named_buffers():
        torch.testing.assert_close(dict(ours.named_buffers())[n], b, rtol=tol, atol=tol)
    assert {n: id(p) for n, p in ours.named_parameters()} == ids  # the same Parameter objects
    assert all(type(p) is torch.nn.Parameter for p in ours.parameters())
    assert ours.b.weight is ours.a.weight  # still tied: one parameter, one state
    assert not ours.scale.requires_grad and ours.a.weight.requires_grad
    torch.testing.assert_close(ours.scale, torch.linspace(0.5, 1.5, 5, dtype=dtype))  # frozen: untouched
    assert state["scale"] is None and state["a.weight"].t == 6  # navigated by the torch names
    assert "b.weight" not in dict(ours.named_parameters())  # named_parameters() lists a tied one once


def test_stale_graph_raises_as_with_torch_optim():
    def stale(step):
        model = make()
        x, y = batches(1, torch.float32)[0]
        loss = ((model(x) - y) ** 2).mean()  # its graph saved the parameters as they are now
        ((model(x) - y) ** 2).mean().backward()
        step(model)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        backward(model, x, y)  # a graph built after the step is fine

    opt_of = {}
    stale(lambda m: opt_of.setdefault(id(m), torch.optim.Adam(m.parameters())).step())  # torch.optim raises
    stale(lambda m: no.update_(no.setup(no.Adam(), m), m, m))  # so does numbaopt


def test_bare_tensor_and_parameter_bump_their_version():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    state = no.setup(no.Descent(0.5), p)
    p.grad = torch.tensor([1.0, 1.0, 2.0])
    v0 = p._version
    state, out = no.update_(state, p, p)  # the tensor as its own gradient: its .grad
    assert out is p and p._version > v0 and type(p) is torch.nn.Parameter and p.requires_grad
    torch.testing.assert_close(p.detach(), torch.tensor([0.5, -2.5, 2.0]))
    t = torch.zeros(3, dtype=torch.float64)
    s2 = no.setup(no.Descent(1.0), t)
    v0 = t._version
    s2, t2 = no.update_(s2, t, torch.ones(3, dtype=torch.float64))
    assert t2 is t and t._version > v0 and torch.equal(t, -torch.ones(3, dtype=torch.float64))
    s3, q = no.update(state, p, torch.ones(3))  # pure: a new Parameter, requires_grad kept, p untouched
    assert type(q) is torch.nn.Parameter and q.requires_grad and q is not p
    torch.testing.assert_close(q.detach(), torch.tensor([0.0, -3.0, 1.5]))
    torch.testing.assert_close(p.detach(), torch.tensor([0.5, -2.5, 2.0]))


def test_version_moves_only_when_the_parameter_is_written():
    model = [torch.nn.Parameter(torch.ones(4))]
    state = no.setup(no.AccumGrad(2, no.Descent(0.1)), model)
    v = model[0]._version
    state, _ = no.update_(state, model, [torch.ones(4)])  # accumulating: nothing written
    assert model[0]._version == v and torch.equal(model[0].detach(), torch.ones(4))
    state, _ = no.update_(state, model, [torch.ones(4)])  # the cycle completes: written
    assert model[0]._version > v
    torch.testing.assert_close(model[0].detach(), torch.full((4,), 0.9))
    state, _ = no.update_(state, model, [None])  # a None gradient: not stepped, not bumped
    assert state[0].t == 1


def test_half_parameter_with_master_copy_is_bumped():
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.float16))
    state = no.setup(no.chain(no.MixedPrecision(np.float32), no.Descent(0.25)), [p])
    v = p._version
    state, _ = no.update_(state, [p], [torch.ones(8, dtype=torch.float16)])
    assert p._version > v and torch.equal(p.detach(), torch.full((8,), 0.75, dtype=torch.float16))


def run_forms(grad_form, model_form=lambda m: m, steps=3):
    """Parameters after ``steps`` numbaopt Adam steps of a fresh Net in the given forms."""
    model = make()
    state = no.setup(no.Adam(), model_form(model))
    for x, y in batches(steps, torch.float32):
        backward(model, x, y)
        state, _ = no.update_(state, model_form(model), grad_form(model))
    return snapshot(model)


def test_grad_forms_and_model_forms_agree():
    want = run_forms(lambda m: m)
    named = lambda m: {n: p.grad for n, p in m.named_parameters()}  # noqa: E731
    forms = {
        "dict": (named, lambda m: m),
        "dict without frozen": (lambda m: {n: p.grad for n, p in m.named_parameters() if p.requires_grad},
                                lambda m: m),
        "list": (lambda m: [p.grad for p in m.parameters()], lambda m: m),
        "pairs": (lambda m: [(n, p.grad) for n, p in m.named_parameters()], lambda m: m),
        "parameters() list": (lambda m: [p.grad for p in m.parameters()], lambda m: list(m.parameters())),
        "parameters() list as grads": (None, lambda m: list(m.parameters())),
        "parameters() generator": (lambda m: [p.grad for p in m.parameters()], lambda m: m.parameters()),
        "named_parameters()": (named, lambda m: m.named_parameters()),
        "named_parameters() with module grads": (lambda m: m, lambda m: m.named_parameters()),
        "list(named_parameters())": (named, lambda m: list(m.named_parameters())),
    }
    for name, (gf, mf) in forms.items():
        if gf is None:  # the model form itself as the gradient: each tensor's .grad
            model = make()
            state = no.setup(no.Adam(), list(model.parameters()))
            for x, y in batches(3, torch.float32):
                backward(model, x, y)
                params = list(model.parameters())
                state, out = no.update_(state, params, params)
                assert out is params
            got = snapshot(model)
        else:
            got = run_forms(gf, mf)
        for k in want:
            assert torch.equal(got[k], want[k]), (name, k)


def test_named_forms_return_what_they_were():
    model = make()
    pairs = list(model.named_parameters())
    state = no.setup(no.Adam(), pairs)
    assert state["a.weight"] is not None and state["scale"] is None
    backward(model, *batches(1, torch.float32)[0])
    _, out = no.update_(state, pairs, pairs)
    assert out is pairs
    _, out = no.update_(state, model.named_parameters(), model)
    assert type(out) is dict and out["a.weight"] is model.a.weight
    s2 = no.setup(no.Adam(), list(model.parameters()))
    assert s2[0] is None  # the frozen Parameter (the module's own, listed first) in a list: no state either


def test_none_grad_skips_a_parameter():
    model = make()
    state = no.setup(no.Adam(), model)
    backward(model, *batches(1, torch.float32)[0])
    model.bn.bias.grad = None
    before = model.bn.bias.detach().clone()
    v = model.bn.bias._version
    state, _ = no.update_(state, model, model)
    assert torch.equal(model.bn.bias, before) and model.bn.bias._version == v
    assert state["bn.bias"].t == 0 and state["bn.weight"].t == 1


def test_pure_update_returns_a_new_module():
    model = make()
    backward(model, *batches(1, torch.float32)[0])
    before = snapshot(model)
    versions = {n: p._version for n, p in model.named_parameters()}
    state = no.setup(no.Adam(1e-2), model)
    new_state, new = no.update(state, model, model)
    assert new is not model and type(new) is Net
    assert snapshot(model).keys() == before.keys()
    for k, v in snapshot(model).items():  # the old module is untouched
        assert torch.equal(v, before[k]), k
    assert {n: p._version for n, p in model.named_parameters()} == versions
    assert state["a.weight"].t == 0 and new_state["a.weight"].t == 1
    assert new.b.weight is new.a.weight and new.a.weight is not model.a.weight  # ties kept in the copy
    assert all(type(p) is torch.nn.Parameter for p in new.parameters())
    assert new.a.weight.requires_grad and not new.scale.requires_grad
    assert new.scale is not model.scale and torch.equal(new.scale, model.scale)
    for n, b in model.named_buffers():
        assert torch.equal(dict(new.named_buffers())[n], b)
    ref = copy.deepcopy(model)  # the same step in place on a copy: bitwise equal
    for p, q in zip(ref.parameters(), model.parameters()):
        p.grad = None if q.grad is None else q.grad.clone()  # a deep copy of a Parameter drops its .grad
    no.update_(no.setup(no.Adam(1e-2), ref), ref, ref)
    for (n, p), (_, q) in zip(new.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(new.a.weight, model.a.weight)
    backward(new, *batches(1, torch.float32)[0])  # the new module trains on
    assert new.a.weight.grad is not None and model.a.weight.grad is not None


def test_save_and_load_a_module_state(tmp_path):
    model = make()
    state = no.setup(no.Adam(), model)
    x, y = batches(1, torch.float32)[0]
    backward(model, x, y)
    state, _ = no.update_(state, model, model)
    no.save(tmp_path / "opt.npz", state)
    loaded = no.load(tmp_path / "opt.npz")
    other = copy.deepcopy(model)
    backward(model, x, y)
    backward(other, x, y)
    no.update_(state, model, model)
    no.update_(loaded, other, other)
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), n


def test_meta_tensors_are_refused_clearly():
    for _ in range(2):  # before and after a CPU tensor registered torch's type with the trait
        with pytest.raises(TypeError, match=r"model\['w'\]: a torch tensor on the 'meta' device.*tensor.cpu\(\)"):
            no.setup(no.Adam(), {"w": torch.empty(3, device="meta", requires_grad=True)})
        no.setup(no.Adam(), torch.zeros(2))
    with pytest.raises(TypeError, match="'meta' device"):
        no.setup(no.Adam(), torch.nn.Parameter(torch.empty(3, device="meta")))
    with pytest.raises(TypeError, match=r"model\['scale'\]: a torch tensor on the 'meta' device"):
        no.setup(no.Adam(), make().to("meta"))
    model = make()
    state = no.setup(no.Adam(), model)
    grads = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    grads["bn.bias"] = torch.empty(5, device="meta")
    before = snapshot(model)
    with pytest.raises(TypeError, match=r"grads\['bn.bias'\]: a torch tensor on the 'meta' device"):
        no.update_(state, model, grads)
    assert all(torch.equal(v, before[k]) for k, v in snapshot(model).items())


def test_bad_grads_name_the_path_and_write_nothing():
    model = make()
    state = no.setup(no.Adam(), model)
    good = lambda: {n: torch.ones_like(p) for n, p in model.named_parameters()}  # noqa: E731
    before = snapshot(model)
    versions = {n: p._version for n, p in model.named_parameters()}
    g = good()
    g["b.bias"] = torch.ones(4)
    with pytest.raises(ValueError, match=r"grads\['b.bias'\]: shape \(4,\)"):
        no.update_(state, model, g)
    g = good()
    g["bn.weight"] = "one"
    with pytest.raises(TypeError, match=r"grads\['bn.weight'\]: expected a float32 array of shape \(5,\)"):
        no.update_(state, model, g)
    g = good()
    del g["b.bias"]
    with pytest.raises(ValueError, match=r"missing \['b.bias'\]"):
        no.update_(state, model, g)
    g = good()
    g["typo"] = torch.ones(5)
    with pytest.raises(ValueError, match=r"unexpected \['typo'\]"):
        no.update_(state, model, g)
    with pytest.raises(ValueError, match="4 gradients for the model's 5 parameters"):
        no.update_(state, model, list(good().values())[:4])
    with pytest.raises(TypeError, match="grads: expected the gradients by parameter name"):
        no.update_(state, model, torch.ones(3))
    for k, v in snapshot(model).items():
        assert torch.equal(v, before[k]), k
    assert {n: p._version for n, p in model.named_parameters()} == versions
    assert state["a.weight"].t == 0


def test_module_inside_a_container_is_refused():
    with pytest.raises(TypeError, match=r"model\['net'\]: a torch.nn.Module \(Net\) inside a model container"):
        no.setup(no.Adam(), {"net": make(), "w": np.zeros(3)})


def test_numbaopt_never_imports_torch():
    code = "import sys, numbaopt; assert 'torch' not in sys.modules, 'numbaopt imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_model_as_its_own_gradient_is_torch_only():
    import dataclasses

    @dataclasses.dataclass
    class Layer:
        w: object

    arrays = Layer(np.ones(3))  # NumPy: the model as its gradient keeps its meaning, g = x
    state = no.setup(no.Descent(0.5), arrays)
    state, out = no.update_(state, arrays, arrays)
    np.testing.assert_array_equal(out.w, 0.5)
    nested = {"layer": Layer(torch.nn.Parameter(torch.ones(3)))}
    state = no.setup(no.Descent(0.5), nested)
    nested["layer"].w.grad = torch.ones(3)
    with pytest.raises(TypeError, match=r"grads\['layer'\]: the model as its own gradient .* not a Layer"):
        no.update_(state, nested, nested)
    state, _ = no.update_(state, nested, {"layer": Layer(nested["layer"].w.grad)})  # explicit: fine
    torch.testing.assert_close(nested["layer"].w.detach(), torch.full((3,), 0.5))
