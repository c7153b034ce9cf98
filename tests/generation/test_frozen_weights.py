"""read_safetensors: a safetensors file read back with plain reads gives the tensors saved (names,
dtypes, shapes, values, a tied copy and an empty tensor included); a cut file is an error naming it."""

from __future__ import annotations

import pytest
import torch


def test_read_safetensors_gives_back_what_was_saved(tmp_path):
    from safetensors.torch import save_file

    from pofe.generation.vllm import read_safetensors

    g = torch.Generator().manual_seed(0)
    emb = torch.randn(7, 3, generator=g).to(torch.bfloat16)
    saved = {"model.embed_tokens.weight": emb, "lm_head.weight": emb.clone(), "norm.weight": torch.randn(3, generator=g),
             "steps": torch.tensor([3, 4], dtype=torch.int64), "empty": torch.zeros(0, 2, dtype=torch.float16)}
    save_file(saved, str(tmp_path / "m.safetensors"))
    got = dict(read_safetensors(str(tmp_path / "m.safetensors")))
    assert got.keys() == saved.keys()
    for k, v in saved.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    got["norm.weight"] += 1  # memory of its own: writable, and the file is untouched
    assert torch.equal(dict(read_safetensors(str(tmp_path / "m.safetensors")))["norm.weight"], saved["norm.weight"])


def test_a_cut_file_is_an_error_naming_file_and_tensor(tmp_path):
    from safetensors.torch import save_file

    from pofe.generation.vllm import EngineSyncError, read_safetensors

    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(4), "b": torch.ones(1000)}, str(path))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(EngineSyncError, match=r"m\.safetensors: tensor 'b' is cut short"):
        read_safetensors(str(path))
