"""kept_weights.capture / install on a stand-in for vLLM's model (no engine): a parameter the source
file holds with the same values is recorded by name and read back, anything else is copied; the
packed-linear closures are put back as they were; a tied tensor is handled once; a tensor that
changed shape is an error naming it, before anything is half-written into the model's own tensors."""

from __future__ import annotations

import pytest
import torch


class Lin(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)  # vLLM-CPU empties it after packing
        packed = w.clone()
        self.cpu_linear = lambda x, weight, bias: x @ packed.t()

    def forward(self, x):
        return self.cpu_linear(x, self.weight, None)


class Toy(torch.nn.Module):
    def __init__(self, g):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(6, 4, generator=g), requires_grad=False)
        self.norm = torch.nn.Parameter(torch.randn(4, generator=g), requires_grad=False)
        self.proj = Lin(torch.randn(4, 4, generator=g))
        self.head = torch.nn.Module()
        self.head.weight = self.embed  # tied

    def forward(self, ids):
        return self.proj(self.embed[ids] * self.norm) @ self.head.weight.t()


def _reload(model, g):
    """What vLLM's reload does: values copied into the same tensors, new packed closures."""
    with torch.no_grad():
        model.embed.copy_(torch.randn(6, 4, generator=g))
        model.norm.copy_(torch.randn(4, generator=g))
    model.proj.cpu_linear = Lin(torch.randn(4, 4, generator=g)).cpu_linear


@pytest.mark.parametrize("with_source", [False, True])
def test_a_kept_weight_set_is_put_back_exactly(with_source):
    from pofe.generation.kept_weights import capture, install

    g = torch.Generator().manual_seed(0)
    model, ids = Toy(g), torch.tensor([0, 3, 5])
    want = model(ids)
    embed_id = id(model.embed)
    # the file holds the embedding as pushed and an out-of-date norm: only the embedding may be read back
    file = {"embed": model.embed.detach().clone(), "norm": model.norm.detach() + 1}
    reads = []

    def read(names):
        reads.append(sorted(names))
        return {n: file[n] for n in names if n in file}

    state = capture(model, read if with_source else None)
    kinds = {name: "file" if isinstance(v, str) else "copy" for _, name, v in state[0]}
    assert kinds == ({"embed": "file", "norm": "copy"} if with_source else {"embed": "copy", "norm": "copy"})
    _reload(model, g)
    assert not torch.equal(model(ids), want)
    install(model, state, read if with_source else None)
    assert torch.equal(model(ids), want) and id(model.embed) == embed_id and model.head.weight is model.embed
    assert reads == ([["embed", "norm"], ["embed"]] if with_source else [])


def test_a_tensor_that_changed_shape_is_an_error_naming_it():
    from pofe.generation.kept_weights import capture, install

    g = torch.Generator().manual_seed(1)
    model = Toy(g)
    state = capture(model)
    _reload(model, g)
    embed, lin = model.embed.detach().clone(), model.proj.cpu_linear
    model.norm = torch.nn.Parameter(torch.zeros(5), requires_grad=False)
    with pytest.raises(RuntimeError, match=r"Toy\.norm: the engine's tensor changed shape"):
        install(model, state)
    assert torch.equal(model.embed, embed) and model.proj.cpu_linear is lin  # nothing half-written


def test_a_source_that_lost_a_tensor_is_an_error():
    from pofe.generation.kept_weights import capture, install

    model = Toy(torch.Generator().manual_seed(2))
    file = {"embed": model.embed.detach().clone()}
    state = capture(model, lambda names: {n: file[n] for n in names if n in file})
    with pytest.raises(RuntimeError, match="source lacks.*embed"):
        install(model, state, lambda names: {})
