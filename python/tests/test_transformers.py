"""flash3 as a Hugging Face transformers attention implementation: runs the check of
examples/transformers_llama.py in-process on a 2-layer random Llama (prefill logits and cached
greedy decoding against SDPA), and checks that what flash3 cannot honour (padding) is refused.
Needs PyTorch, transformers and a Hopper GPU; skipped otherwise."""
import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a Hopper (sm_90) GPU",
)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "transformers_llama.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("transformers_llama", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    module.register()
    return module


def test_llama_prefill_and_cached_decoding_match_sdpa(example):
    # Count flash3's calls, so that a silent fallback to another implementation cannot pass.
    queries = []

    def counting(module, query, *args, **kwargs):
        queries.append(query.shape[2])
        return example.flash3_attention_forward(module, query, *args, **kwargs)

    example.AttentionInterface.register(example.ATTN_IMPLEMENTATION, counting)
    try:
        report = example.check(layers=2, prompt_len=300, new_tokens=16)
    finally:
        example.AttentionInterface.register(example.ATTN_IMPLEMENTATION, example.flash3_attention_forward)
    assert report.passed, "\n".join(report.lines + report.failures)
    # 2 layers: the prefill forward, then generate's prefill and its 15 one-token steps.
    assert queries == [300] * 2 + [300] * 2 + [1] * 15 * 2


@torch.no_grad()
def test_padded_batches_are_refused(example):
    config = example.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2)
    model = example.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    model.set_attn_implementation(example.ATTN_IMPLEMENTATION)
    ids = torch.randint(1000, (2, 20), device="cuda")
    mask = torch.ones_like(ids)
    assert model(ids, attention_mask=mask).logits.shape == (2, 20, 1000)  # no padding: fine
    mask[0, :5] = 0
    with pytest.raises(NotImplementedError, match="padded batches"):
        model(ids, attention_mask=mask)
