"""FlashAttention-3's `flash_attn_interface` module name over flash3, for running FA3's own
hopper/test_flash_attn.py against flash3 (scripts/fa3-tests). Functions flash3 does not
have yet raise NotImplementedError naming them, as flash3's own refusals do; conftest.py
turns each such refusal into a skip that says what was refused."""
from flash3.flash_attn_interface import flash_attn_func  # noqa: F401


def _not_yet(name):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"flash3: {name} is not implemented yet")

    refuse.__name__ = name
    return refuse


flash_attn_varlen_func = _not_yet("flash_attn_varlen_func")
flash_attn_combine = _not_yet("flash_attn_combine")
flash_attn_with_kvcache = _not_yet("flash_attn_with_kvcache")
get_scheduler_metadata = _not_yet("get_scheduler_metadata")
