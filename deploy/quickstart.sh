#!/usr/bin/env bash
# The main job on a fresh machine: install what classifying needs (the package in .venv, an OpenCL driver; not the
# test extras: `bash deploy/install.sh` adds those), make deterministic random weights (published weights need
# network: `vggserve weights fetch`), classify the sample images on the best OpenCL device (a GPU, else the CPU via
# PoCL).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install.sh ""  # "": no extras
WEIGHTS=${VGGSERVE_WEIGHTS:-weights/vgg16-random-seed0.safetensors}
[ -f "$WEIGHTS" ] || .venv/bin/python -m vggserve weights init --seed 0 --output "$WEIGHTS"
.venv/bin/python -m vggserve classify --weights "$WEIGHTS" --top-k 3 examples/images/*
