#!/usr/bin/env bash
# Everything vggserve needs on a fresh Linux machine, in one go:
#   - an OpenCL driver for the CPU when no working OpenCL device exists yet (Debian/Ubuntu's PoCL; the PoCL wheel
#     on PyPI is built with LLVM 14, which cannot compile for recent CPUs such as AMD Zen 5);
#   - the NVIDIA OpenCL ICD registration when the NVIDIA driver is present but not registered;
#   - vggserve itself (editable) with the extras given as $1 (default: dev = tests, MPICH, h5py, schemathesis).
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${1:-dev}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

if [ -e /usr/local/nvidia/lib64/libnvidia-opencl.so.1 ] && ! grep -qs nvidia /etc/OpenCL/vendors/*.icd; then
  $SUDO mkdir -p /etc/OpenCL/vendors
  echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 | $SUDO tee /etc/OpenCL/vendors/nvidia.icd >/dev/null
fi
if ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  echo "install.sh: no OpenCL driver registered: installing PoCL (pocl-opencl-icd) for the CPU" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq pocl-opencl-icd >/dev/null
fi
if [[ ",$EXTRAS," == *",dev,"* ]] && command -v apt-get >/dev/null \
   && { ! command -v chromium >/dev/null || ! command -v nginx >/dev/null; }; then
  echo "install.sh: installing Chromium and nginx for the tests of /docs in a browser and of deploy/nginx.conf" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium nginx-light >/dev/null
fi
python3 -m pip install -q --upgrade pip
python3 -m pip install -q -e ".[$EXTRAS]"
python3 -m pip uninstall -y -q pocl-binary-distribution 2>/dev/null || true
python3 -m vggserve devices
