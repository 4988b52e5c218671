"""FlashAttention-3's tests against flash3: a NotImplementedError that flash3 raises (a
feature it does not have: its message starts with "flash3:") skips the test, with that
message as the reason; any other failure stays a failure."""
import os
import random

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    refused = None
    try:
        pyfuncitem.obj(**args)
    except NotImplementedError as e:
        if not str(e).startswith("flash3:"):
            raise
        refused = str(e).splitlines()[0]
    # Skipped outside the except block, so that the skip holds no traceback of the test's
    # frames: their tensors (FA3's race test holds 70 GiB of "memory load") are freed now.
    if refused is not None:
        pytest.skip(refused)
    return True


# FA3's tests that hold tens of GiB each (the combine tests' partials, the race tests'
# repeated outputs): run alone, after the shards.
HEAVY = ("test_flash_attn_combine", "test_flash_attn_race_condition")


def pytest_collection_modifyitems(config, items):
    """FLASH3_FA3_SHARD=k/n (scripts/fa3-tests --jobs n) keeps every n-th test from the
    k-th of a fixed shuffle, but the HEAVY ones, so that n processes share the GPU with
    their skips and slow cases spread evenly; FLASH3_FA3_SHARD=heavy keeps only the HEAVY ones."""
    shard = os.environ.get("FLASH3_FA3_SHARD")
    if not shard:
        return
    if shard == "heavy":
        items[:] = [item for item in items if item.originalname in HEAVY]
    else:
        k, n = (int(x) for x in shard.split("/"))
        light = [item for item in items if item.originalname not in HEAVY]
        # Dealt after a fixed shuffle: in collection order a period of the parameters
        # (here 6 = mha_type x dtype) would give some shards all the skips.
        order = list(range(len(light)))
        random.Random(0).shuffle(order)
        items[:] = [light[i] for i in sorted(order[k::n])]


def pytest_runtest_teardown(item, nextitem):
    """With several pytest processes sharing the GPU (FLASH3_FA3_SHARD), each hands its cached
    blocks back after every test: FA3's float references at 4k keys peak at many GiB, and with
    16 processes keeping theirs cached, the largest shapes (seqlen 2k-20k) failed in bunches."""
    if os.environ.get("FLASH3_FA3_SHARD"):
        import gc
        import torch
        gc.collect()
        torch.cuda.empty_cache()


# Tensors of a failed test kept for analysis (FLASH3_FA3_DUMP=DIR; scripts/fa3_compat/
# analyze_dump.py recomputes its gradients in float64).
DUMPED = ("q_ref", "k_ref", "v_ref", "g", "out", "out_ref", "dq", "dk", "dv", "dq_ref", "dk_ref",
          "dv_ref", "dq_pt", "dk_pt", "dv_pt", "query_padding_mask", "key_padding_mask",
          "window_size", "causal", "softcap")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """FLASH3_FA3_DUMP=DIR: a test that fails after its gradients exist leaves the tensors
    of DUMPED (those it has) in DIR/<test id>.npz, float32 on the CPU; the dtype is the id's."""
    report = (yield).get_result()
    out = os.environ.get("FLASH3_FA3_DUMP")
    if not out or call.when != "call" or not report.failed or call.excinfo is None:
        return
    import numpy as np
    import torch
    frame, tb = None, call.excinfo.tb
    while tb is not None:  # the test function's own frame
        if tb.tb_frame.f_code.co_name == item.originalname:
            frame = tb.tb_frame.f_locals
        tb = tb.tb_next
    if frame is None or "dq" not in frame:
        return
    arrays = {}
    for name in DUMPED:
        value = frame.get(name)
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            arrays[name] = (value.float() if value.is_floating_point() else value).numpy()
        elif value is not None:
            arrays[name] = np.array(value)
    os.makedirs(out, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in item.name)
    np.savez_compressed(os.path.join(out, f"{name}.npz"), **arrays)
