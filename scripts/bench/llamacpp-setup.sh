#!/usr/bin/env bash
# Sets up the llama.cpp peer for scripts/bench/native.sh, all of it under target/:
#
#   target/bench-py/                  venv: llama-cpp-python[server] (pinned), gguf, cmake, ninja
#   target/cache/llamacpp/            the llama-cpp-python sdist from PyPI (SHA-256 pinned), unpacked
#   target/llamacpp/build/            llama.cpp (the copy vendored in that sdist), built for this CPU
#                                     (-DGGML_NATIVE=ON): shared libraries and the llama-server,
#                                     llama-perplexity, llama-bench and llama-quantize binaries
#   target/llamacpp/gguf/             SmolLM2-135M-Instruct-{F32,BF16}.gguf, converted from the
#                                     imported safetensors directory target/models/... (the
#                                     model sous serves), with the sdist's convert_hf_to_gguf.py;
#                                     SmolLM2-135M-Instruct-{Q4_0,Q4_1}.gguf, quantized from the
#                                     F32 GGUF with llama-quantize (4-bit peers of sous's NVFP4)
#
# The C++ is compiled once: the Python package is installed with LLAMA_BUILD=OFF and
# llama.cpp's shared libraries from target/llamacpp/build are copied into it, so
# `python -m llama_cpp.server` and `llama-server` run the very same build.
#
# Idempotent: each step is skipped when its output exists and the inputs it was made from
# (recorded in a stamp file next to it) have not changed. Prints the paths it set up, as
# shell assignments, on stdout (LLAMA_SERVER=..., LLAMACPP_PYTHON=..., GGUF_F32=..., GGUF_BF16=...,
# GGUF_Q4_0=..., GGUF_Q4_1=...).
#
# convert_hf_to_gguf.py imports torch (the whole script, even for a plain Llama). torch is
# not installed into target/bench-py (gigabytes of CUDA wheels); CONVERT_PYTHON must name a
# Python that has torch, numpy, safetensors and transformers, e.g. the venv of
# scripts/reference/requirements.txt. It is only used for the conversion step, with the
# sdist's own gguf-py first on PYTHONPATH.
#
# AMX: on a CPU with AMX, -DGGML_NATIVE=ON builds llama.cpp's AMX kernels, which take
# over Q4_0/Q4_1/Q8_0 products. On one of this project's Sapphire-Rapids-class virtual
# machines (2026-12-02) they stopped llama-server with SIGILL at `tilezero` on its first
# Q4_0 product, though a plain AMX program ran there. So the 4-bit GGUF is tried once
# with llama-bench after the build; if it dies of SIGILL the script says so and stops,
# and GGML_AMX=off builds llama.cpp without AMX (its AVX512-VNNI kernels then do the
# 4-bit products), which native.sh passes through.
#
# Environment: PYTHON (to make the venv, default python3), CONVERT_PYTHON (see above),
# MODEL_DIR (default target/models/HuggingFaceTB/SmolLM2-135M-Instruct; made by
# scripts/fetch-test-model.sh), JOBS (parallel compile jobs, default nproc), GGML_AMX
# (on, the default, or off; see above), GGML_ISA (native, the default, or avx2: a second
# build in target/llamacpp/build-avx2 with AVX2, FMA and F16C and nothing wider, as on a
# CPU without AVX-512, for comparisons on that instruction set; the Python package keeps
# the native build's libraries).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

VERSION="0.3.36"
SDIST="llama_cpp_python-$VERSION.tar.gz"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
REQS="$ROOT/scripts/bench/requirements-llamacpp.txt"
PYTHON="${PYTHON:-python3}"
MODEL_DIR="${MODEL_DIR:-$ROOT/target/models/HuggingFaceTB/SmolLM2-135M-Instruct}"
JOBS="${JOBS:-$(nproc)}"

VENV="$ROOT/target/bench-py"
CACHE="$ROOT/target/cache/llamacpp"
SRC="$CACHE/llama_cpp_python-$VERSION"
LLAMA_SRC="$SRC/vendor/llama.cpp"
GGML_ISA="${GGML_ISA:-native}"
case "$GGML_ISA" in
    native) BUILD="$ROOT/target/llamacpp/build" ;;
    avx2) BUILD="$ROOT/target/llamacpp/build-avx2" ;;
    *) echo "llamacpp-setup: GGML_ISA is native or avx2, not $GGML_ISA" >&2; exit 2 ;;
esac
GGUF_DIR="$ROOT/target/llamacpp/gguf"

# Flags for this machine's CPU. The UI, OpenSSL and curl are off: nothing here is fetched
# at build time and the server is only reached on the loopback.
CMAKE_FLAGS=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_CURL=OFF
)
if [[ "$GGML_ISA" == avx2 ]]; then
    CMAKE_FLAGS=("${CMAKE_FLAGS[@]/-DGGML_NATIVE=ON/-DGGML_NATIVE=OFF}"
                 -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF)
fi
TARGETS=(llama-server llama-perplexity llama-bench llama-quantize)
GGML_AMX="${GGML_AMX:-on}"
case "$GGML_AMX" in
    on) ;;
    # Explicit -mno-* flags win over what -march=native turns on, wherever they stand.
    off) CMAKE_FLAGS+=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                       -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16") ;;
    *) echo "llamacpp-setup: GGML_AMX is on or off, not $GGML_AMX" >&2; exit 2 ;;
esac

say() { printf 'llamacpp-setup: %s\n' "$*" >&2; }
die() { printf 'llamacpp-setup: error: %s\n' "$*" >&2; exit 1; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }
stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

mkdir -p "$CACHE" "$BUILD" "$GGUF_DIR"

# 1. The venv with pinned build tools and the server's Python dependencies.
venv_stamp="$(cat "$REQS" | sha256sum | cut -d' ' -f1)"
if stamp_ok "$VENV/.stamp" "$venv_stamp"; then
    say "venv up to date: $VENV"
else
    say "making the venv $VENV"
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQS"
    echo "$venv_stamp" > "$VENV/.stamp"
fi
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH" # cmake and ninja

# 2. The sdist, verified, unpacked.
if [[ -f "$CACHE/$SDIST" && "$(sha256 "$CACHE/$SDIST")" == "$SDIST_SHA256" ]]; then
    say "sdist cached: $CACHE/$SDIST"
else
    say "downloading llama-cpp-python==$VERSION (sdist) from PyPI"
    rm -f "$CACHE/$SDIST"
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        --dest "$CACHE" "llama-cpp-python==$VERSION"
    got="$(sha256 "$CACHE/$SDIST")"
    [[ "$got" == "$SDIST_SHA256" ]] || die "$SDIST has SHA-256 $got, expected $SDIST_SHA256"
    rm -rf "$SRC"
fi
if [[ ! -f "$SRC/.unpacked" ]]; then
    rm -rf "$SRC"
    tar -xzf "$CACHE/$SDIST" -C "$CACHE"
    touch "$SRC/.unpacked"
fi

# 3. llama.cpp, built for this CPU.
build_stamp="$(printf '%s\n' "$SDIST_SHA256" "${CMAKE_FLAGS[@]}" "${TARGETS[@]}" "$(grep -m1 'model name' /proc/cpuinfo)" | sha256sum | cut -d' ' -f1)"
if stamp_ok "$BUILD/.stamp" "$build_stamp" && [[ -x "$BUILD/bin/llama-server" ]]; then
    say "llama.cpp build up to date: $BUILD"
else
    say "building llama.cpp ($JOBS jobs; a few minutes on 2 cores)"
    start=$(date +%s)
    cmake -S "$LLAMA_SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" > "$BUILD/configure.log" 2>&1 \
        || { tail -30 "$BUILD/configure.log" >&2; die "cmake configure failed (log: $BUILD/configure.log)"; }
    cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" > "$BUILD/build.log" 2>&1 \
        || { tail -30 "$BUILD/build.log" >&2; die "build failed (log: $BUILD/build.log)"; }
    say "built llama.cpp in $(( $(date +%s) - start )) s"
    echo "$build_stamp" > "$BUILD/.stamp"
fi

# 4. llama-cpp-python from the same sdist, without compiling llama.cpp again: its shared
#    libraries are the ones just built.
pkg_stamp="$(printf '%s\n' "$build_stamp" "$VERSION" | sha256sum | cut -d' ' -f1)"
if [[ "$GGML_ISA" != native ]]; then
    say "llama-cpp-python left with the native build's libraries (GGML_ISA=$GGML_ISA)"
elif stamp_ok "$VENV/.llama_cpp.stamp" "$pkg_stamp" && "$PY" -c 'import llama_cpp' 2>/dev/null; then
    say "llama-cpp-python up to date"
else
    say "installing llama-cpp-python[server]==$VERSION from the sdist (LLAMA_BUILD=OFF)"
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip install --quiet --disable-pip-version-check \
        --no-deps --no-build-isolation --force-reinstall "$CACHE/$SDIST"
    lib="$("$PY" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib"))')"
    mkdir -p "$lib"
    cp -a "$BUILD"/bin/lib*.so* "$lib"/
    "$PY" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__)' >&2
    echo "$pkg_stamp" > "$VENV/.llama_cpp.stamp"
fi

# 5. The GGUF files of the imported model.
[[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/model.safetensors" ]] \
    || die "no model at $MODEL_DIR (run scripts/fetch-test-model.sh)"
model_sha="$(cat "$MODEL_DIR"/config.json "$MODEL_DIR"/tokenizer*.json "$MODEL_DIR"/model.safetensors | sha256sum | cut -d' ' -f1)"
for outtype in f32 bf16; do
    upper="$(echo "$outtype" | tr a-z A-Z)"
    out="$GGUF_DIR/SmolLM2-135M-Instruct-$upper.gguf"
    stamp="$out.stamp"
    want="$(printf '%s\n' "$model_sha" "$SDIST_SHA256" "$outtype" | sha256sum | cut -d' ' -f1)"
    if [[ -f "$out" ]] && stamp_ok "$stamp" "$want"; then
        say "GGUF up to date: $out"
        continue
    fi
    conv="${CONVERT_PYTHON:-}"
    if [[ -z "$conv" ]]; then
        if "$PY" -c 'import torch' 2>/dev/null; then conv="$PY"; else
            die "convert_hf_to_gguf.py needs torch: set CONVERT_PYTHON to a Python with torch, numpy, safetensors and transformers (e.g. a venv of scripts/reference/requirements.txt)"
        fi
    fi
    say "converting $MODEL_DIR to $upper GGUF with $conv"
    PYTHONPATH="$LLAMA_SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}" "$conv" "$LLAMA_SRC/convert_hf_to_gguf.py" \
        "$MODEL_DIR" --outtype "$outtype" --outfile "$out.partial" > "$out.log" 2>&1 \
        || { tail -30 "$out.log" >&2; die "conversion to $upper failed (log: $out.log)"; }
    mv "$out.partial" "$out"
    echo "$want" > "$stamp"
done

# 6. 4-bit GGUFs, quantized from the F32 GGUF (llama-quantize's default mixture for each
#    type: the bulk of the weights in that type, a few tensors kept wider).
f32_gguf="$GGUF_DIR/SmolLM2-135M-Instruct-F32.gguf"
for qtype in Q4_0 Q4_1; do
    out="$GGUF_DIR/SmolLM2-135M-Instruct-$qtype.gguf"
    stamp="$out.stamp"
    # The same source quantizes the same way whatever instructions it was built for.
    want="$(printf '%s\n' "$(cat "$f32_gguf.stamp")" "$SDIST_SHA256" "$qtype" | sha256sum | cut -d' ' -f1)"
    if [[ -f "$out" ]] && stamp_ok "$stamp" "$want"; then
        say "GGUF up to date: $out"
        continue
    fi
    say "quantizing $f32_gguf to $qtype"
    "$BUILD/bin/llama-quantize" "$f32_gguf" "$out.partial" "$qtype" "$JOBS" > "$out.log" 2>&1 \
        || { tail -30 "$out.log" >&2; die "quantization to $qtype failed (log: $out.log)"; }
    mv "$out.partial" "$out"
    echo "$want" > "$stamp"
done

# 7. With AMX built in on a CPU that has it: one 4-bit product, to find the SIGILL above
#    here rather than in the middle of a benchmark.
if [[ "$GGML_AMX" == on && "$GGML_ISA" == native ]] && grep -qw amx_int8 /proc/cpuinfo; then
    q4="$GGUF_DIR/SmolLM2-135M-Instruct-Q4_0.gguf"
    if ! stamp_ok "$BUILD/.amx-checked" "$build_stamp"; then
        say "trying llama.cpp's AMX kernels on $q4"
        status=0
        "$BUILD/bin/llama-bench" -m "$q4" -p 16 -n 0 -r 1 -t 1 > "$BUILD/amx-check.log" 2>&1 || status=$?
        if [[ "$status" -eq 132 ]]; then
            die "llama.cpp's AMX kernels died of SIGILL on this CPU (log: $BUILD/amx-check.log); run again with GGML_AMX=off"
        fi
        [[ "$status" -eq 0 ]] || die "llama-bench failed with status $status (log: $BUILD/amx-check.log)"
        echo "$build_stamp" > "$BUILD/.amx-checked"
    fi
fi

echo "LLAMACPP_PYTHON=$PY"
echo "LLAMA_SERVER=$BUILD/bin/llama-server"
echo "LLAMA_PERPLEXITY=$BUILD/bin/llama-perplexity"
echo "GGUF_F32=$GGUF_DIR/SmolLM2-135M-Instruct-F32.gguf"
echo "GGUF_BF16=$GGUF_DIR/SmolLM2-135M-Instruct-BF16.gguf"
echo "GGUF_Q4_0=$GGUF_DIR/SmolLM2-135M-Instruct-Q4_0.gguf"
echo "GGUF_Q4_1=$GGUF_DIR/SmolLM2-135M-Instruct-Q4_1.gguf"
