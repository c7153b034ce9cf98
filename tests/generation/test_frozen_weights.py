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


@pytest.mark.parametrize("tied", ["drop", "copy"])
def test_save_weights_keeps_or_drops_a_tied_tensor_and_casts(tmp_path, tied):
    from pofe.generation.vllm import read_safetensors, save_weights

    emb, norm = torch.randn(5, 3), torch.randn(3)
    save_weights([("embed.weight", emb), ("norm.weight", norm), ("lm_head.weight", emb)], str(tmp_path / "w.safetensors"),
                 tied=tied, dtype=torch.bfloat16)
    got = dict(read_safetensors(str(tmp_path / "w.safetensors")))
    want = {"embed.weight": emb, "norm.weight": norm} | ({"lm_head.weight": emb} if tied == "copy" else {})
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], t.to(torch.bfloat16)), name


def test_model_dir_of_a_model_without_a_folder_is_a_loadable_copy(tiny_model, tokenizer):
    from safetensors.torch import load_file

    from pofe.generation.vllm import _model_dir

    tiny_model.config._name_or_path = ""
    path, tmp = _model_dir(tiny_model, tokenizer)
    saved = load_file(f"{path}/model.safetensors")
    state = tiny_model.state_dict()
    assert tmp is not None and saved and all(torch.equal(saved[k], state[k]) for k in saved)
    assert set(state) - set(saved) <= {"lm_head.weight"}  # tied to the embedding: saved once
