#!/usr/bin/env bash
# Fills the git-ignored .whl/ with the tools gpu_run.sh puts on PATH on the GPU machine, copied from this machine:
#   .whl/bin/py-spy      py-spy's static binary (serve_saturation.py --gil), from PATH or .venv/bin
#   .whl/nginx/nginx     a wrapper running nginx.bin with the libraries it links (lib/), for scaling.py's nginx rows
# Then: run(command="bash benchmarks/gpu_run.sh ...", carry=[".whl"]).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl/bin .whl/nginx/lib
spy=$(command -v py-spy || echo .venv/bin/py-spy)
if [ -x "$spy" ]; then cp "$spy" .whl/bin/py-spy; else echo "carry_tools: no py-spy (pip install py-spy)" >&2; fi
nginx=$(command -v nginx || echo /usr/sbin/nginx)
if [ -x "$nginx" ]; then
  cp "$nginx" .whl/nginx/nginx.bin
  ldd "$nginx" | awk '/=> \// {print $3}' | grep -v -E '/libc\.so|/ld-linux' | xargs -r -I{} cp -L {} .whl/nginx/lib/
  cat > .whl/nginx/nginx <<'SH'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/nginx.bin" "$@"
SH
  chmod +x .whl/nginx/nginx
  .whl/nginx/nginx -v
else
  echo "carry_tools: no nginx (apt-get install nginx-light)" >&2
fi
du -sh .whl
