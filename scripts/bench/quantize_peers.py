#!/usr/bin/env python3
"""The peers of `sous quantize` in scripts/bench/quantize.sh, on the same CPU:

  ct-kernel MODEL_DIR THREADS SECONDS
      compressed-tensors' own PyTorch implementation of the NVFP4A16 weight
      quantization (the calls llm-compressor makes: group amax and `generate_gparam`,
      per-block min/max and `calculate_qparams`, then `NVFP4PackedCompressor.compress`)
      on every Linear weight of the model, fused groups sharing a global scale, timed
      over repeated passes on THREADS torch threads. Prints JSON: GB/s of bf16 input,
      and the SHA-256 of the bytes, so the run shows it computed the same thing.

  digest SOUS_OUT_DIR
      The same SHA-256 over a `sous quantize` output, to compare with ct-kernel's.

  oneshot MODEL_DIR OUT_DIR
      llm-compressor's oneshot(scheme="NVFP4A16", ignore=["lm_head"]) with load and
      save, timed. Prints JSON.

Pinned tools: pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0
"""

import hashlib
import json
import sys
import time


def linear_weights(model_dir):
    """{name: bf16 tensor} of the decoder Linear weights (what sous quantizes)."""
    from safetensors.torch import load_file
    import glob
    import os

    tensors = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        for name, t in load_file(path).items():
            if name.endswith("proj.weight") and t.dim() == 2:
                tensors[name] = t
    return tensors


def fused_groups(names):
    groups, seen = [], set()
    for name in sorted(names):
        parent, _, last = name[: -len(".weight")].rpartition(".")
        for members in (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj")):
            full = [f"{parent}.{m}.weight" for m in members]
            if last in members and all(f in names for f in full) and full[0] not in seen:
                groups.append(full)
                seen.update(full)
    groups += [[n] for n in sorted(names) if n not in seen]
    return groups


def ct_kernel(model_dir, threads, seconds):
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    torch.set_num_threads(threads)
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    args = scheme.weights
    weights = linear_weights(model_dir)
    groups = fused_groups(weights)
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())

    def one_pass():
        out = {}
        with torch.no_grad():
            for group in groups:
                amax = torch.stack([weights[n].abs().amax() for n in group]).amax()
                gs = generate_gparam(-amax.reshape(1), amax.reshape(1))
                for name in group:
                    w = weights[name]
                    blocks = w.reshape(w.shape[0], w.shape[1] // 16, 16)
                    scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args, global_scale=gs)
                    state = {"weight": w, "weight_scale": scale, "weight_global_scale": gs, "weight_zero_point": zp}
                    out[name] = NVFP4PackedCompressor.compress(state, scheme)
        return out

    result = one_pass()
    passes, start = 0, time.perf_counter()
    cpu_start = time.process_time()
    while time.perf_counter() - start < seconds:
        one_pass()
        passes += 1
    wall = (time.perf_counter() - start) / passes
    cpu = (time.process_time() - cpu_start) / passes
    digest = hashlib.sha256()
    for name in sorted(result):
        for key in ("weight_packed", "weight_scale", "weight_global_scale"):
            t = result[name][key]
            digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    print(json.dumps({
        "tool": "compressed-tensors", "threads": threads, "tensors": len(weights), "bytes": nbytes,
        "seconds": wall, "gb_per_s": nbytes / wall / 1e9, "cpu_seconds": cpu, "gb_per_cpu_s": nbytes / cpu / 1e9,
        "sha256": digest.hexdigest(),
    }))


def digest(out_dir):
    import glob
    import os
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*.safetensors"))):
        tensors.update(load_file(path))
    layers = sorted(n[: -len(".weight_packed")] + ".weight" for n in tensors if n.endswith(".weight_packed"))
    digest = hashlib.sha256()
    for name in layers:
        module = name[: -len(".weight")]
        for key in ("weight_packed", "weight_scale", "weight_global_scale"):
            digest.update(tensors[f"{module}.{key}"].contiguous().view(torch.uint8).numpy().tobytes())
    print(json.dumps({"tool": "sous", "tensors": len(layers), "sha256": digest.hexdigest()}))


def oneshot(model_dir, out_dir):
    import torch
    from llmcompressor import oneshot as run_oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    loaded = time.perf_counter()
    run_oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=["lm_head"]))
    quantized = time.perf_counter()
    model.save_pretrained(out_dir, save_compressed=True)
    saved = time.perf_counter()
    print(json.dumps({"tool": "llm-compressor oneshot", "load_seconds": loaded - start,
                      "oneshot_seconds": quantized - loaded, "save_seconds": saved - quantized,
                      "seconds": saved - start}))


if __name__ == "__main__":
    if sys.argv[1] == "ct-kernel":
        ct_kernel(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif sys.argv[1] == "digest":
        digest(sys.argv[2])
    elif sys.argv[1] == "oneshot":
        oneshot(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
