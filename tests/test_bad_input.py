"""Bad input gets an error that says what is wrong, and the engine keeps serving."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lanes import RequestError, SamplingParams, build_engine
from lanes.config import SUPPORTED_ARCHITECTURES, ConfigError
from lanes.models import WeightError, open_checkpoint


@pytest.fixture()
def model_copy(llama_dir, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(llama_dir, dst)
    return dst


def test_unknown_architecture_lists_supported(model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="GPTNeoXForCausalLM") as e:
        open_checkpoint(str(model_copy))
    assert all(a in str(e.value) for a in SUPPORTED_ARCHITECTURES)


def _rewrite(model_copy, change):
    f = model_copy / "model.safetensors"
    tensors = load_file(f)
    change(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def test_misshaped_tensor_is_named(model_copy):
    name = "model.layers.1.mlp.down_proj.weight"
    _rewrite(model_copy, lambda t: t.__setitem__(name, t[name][:, :100].contiguous()))
    with pytest.raises(WeightError, match=name.replace(".", r"\.") + r" has shape \[64, 100\]"):
        build_engine(str(model_copy))


def test_missing_and_unexpected_tensors_are_named(model_copy):
    def change(t):
        t["model.layers.0.extra.weight"] = torch.zeros(3)
        del t["model.layers.0.self_attn.k_proj.weight"]

    _rewrite(model_copy, change)
    with pytest.raises(WeightError) as e:
        build_engine(str(model_copy))
    assert "missing: model.layers.0.self_attn.k_proj.weight" in str(e.value)
    assert "unexpected: model.layers.0.extra.weight" in str(e.value)


def test_corrupt_values_are_named(model_copy):
    name = "model.layers.0.self_attn.o_proj.weight"

    def change(t):
        t[name][3, 5] = float("nan")

    _rewrite(model_copy, change)
    with pytest.raises(WeightError, match=name.replace(".", r"\.") + ".*NaN"):
        build_engine(str(model_copy))


def test_truncated_file_is_named(model_copy):
    f = model_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(WeightError, match="model.safetensors"):
        build_engine(str(model_copy))


def test_pickle_only_checkpoint_is_refused(model_copy):
    (model_copy / "model.safetensors").rename(model_copy / "pytorch_model.bin")
    with pytest.raises(WeightError, match="pickle"):
        open_checkpoint(str(model_copy))


def test_unknown_model_spec():
    with pytest.raises(ConfigError, match="neither a local directory"):
        open_checkpoint("/no/such/place")


def test_uncached_repo_id_offline_says_so():
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        open_checkpoint("nobody-at-all/no-such-model-xyz")


@pytest.fixture(scope="module")
def engine(llama_dir):
    return build_engine(str(llama_dir))


def test_prompt_longer_than_context(engine):
    too_long = [5] * engine.context_len
    with pytest.raises(RequestError, match=f"{engine.context_len} tokens"):
        engine.generate([too_long], SamplingParams(max_tokens=4))
    # nothing was queued and the engine still serves
    assert not engine.has_work()
    assert len(engine.generate(["hello"], SamplingParams(max_tokens=3))[0].token_ids) >= 1


def test_bad_batch_queues_nothing(engine):
    with pytest.raises(RequestError):
        engine.generate(["fine", [10**9]], SamplingParams(max_tokens=3))
    assert not engine.has_work()


def test_generation_stops_at_context_end(engine):
    prompt = [5] * (engine.context_len - 3)
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=50, ignore_eos=True))
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(stop=("",))],
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
