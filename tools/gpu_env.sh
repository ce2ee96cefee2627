# Sourced by the tools/gpu_*.sh scripts on the GPU machine: the wheels its image lacks (nbdev and its pure-Python
# deps, torchao, liger-kernel) go into /tmp/site, the package is imported from the working tree, and the commit the
# records will carry is checked (the copy there has no .git: the caller passes APEX3_GIT_COMMIT=<git rev-parse HEAD>).
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then   # NO_WHEELS=1: a dry run here
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# FlashAttention-3 where tools/build_fa3.sh built it (`--attn fa3`; without it the run falls back, with a warning)
fa3=${FA3_DIR:-$PWD/.fa3}/flash-attention/hopper
[ -d "$fa3/flash_attn_3" ] && export PYTHONPATH=$PYTHONPATH:$fa3
if [ -n "${APEX3_GIT_COMMIT:-}" ]; then
  [[ $APEX3_GIT_COMMIT =~ ^[0-9a-f]{40}$ ]] || { echo "APEX3_GIT_COMMIT=$APEX3_GIT_COMMIT is not a full commit hash (git rev-parse HEAD)" >&2; exit 2; }
elif ! git rev-parse HEAD >/dev/null 2>&1; then
  echo "no .git here: pass the commit the records will carry, APEX3_GIT_COMMIT=<git rev-parse HEAD>" >&2; exit 2
fi
