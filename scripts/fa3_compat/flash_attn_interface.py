"""FlashAttention-3's `flash_attn_interface` module name over flash3, for running FA3's own
hopper/test_flash_attn.py against flash3 (scripts/fa3-tests): flash3.flash_attn_interface
has FA3's public names; those flash3 does not implement yet raise NotImplementedError
naming them, which conftest.py turns into a skip that says what was refused."""
from flash3.flash_attn_interface import *  # noqa: F401,F403
