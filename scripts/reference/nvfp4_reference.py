#!/usr/bin/env python3
"""NVFP4 reference fixtures for `sous quantize`, made once with the real tools.

Part 1 (`reference`): quantize a bf16 model with llm-compressor's
`oneshot(..., scheme="NVFP4A16", ignore=["lm_head"])` and write a digest fixture: the
SHA-256 of every `weight_packed`, `weight_scale` and `weight_global_scale` tensor's
bytes, the config.json `quantization_config`, the versions used, and the SHA-256 of the
source weights. tests/e2e/quantize.rs compares `sous quantize` against it.

Part 1b (`modelopt`): the same with NVIDIA ModelOpt 0.47 (`W4A16_NVFP4_CFG`,
`export_hf_checkpoint`), exported on the CPU: the SHA-256 of every `weight`,
`weight_scale` and `weight_scale_2` of a quantized layer, `hf_quant_config.json` and
the config's `quantization_config`. A CPU export computes `weight_scale_2` as
`amax / 2688`; `sous quantize --format modelopt --modelopt-export cpu` reproduces it
(the default, `gpu`, reproduces the usual GPU export instead).

Part 2 (`check`): given a `sous quantize --json --digests` output directory and its
summary, check that compressed-tensors accepts sous's `quantization_config`, that its
NVFP4 decompressor turns every sous tensor back into exactly the bf16 values sous says
its own dequantization gives (`dequantized_bf16_sha256`), and that sous's tensors equal
the fixture's. What it prints is committed beside the fixture.

Needs PyTorch, so CI never runs it. Pinned tools (install into any venv):

    pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0 nvidia-modelopt==0.47.0

Usage:

    nvfp4_reference.py reference MODEL_DIR FIXTURE.json [--work DIR]
    nvfp4_reference.py modelopt MODEL_DIR FIXTURE.json [--work DIR]
    nvfp4_reference.py check FIXTURE.json SOUS_OUT_DIR SOUS_SUMMARY.json [--compare-with LLMC_OUT_DIR]

`check --compare-with` also loads both checkpoints with transformers (which
decompresses them through compressed-tensors) and compares their logits.
"""

import argparse
import hashlib
import json
import os
import platform
import struct
import sys
import tempfile
import time


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def safetensors_tensors(directory):
    """{name: (dtype, shape, raw little-endian bytes)} over every shard, read directly
    from the files so the digests are of exactly the bytes written."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
            base = 8 + length
            for tensor, info in header.items():
                if tensor == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                f.seek(base + start)
                out[tensor] = (info["dtype"], info["shape"], f.read(end - start))
    return out


QUANT_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_global_scale")


def reference(args):
    import torch
    import transformers
    import compressed_tensors
    import llmcompressor
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    sources = sorted(f for f in os.listdir(args.model) if f.endswith(".safetensors"))
    work = args.work or tempfile.mkdtemp(prefix="nvfp4-reference-")
    out_dir = os.path.join(work, "llm-compressor")
    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    loaded = time.time()
    recipe = QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=["lm_head"])
    oneshot(model=model, recipe=recipe)
    quantized = time.time()
    model.save_pretrained(out_dir, save_compressed=True)
    saved = time.time()

    tensors = safetensors_tensors(out_dir)
    digests = {
        name: {"dtype": dtype, "shape": shape, "sha256": hashlib.sha256(data).hexdigest()}
        for name, (dtype, shape, data) in sorted(tensors.items())
        if name.endswith(QUANT_SUFFIXES)
    }
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    fixture = {
        "what": "llm-compressor oneshot(scheme=NVFP4A16, ignore=[lm_head]) on the bf16 test model: "
        "SHA-256 of each quantized tensor's safetensors bytes",
        "generated_by": "scripts/reference/nvfp4_reference.py reference",
        "tools": {
            "llmcompressor": llmcompressor.__version__,
            "compressed_tensors": compressed_tensors.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "source": {name: sha256_file(os.path.join(args.model, name)) for name in sources},
        "seconds": {
            "load": round(loaded - started, 2),
            "oneshot": round(quantized - loaded, 2),
            "save": round(saved - quantized, 2),
        },
        "quantization_config": config["quantization_config"],
        "unquantized_tensors": sorted(n for n in tensors if not n.endswith(QUANT_SUFFIXES)),
        "tensors": digests,
    }
    with open(args.fixture, "w") as f:
        json.dump(fixture, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(digests)} quantized tensors digested into {args.fixture}")
    print(f"oneshot {quantized - loaded:.2f} s, load {loaded - started:.2f} s, save {saved - quantized:.2f} s")
    print(f"llm-compressor output kept in {out_dir}")


def modelopt(args):
    import torch
    import transformers
    import modelopt as mo
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    sources = sorted(f for f in os.listdir(args.model) if f.endswith(".safetensors"))
    work = args.work or tempfile.mkdtemp(prefix="nvfp4-modelopt-")
    out_dir = os.path.join(work, "modelopt")
    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    loaded = time.time()
    # Weight-only: the weights' max calibrator needs one forward pass of any input.
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    mtq.quantize(model, mtq.W4A16_NVFP4_CFG, forward_loop=lambda m: m(prompt))
    quantized = time.time()
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=out_dir)
    saved = time.time()

    tensors = safetensors_tensors(out_dir)
    layers = sorted(n[: -len(".weight_scale_2")] for n in tensors if n.endswith(".weight_scale_2"))
    digests = {}
    for layer in layers:
        for suffix in ("weight", "weight_scale", "weight_scale_2"):
            dtype, shape, data = tensors[f"{layer}.{suffix}"]
            digests[f"{layer}.{suffix}"] = {"dtype": dtype, "shape": shape, "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(out_dir, "hf_quant_config.json")) as f:
        hf_quant_config = json.load(f)
    fixture = {
        "what": "ModelOpt W4A16_NVFP4_CFG, export_hf_checkpoint on the CPU, on the bf16 test model: "
        "SHA-256 of each quantized tensor's safetensors bytes",
        "generated_by": "scripts/reference/nvfp4_reference.py modelopt",
        "tools": {
            "modelopt": mo.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "device": "cpu",
        },
        "source": {name: sha256_file(os.path.join(args.model, name)) for name in sources},
        "seconds": {
            "load": round(loaded - started, 2),
            "quantize": round(quantized - loaded, 2),
            "export": round(saved - quantized, 2),
        },
        "quantization_config": config.get("quantization_config"),
        "hf_quant_config": hf_quant_config,
        "unquantized_tensors": sorted(n for n in tensors if n not in digests),
        "tensors": digests,
    }
    with open(args.fixture, "w") as f:
        json.dump(fixture, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(digests)} quantized tensors of {len(layers)} layers digested into {args.fixture}")
    print(f"ModelOpt output kept in {out_dir}")


def bf16_bytes(tensor):
    import torch

    return tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()


def check(args):
    import torch
    import compressed_tensors
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig

    with open(args.fixture) as f:
        fixture = json.load(f)
    with open(args.summary) as f:
        summary = json.load(f)
    with open(os.path.join(args.sous_out, "config.json")) as f:
        config = json.load(f)
    failures = 0
    print(f"compressed-tensors {compressed_tensors.__version__}, torch {torch.__version__}")

    # 1. compressed-tensors parses sous's quantization_config.
    qconfig = QuantizationConfig.model_validate(config["quantization_config"])
    scheme = qconfig.config_groups["group_0"]
    print(f"quantization_config accepted: format={qconfig.format}, "
          f"weights={scheme.weights.num_bits}-bit {scheme.weights.type} {scheme.weights.strategy} "
          f"group {scheme.weights.group_size}, input_activations={scheme.input_activations}, "
          f"ignore={qconfig.ignore}")
    if not NVFP4PackedCompressor.can_compress(torch.nn.Linear, scheme):
        print("FAIL: the NVFP4 compressor does not take sous's scheme")
        failures += 1

    # 2. sous's tensors equal llm-compressor's, byte for byte.
    tensors = safetensors_tensors(args.sous_out)
    mismatched = [
        name
        for name, want in fixture["tensors"].items()
        if name not in tensors or hashlib.sha256(tensors[name][2]).hexdigest() != want["sha256"]
    ]
    extra = [n for n in tensors if n.endswith(QUANT_SUFFIXES) and n not in fixture["tensors"]]
    print(f"quantized tensors identical to llm-compressor {fixture['tools']['llmcompressor']}: "
          f"{len(fixture['tensors']) - len(mismatched)} of {len(fixture['tensors'])}"
          + (f"; sous has {len(extra)} more" if extra else ""))
    failures += len(mismatched) + len(extra)
    for name in mismatched[:10]:
        print(f"  FAIL {name}")

    # 3. compressed-tensors' decompression of sous's tensors equals sous's own.
    by_module = {}
    for entry in summary["tensors"]:
        if entry.get("dequantized_bf16_sha256"):
            by_module[entry["name"].removesuffix(".weight")] = entry["dequantized_bf16_sha256"]
    equal = 0
    for module, want in sorted(by_module.items()):
        state = {}
        for suffix in ("weight_packed", "weight_scale", "weight_global_scale"):
            dtype, shape, data = tensors[f"{module}.{suffix}"]
            torch_dtype = {"U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32}[dtype]
            state[suffix] = torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)
        weight = NVFP4PackedCompressor.decompress(state, scheme)["weight"]
        got = hashlib.sha256(bf16_bytes(weight)).hexdigest()
        if got == want:
            equal += 1
        else:
            failures += 1
            print(f"  FAIL {module}: compressed-tensors dequantizes to {got[:16]}..., sous to {want[:16]}...")
    print(f"compressed-tensors decompression equals sous's dequantization (bf16 bytes): "
          f"{equal} of {len(by_module)} layers")

    # 4. transformers loads the checkpoint (through compressed-tensors) and computes
    #    exactly what it computes with llm-compressor's.
    if args.compare_with:
        os.environ.setdefault("TQDM_DISABLE", "1")
        from transformers import AutoModelForCausalLM

        prompt = torch.tensor([[1, 504, 3, 9, 77, 1000, 42, 2]])
        logits = {}
        for label, directory in (("sous", args.sous_out), ("llm-compressor", args.compare_with)):
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
            with torch.no_grad():
                logits[label] = model(prompt).logits
        same = torch.equal(logits["sous"], logits["llm-compressor"])
        print(f"transformers {__import__('transformers').__version__} loads the sous checkpoint; logits on "
              f"{prompt.shape[1]} tokens {'identical to' if same else 'DIFFERENT from'} llm-compressor's checkpoint's")
        failures += 0 if same else 1
    if not by_module:
        print("FAIL: the summary has no dequantized digests (run sous quantize with --json --digests)")
        failures += 1
    print("OK" if failures == 0 else f"FAILED: {failures} problems")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("reference")
    ref.add_argument("model")
    ref.add_argument("fixture")
    ref.add_argument("--work")
    mo = sub.add_parser("modelopt")
    mo.add_argument("model")
    mo.add_argument("fixture")
    mo.add_argument("--work")
    chk = sub.add_parser("check")
    chk.add_argument("fixture")
    chk.add_argument("sous_out")
    chk.add_argument("summary")
    chk.add_argument("--compare-with")
    args = parser.parse_args()
    if args.command == "reference":
        return reference(args) or 0
    if args.command == "modelopt":
        return modelopt(args) or 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
