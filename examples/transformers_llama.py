"""flash3 as the attention of a Hugging Face transformers Llama: register, prefill, decode, compare.

Registers flash3 with transformers' AttentionInterface (written against transformers 5.17)
under the name "fa3", builds a small randomly initialized Llama with grouped-query attention
(no download), and checks flash3 against PyTorch's SDPA:
  (a) prefill: the logits of a prompt batch;
  (b) cached greedy decoding through model.generate: flash3's per-step logits (one query
      against the growing KV cache) against a float32 forward over the same tokens, and the
      generated tokens against SDPA's.
Run from the repository root (or drop PYTHONPATH after `pip install .`):
    PYTHONPATH=python python3 examples/transformers_llama.py [--layers 4 --prompt-len 300 --new-tokens 32]
Exit status: 0 pass, 1 mismatch, 2 missing transformers or flash3 library, 3 no Hopper GPU.

Why "fa3" and not "flash3": transformers 5.17 reads any attn_implementation containing
"flash" as a FlashAttention kernel to fetch from the Hub (utils/generic.py,
is_flash_attention_requested; modeling_utils.py, _check_and_adjust_attn_implementation).
"""
import argparse
import copy
import sys
from dataclasses import dataclass, field

try:
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface, LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import causal_mask_function
except ImportError as e:
    print(f"this example needs PyTorch and transformers (pip install transformers): {e}", file=sys.stderr)
    sys.exit(2)

ATTN_IMPLEMENTATION = "fa3"
PADDING = "flash3: padded batches (attention_mask with padding) are not supported yet"
# Pass bounds on logits, both against a float32 forward of the same (bfloat16) weights:
REL_TOL = 2e-2  # max|error| <= 2% of max|logit| (bfloat16 keeps 8 bits: 0.4% per rounding, over layers)
BASELINE_FACTOR = 2.0  # and at most twice bfloat16 SDPA's own error, as FlashAttention's tests judge
_flash_attn_func = None  # flash3.flash_attn_func, imported by register()


def flash3_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             is_causal=None, **kwargs):
    """transformers' attention signature: query (batch, heads, seq_q, d), key/value (batch,
    kv_heads, seq_k, d). Returns (output (batch, seq_q, heads, d), None: no attention weights)."""
    if attention_mask is not None:  # flash3_mask returns None; a mask here came from elsewhere
        raise NotImplementedError(PADDING if attention_mask.dim() == 2 else
                                  f"flash3: attention masks of shape {tuple(attention_mask.shape)} are not supported yet")
    if dropout != 0.0 or kwargs.get("sliding_window") is not None or kwargs.get("softcap") \
            or kwargs.get("s_aux") is not None or kwargs.get("cu_seq_lens_q") is not None:
        raise NotImplementedError("flash3: dropout, sliding windows, softcap, attention sinks and packed "
                                  "sequences are not supported yet")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # flash3 takes (batch, seq, heads, d) at any strides with a contiguous last dim: transposed
    # views, no copies; GQA natively (k, v keep their kv_heads). Its causal mask is aligned
    # bottom-right (query i sees keys j <= i + seq_k - seq_q), as decoding with a cache needs.
    out = _flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                           softmax_scale=scaling, causal=causal)
    return out, None


def flash3_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=causal_mask_function,
                attention_mask=None, **kwargs):
    """transformers' mask hook, run once per forward: None (plain causal attention: what flash3
    computes), or NotImplementedError for what flash3 cannot honour. Without a registered hook,
    transformers would drop the padding mask silently (masking_utils.py, _preprocess_mask_arguments)."""
    if mask_function is not causal_mask_function:
        raise NotImplementedError("flash3: attention patterns other than causal (sliding windows, packed "
                                  "sequences, bidirectional) are not supported yet")
    if kv_offset + kv_length != int(q_offset) + q_length:  # the keys must end where the queries end
        raise NotImplementedError("flash3: KV caches with unused slots (static caches) are not supported yet")
    if attention_mask is not None and not bool(attention_mask[:, -kv_length:].all()):
        raise NotImplementedError(PADDING)
    return None


def register(name=ATTN_IMPLEMENTATION):
    """Makes attn_implementation=name mean flash3 (from_pretrained, set_attn_implementation).
    Imports flash3, which loads its compiled operators: raises flash3.LibraryNotFoundError without them."""
    global _flash_attn_func
    from flash3.flash_attn_interface import flash_attn_func

    _flash_attn_func = flash_attn_func
    AttentionInterface.register(name, flash3_attention_forward)
    AttentionMaskInterface.register(name, flash3_mask)


@dataclass
class Report:
    lines: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    @property
    def passed(self):
        return not self.failures


def _compare(report, what, flash3_logits, sdpa_logits, ref32):
    """Max |error| of flash3's and bfloat16 SDPA's logits against float32 SDPA's, and flash3's bound."""
    scale = ref32.abs().max().item()
    err, base = [(x.float() - ref32).abs().max().item() for x in (flash3_logits, sdpa_logits)]
    bound = min(REL_TOL * scale, BASELINE_FACTOR * base + 2**-8 * scale)  # + one bf16 rounding of max|logit|
    report.lines.append(f"{what}: max|logit| {scale:.3f}, max|error| flash3 {err:.4f} ({err / scale:.2%}), "
                        f"bf16 sdpa {base:.4f} ({base / scale:.2%}); bound {bound:.4f}")
    if not err <= bound:
        report.failures.append(f"{what}: flash3's error {err:.4f} exceeds {bound:.4f}")
    return err, base, bound


@torch.no_grad()
def check(layers=4, prompt_len=300, new_tokens=32, batch=2, head_dim=64, seed=0):
    """Builds a random Llama on the GPU and compares flash3 with SDPA; register() first."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=head_dim,
                         max_position_embeddings=4096, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ref32 = copy.deepcopy(model).float()  # the same weights, exactly, in float32 with SDPA
    ref32.set_attn_implementation("sdpa")
    prompt = torch.randint(config.vocab_size, (batch, prompt_len), device="cuda")
    ones = torch.ones_like(prompt)  # no padding: flash3 refuses padded batches
    report = Report()

    def run(name, fn):
        model.set_attn_implementation(name)
        return fn()

    # (a) prefill
    logits = {name: run(name, lambda: model(prompt).logits) for name in (ATTN_IMPLEMENTATION, "sdpa")}
    _compare(report, "prefill", logits[ATTN_IMPLEMENTATION], logits["sdpa"], ref32(prompt).logits)

    # (b) cached greedy decoding. With random weights, top logits can be near-ties that bf16
    # rounding flips, after which the sequences legitimately differ. So the logits flash3 decoded
    # with (one query per step against its KV cache) are judged against a float32 forward over
    # flash3's own tokens (teacher forcing, no cache); SDPA's tokens must equal flash3's up to a
    # first difference, which must be a near-tie of the float32 logits.
    gen = {name: run(name, lambda: model.generate(
        prompt, attention_mask=ones, max_new_tokens=new_tokens, do_sample=False,
        use_cache=True, return_dict_in_generate=True, output_logits=True)) for name in (ATTN_IMPLEMENTATION, "sdpa")}
    seq = gen[ATTN_IMPLEMENTATION].sequences
    step_logits = torch.stack(gen[ATTN_IMPLEMENTATION].logits, dim=1)  # (batch, new_tokens, vocab)
    forced = seq[:, :-1]
    ref = ref32(forced).logits[:, prompt_len - 1:]
    sdpa_forced = run("sdpa", lambda: model(forced).logits[:, prompt_len - 1:])
    err, base, bound = _compare(report, "decode", step_logits, sdpa_forced, ref)

    ours, theirs = seq[:, prompt_len:], gen["sdpa"].sequences[:, prompt_len:]
    tie = 2 * (min(err, bound) + base)  # picks can swap only if float32's gap is within both errors
    for row in range(batch):
        differ = (ours[row] != theirs[row]).nonzero()
        if not len(differ):
            report.lines.append(f"row {row}: all {new_tokens} greedy tokens equal to sdpa's")
            continue
        t = differ[0].item()
        gap = (ref[row, t, ours[row, t]] - ref[row, t, theirs[row, t]]).abs().item()
        report.lines.append(f"row {row}: greedy tokens equal to sdpa's up to step {t}, where float32 logits "
                            f"of the two picks differ by {gap:.4f} (a near-tie if <= {tie:.4f})")
        if gap > tie:
            report.failures.append(f"row {row}: tokens differ at step {t} without a near-tie")
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64, choices=(64, 128, 256))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("no Hopper GPU found (flash3 needs an H100/H200, sm_90): nothing run", file=sys.stderr)
        return 3
    try:
        import flash3
    except ImportError as e:
        print(f"cannot import flash3 (run with PYTHONPATH=python, or pip install .): {e}", file=sys.stderr)
        return 2
    try:
        register()
    except flash3.LibraryNotFoundError as e:  # its compiled operators are not built or not found
        print(e, file=sys.stderr)
        return 2
    report = check(args.layers, args.prompt_len, args.new_tokens, args.batch, args.head_dim, args.seed)
    print(f"Llama, {args.layers} layers, 16 heads / 4 kv heads of {args.head_dim}, bfloat16; batch {args.batch}, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens; flash3 ('{ATTN_IMPLEMENTATION}') against sdpa")
    print("\n".join(report.lines))
    print("PASS" if report.passed else "FAIL: " + "; ".join(report.failures))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
