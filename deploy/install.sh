#!/usr/bin/env bash
# Everything vggserve needs on a fresh Linux machine, in one go:
#   - an OpenCL driver for the CPU when no working OpenCL device exists yet (Debian/Ubuntu's PoCL; the PoCL wheel
#     on PyPI is built with LLVM 14, which cannot compile for recent CPUs such as AMD Zen 5);
#   - the NVIDIA OpenCL ICD registration when the NVIDIA driver is present but not registered;
#   - a virtual environment, .venv in the repository, made by the python3 on PATH (with Debian/Ubuntu's
#     python3.X-venv package where that python3 lacks ensurepip), so a system Python that PEP 668 marks
#     externally managed (Debian 12's, Ubuntu's) is left alone. `source .venv/bin/activate` then puts its python3
#     and vggserve on PATH;
#   - vggserve itself (editable) in .venv, with the extras given as $1 (default: dev = tests, MPICH, h5py,
#     schemathesis, and Chromium, nginx and cjpeg from apt for the tests that need them; "" = the package alone).
# Safe to run again: a working .venv is reused.
set -euo pipefail

VENV=.venv  # in the repository root, where main runs

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {  # apt_install WHY PACKAGE...
  echo "install.sh: $1: installing ${*:2} with apt-get" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:2}" >/dev/null
}

opencl_driver() {
  if [ -e /usr/local/nvidia/lib64/libnvidia-opencl.so.1 ] && ! grep -qs nvidia /etc/OpenCL/vendors/*.icd; then
    as_root mkdir -p /etc/OpenCL/vendors
    echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 | as_root tee /etc/OpenCL/vendors/nvidia.icd >/dev/null
  fi
  if ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    apt_install "no OpenCL driver registered" pocl-opencl-icd
  fi
}

test_tools() {  # test_tools EXTRAS: Chromium, nginx and cjpeg, for the dev extras' tests of /docs,
                #   deploy/nginx.conf and the device JPEG decoder (JPEG kinds Pillow cannot write)
  if [[ ",$1," == *",dev,"* ]] && command -v apt-get >/dev/null \
     && { ! command -v chromium >/dev/null || ! command -v nginx >/dev/null || ! command -v cjpeg >/dev/null; }; then
    apt_install "the tests of /docs in a browser, of deploy/nginx.conf and of the device JPEG decoder need Chromium, \
nginx and cjpeg" chromium nginx-light libjpeg-turbo-progs
  fi
}

make_venv() {  # $VENV, made with the python3 on PATH where it is missing or broken
  if "$VENV/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    return
  fi
  if ! command -v python3 >/dev/null; then
    echo "install.sh: no python3 on PATH: install Python 3.10 or newer (apt-get install python3-venv), then run again" >&2
    return 1
  fi
  local python3
  python3=$(command -v python3)
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then  # Debian/Ubuntu keep these in python3.X-venv
    local package
    package="python$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
    if ! command -v apt-get >/dev/null; then
      echo "install.sh: $python3 cannot make a virtual environment (no ensurepip): install your distribution's" \
           "$package package, or put a python3 that has ensurepip first on PATH, then run again" >&2
      return 1
    fi
    apt_install "$python3 cannot make a virtual environment" "$package"
  fi
  echo "install.sh: making a virtual environment in $VENV with $python3" >&2
  python3 -m venv --clear "$VENV"
}

install_package() {  # install_package PYTHON EXTRAS
  local spec=.
  [ -z "$2" ] || spec=".[$2]"
  "$1" -m pip install -q --upgrade pip
  "$1" -m pip install -q -e "$spec"
  "$1" -m pip uninstall -y -q pocl-binary-distribution 2>/dev/null || true
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  local extras=${1-dev}
  opencl_driver
  test_tools "$extras"
  make_venv
  install_package "$VENV/bin/python" "$extras"
  "$VENV/bin/python" -m vggserve devices
  echo "install.sh: vggserve is installed in $VENV; \`source $VENV/bin/activate\` puts its python3 and vggserve on PATH" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced (the tests source it to call one step)
  main "$@"
fi
