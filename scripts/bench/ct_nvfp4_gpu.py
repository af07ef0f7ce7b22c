#!/usr/bin/env python3
"""compressed-tensors' NVFP4 weight quantization on one GPU, in GB/s of bf16 input.

    ct_nvfp4_gpu.py [--gib 1] [--cols 8192] [--repeats 10] [--warmup 2] [--seed 0]
                    [--device cuda:0] [--dump DIR] [--json]

Makes a seeded random bf16 tensor (ROWS × COLS, ROWS from --gib) on the device and times,
with CUDA events after warm-up, the median of REPEATS runs of:

  copy       torch.empty_like + copy_ of the tensor: the memory-bound ceiling (also given
             in TB/s counting the bytes read and written).
  ct_triton  the weight → checkpoint-tensors path that llm-compressor takes with
             compressed-tensors (the calls of quantize_peers.py ct-kernel), on the device:
             torch.aminmax of the tensor and `generate_gparam` (weight_global_scale, fp32),
             `compute_dynamic_scales_and_zp` (per-16 block amin/amax → `calculate_qparams`
             with the global scale: block scales rounded through fp8 e4m3), then
             `NVFP4PackedCompressor.compress` (`quantize` → `pack_fp4_to_uint8`, block
             scales to fp8). On a CUDA tensor compressed-tensors dispatches `quantize`'s
             inner `_quantize` to `_quantize_triton` and `pack_fp4_to_uint8` to
             `pack_fp4_to_uint8_triton` (its Triton kernels); the scale steps are PyTorch.
  ct_eager   the same calls with those Triton backends switched off (what CT_ENFORCE_EAGER
             does: compressed_tensors.utils.impl_backend.ENFORCE_EAGER), i.e. its PyTorch
             eager reference arithmetic: `_quantize`'s torch body (divide, clamp,
             `cast_to_fp4` by masks) and `pack_fp4_to_uint8`'s torch body.

For each ct path it also times the four stages alone (global scale, block scales,
quantize, pack), says which compressed-tensors backends ran, the peak GPU memory, and
whether the Triton and eager paths gave the same bytes. --dump DIR writes the input and
the ct_triton outputs of one run (weight, weight_packed, weight_scale,
weight_global_scale) to DIR/ct_nvfp4.safetensors, and the eager outputs to
DIR/ct_nvfp4_eager.safetensors when they differ, for another program to compare bytes.
--json prints one JSON object on stdout (progress goes to stderr).

Keep --gib below 4: the upstream Triton kernels index with 32-bit offsets.
--device cpu runs everything through the eager path (a smoke test; the timing is wall-clock).

Pinned: compressed-tensors==0.19.0 (with pydantic 2.12.5, pydantic-core 2.41.5,
annotated-types 0.7.0, typing-inspection 0.4.2, loguru 0.7.3), on torch 2.11 (cu130),
triton 3.6, safetensors, transformers 5.17. On a machine without internet, from wheels in
.whl/ (pip download ... -d .whl NAME==VERSION):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    python3 scripts/bench/ct_nvfp4_gpu.py --json
"""

import argparse
import contextlib
import json
import statistics
import sys
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def backends(eager, used):
    """Force or forbid compressed-tensors' eager fallbacks, and record which registered
    (non-eager) backends ran into the set `used`."""
    import compressed_tensors.utils.impl_backend as ib

    saved_flag = ib.ENFORCE_EAGER
    saved = dict(ib.ImplBackend._backends)

    def traced(fn):
        def run(*a, **k):
            used.add(fn.__name__)
            return fn(*a, **k)
        return run

    ib.ENFORCE_EAGER = eager
    for name, entries in saved.items():
        ib.ImplBackend._backends[name] = [(traced(fn), req, prio) for fn, req, prio in entries]
    try:
        yield
    finally:
        ib.ENFORCE_EAGER = saved_flag
        ib.ImplBackend._backends.clear()
        ib.ImplBackend._backends.update(saved)


class Timer:
    def __init__(self, device, repeats, warmup):
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.device = device
        self.repeats = repeats
        self.warmup = warmup

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def __call__(self, fn):
        """Median, min and max seconds of `fn()` over the repeats, after warm-up."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.repeats):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--gib", type=float, default=1.0, help="size of the bf16 input in GiB (default 1)")
    ap.add_argument("--cols", type=int, default=8192, help="columns, a multiple of 16 (default 8192)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dump", metavar="DIR", help="write input and outputs of one run as safetensors")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a = ap.parse_args()
    if a.cols % 16:
        ap.error("--cols must be a multiple of 16")

    import torch
    import compressed_tensors
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp, generate_gparam
    from compressed_tensors.utils.triton import HAS_TRITON

    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = max(1, round(a.gib * 2**30 / (2 * a.cols)))
    if rows * a.cols >= 2**31:
        log(f"warning: {rows * a.cols} elements: past 2^31, the upstream Triton kernels' 32-bit offsets overflow")
    gen = torch.Generator(device=device).manual_seed(a.seed)
    x = torch.randn(rows, a.cols, dtype=torch.bfloat16, device=device, generator=gen)
    nbytes = x.numel() * x.element_size()

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    args = scheme.weights

    # the stages, each a compressed-tensors call (or torch.aminmax, which ct uses for a
    # whole-tensor min/max in compute_dynamic_scales_and_zp)
    def global_scale(w):
        lo, hi = torch.aminmax(w)
        return generate_gparam(lo.reshape(1), hi.reshape(1))

    def block_scales(w, gs):
        return compute_dynamic_scales_and_zp(value=w, args=args, module=None, global_scale=gs)

    def ct_path(w):
        gs = global_scale(w)
        scale, zp = block_scales(w, gs)
        state = {"weight": w, "weight_scale": scale, "weight_global_scale": gs, "weight_zero_point": zp}
        return NVFP4PackedCompressor.compress(state, scheme)

    timer = Timer(device, a.repeats, a.warmup)
    res = {
        "tool": "compressed-tensors NVFP4 (NVFP4A16 weights)",
        "compressed_tensors": compressed_tensors.__version__,
        "torch": torch.__version__,
        "triton": None,
        "has_triton": HAS_TRITON,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "timing": "CUDA events" if device.type == "cuda" else "wall clock",
        "shape": [rows, a.cols],
        "dtype": "bfloat16",
        "bytes": nbytes,
        "seed": a.seed,
        "repeats": a.repeats,
        "warmup": a.warmup,
    }
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass

    def rate(t):
        t["gb_per_s"] = nbytes / t["median_s"] / 1e9
        return t

    # 1. device-to-device copy
    def copy():
        y = torch.empty_like(x)
        y.copy_(x)
        return y

    log(f"input {rows}x{a.cols} bf16, {nbytes / 2**30:.3f} GiB on {res['device']}")
    t = rate(timer(copy))
    t["tb_per_s_read_write"] = 2 * nbytes / t["median_s"] / 1e12
    res["copy"] = t
    log(f"copy       {t['median_s'] * 1e3:9.3f} ms  {t['gb_per_s']:8.1f} GB/s  ({t['tb_per_s_read_write']:.2f} TB/s read+write)")

    # 2. and 3. the compressed-tensors paths
    outs = {}
    for name, eager in (("ct_triton", False), ("ct_eager", True)):
        used = set()
        with backends(eager, used):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            out = ct_path(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                peak = torch.cuda.max_memory_allocated(device) - base
            outs[name] = {k: v for k, v in out.items() if k in ("weight_packed", "weight_scale", "weight_global_scale")}
            t = rate(timer(lambda: ct_path(x)))
            # the stages alone, on inputs made beforehand
            gs = global_scale(x)
            scale, zp = block_scales(x, gs)
            q = quantize(x=x, scale=scale, zero_point=zp, args=args, global_scale=gs)
            stages = {
                "global_scale": rate(timer(lambda: global_scale(x))),
                "block_scales": rate(timer(lambda: block_scales(x, gs))),
                "quantize": rate(timer(lambda: quantize(x=x, scale=scale, zero_point=zp, args=args, global_scale=gs))),
                "pack": rate(timer(lambda: pack_fp4_to_uint8(q))),
            }
            del gs, scale, zp, q
        t["stages"] = stages
        t["backends_used"] = sorted(used)
        if device.type == "cuda":
            t["peak_gpu_bytes_over_input"] = peak
        res[name] = t
        log(f"{name:10s} {t['median_s'] * 1e3:9.3f} ms  {t['gb_per_s']:8.1f} GB/s  backends: {', '.join(t['backends_used']) or 'eager only'}")
        for s, st in stages.items():
            log(f"  {s:14s} {st['median_s'] * 1e3:9.3f} ms  {st['gb_per_s']:8.1f} GB/s")
        if device.type == "cuda" and not eager and not {"_quantize_triton", "pack_fp4_to_uint8_triton"} <= used:
            log("warning: compressed-tensors did not use both its Triton backends on this device")

    tri, eag = outs["ct_triton"], outs["ct_eager"]
    same = {}
    for k in tri:
        a_bytes = tri[k].contiguous().view(torch.uint8).reshape(-1)
        b_bytes = eag[k].contiguous().view(torch.uint8).reshape(-1)
        same[k] = int((a_bytes != b_bytes).sum().item()) if a_bytes.shape == b_bytes.shape else -1
    res["triton_vs_eager_differing_bytes"] = same
    res["outputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")} for k, v in tri.items()}
    log(f"triton vs eager differing bytes: {same}")

    if a.dump:
        import os
        from safetensors.torch import save_file

        os.makedirs(a.dump, exist_ok=True)
        meta = {"seed": str(a.seed), "shape": f"{rows}x{a.cols}", "compressed_tensors": compressed_tensors.__version__,
                "torch": torch.__version__, "path": "ct_triton" if device.type == "cuda" else "ct (eager on cpu)"}
        tensors = {"weight": x.cpu().contiguous()}
        tensors.update({k: v.cpu().contiguous() for k, v in tri.items()})
        path = os.path.join(a.dump, "ct_nvfp4.safetensors")
        save_file(tensors, path, metadata=meta)
        res["dump"] = [path]
        if any(same.values()):
            path = os.path.join(a.dump, "ct_nvfp4_eager.safetensors")
            save_file({k: v.cpu().contiguous() for k, v in eag.items()}, path, metadata=dict(meta, path="ct_eager"))
            res["dump"].append(path)
        log(f"wrote {', '.join(res['dump'])}")

    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for name in ("copy", "ct_triton", "ct_eager"):
            extra = f"  ({res[name]['tb_per_s_read_write']:.2f} TB/s read+write)" if name == "copy" else ""
            print(f"{name:10s} {res[name]['gb_per_s']:8.1f} GB/s of bf16 input{extra}")


if __name__ == "__main__":
    main()
