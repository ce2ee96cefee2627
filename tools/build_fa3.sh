#!/usr/bin/env bash
# Build FlashAttention-3 (upstream `hopper/`) for sm90 from a pinned commit, restricted to what apex3 runs:
# head dim 128, bf16, varlen and fixed-length, causal, forward and backward. Everything else is switched off with the
# upstream FLASH_ATTENTION_DISABLE_* switches, which leaves four translation units instead of hundreds.
#
# usage: bash tools/build_fa3.sh [SRC]
#   SRC  a copy of the pinned commit's source (a directory or a .tar.gz holding `flash-attention/`, with
#        csrc/cutlass/include from the submodule's pinned commit); without it the pinned commits are cloned.
# The build lands in $FA3_DIR (default .fa3/ in the repo, git-ignored); it prints the PYTHONPATH that makes
# `import flash_attn_interface` work. A second run continues where a first one stopped (ninja keeps its objects).
set -euo pipefail
FA3_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced       # Dao-AILab/flash-attention, 2026-08-15
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671   # its csrc/cutlass submodule at that commit
FA3_DIR=${FA3_DIR:-$(pwd)/.fa3}
src=$FA3_DIR/flash-attention
mkdir -p "$FA3_DIR"

if [ ! -f "$src/hopper/setup.py" ]; then
    if [ -z "${1:-}" ]; then
        git clone -q https://github.com/Dao-AILab/flash-attention "$src"
        git -C "$src" checkout -q "$FA3_COMMIT"
        git -C "$src" submodule update --init csrc/cutlass
        git -C "$src/csrc/cutlass" checkout -q "$CUTLASS_COMMIT"
    elif [ -d "$1" ]; then cp -r "$1" "$src"
    else tar xzf "$1" -C "$FA3_DIR"
    fi
fi
[ -d "$src/csrc/cutlass/include/cute" ] || { echo "build_fa3: $src/csrc/cutlass/include is missing"; exit 2; }
[ -f "$src/README.md" ] || echo "FlashAttention" > "$src/README.md"   # hopper/setup.py reads it as its long description

# Only hdim 128, bf16, sm90; no split-KV, paged KV, append-KV, local windows, softcap, pack-GQA, FP8/FP16, sm80.
for f in FP16 FP8 HDIM64 HDIM96 HDIM192 HDIM256 HDIMDIFF64 HDIMDIFF192 SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP \
         PACKGQA SM80; do
    export FLASH_ATTENTION_DISABLE_$f=TRUE
done
export FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-4} NVCC_THREADS=${NVCC_THREADS:-4}
cd "$src/hopper"
start=$(date +%s)
python3 setup.py build_ext --inplace 2>&1 | grep -vE '^\s*$|ptxas info|bytes stack frame|Used [0-9]+ registers|Compiling entry' || true
ls flash_attn_3/_C*.so >/dev/null 2>&1 || { echo "build_fa3: no flash_attn_3/_C*.so was built"; exit 1; }
echo "$FA3_COMMIT" > flash_attn_3/BUILD_COMMIT
echo "build_fa3: built in $(( $(date +%s) - start )) s: export PYTHONPATH=$src/hopper:\$PYTHONPATH"
