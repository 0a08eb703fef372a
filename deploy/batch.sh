#!/usr/bin/env bash
# Run `vggserve batch` over every GPU of this machine (or of the machines in a hostfile) with mpirun.
#
#   deploy/batch.sh [-n RANKS] [--hostfile FILE] [--dry-run] [--] BATCH ARGUMENTS...
#   deploy/batch.sh --weights vgg16.safetensors --input photos/ --output results.jsonl
#
# Defaults: RANKS = the GPUs nvidia-smi lists here (1 when there is none), or the slots of --hostfile;
# unless you pass --device: `--device gpu` (rank with local rank L uses GPU L) where nvidia-smi found GPUs or a
# hostfile names the machines, else `--device auto` (a GPU OpenCL finds, else the CPU); Open MPI gets `--bind-to none`
# (decode threads and the GPU driver need more than one core per rank) and, as root, --allow-run-as-root.
# Every other argument goes to `vggserve batch` unchanged (see `vggserve batch --help`, docs/batch.md).
#
# Environment: MPIRUN (launcher, default mpirun, else mpiexec), PYTHON (default python3),
# MPIRUN_ARGS (extra launcher arguments, word-split), VGGSERVE_* (forwarded to every rank).
set -euo pipefail

die() { echo "batch.sh: $*" >&2; exit 2; }
# an option of this script given without its value (the last argument): one usage line, not `$2: unbound variable`
usage="usage: deploy/batch.sh [-n RANKS] [--hostfile FILE] [--dry-run] [--] BATCH ARGS..."
missing() { die "$1 needs a value ($2); $usage"; }

ranks=""
hostfile=""
dry_run=0
batch_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--ranks) [[ $# -ge 2 ]] || missing "$1" "the number of ranks, e.g. $1 4"; ranks="$2"; shift 2 ;;
        --hostfile) [[ $# -ge 2 ]] || missing "$1" "a hostfile, e.g. $1 hosts"; hostfile="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --) shift; batch_args+=("$@"); break ;;
        *) batch_args+=("$1"); shift ;;
    esac
done

launcher="${MPIRUN:-}"
if [[ -z "$launcher" ]]; then
    if command -v mpirun >/dev/null 2>&1; then launcher=mpirun
    elif command -v mpiexec >/dev/null 2>&1; then launcher=mpiexec
    else die "neither mpirun nor mpiexec found (install Open MPI, or: pip install mpich)"; fi
fi
python="${PYTHON:-python3}"

if [[ -n "$hostfile" && ! -r "$hostfile" ]]; then die "cannot read hostfile $hostfile"; fi
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [[ -z "$ranks" ]]; then
    if [[ -n "$hostfile" ]]; then
        # sum of slots=N (Open MPI) or host:N (MPICH) per non-comment line; a bare host name counts 1
        ranks=$(awk '!/^[[:space:]]*(#|$)/ { n = 1
                 if (match($0, /slots=[0-9]+/)) n = substr($0, RSTART + 6, RLENGTH - 6)
                 else if (match($1, /:[0-9]+$/)) n = substr($1, RSTART + 1)
                 total += n } END { print total + 0 }' "$hostfile")
    else
        ranks=$gpus
    fi
    [[ -n "$ranks" && "$ranks" -gt 0 ]] || ranks=1
fi
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || die "-n needs a positive number of ranks, got '$ranks'"

has_device=0
for arg in "${batch_args[@]+"${batch_args[@]}"}"; do
    [[ "$arg" == --device || "$arg" == --device=* ]] && has_device=1
done
if [[ $has_device -eq 0 ]]; then
    if [[ "$gpus" -gt 0 || -n "$hostfile" ]]; then
        batch_args+=(--device gpu)
    else
        echo "batch.sh: nvidia-smi found no GPU here: --device auto (an OpenCL GPU if there is one, else the CPU)" >&2
        batch_args+=(--device auto)
    fi
fi

command=("$launcher" -n "$ranks")
if "$launcher" --version 2>&1 | grep -qiE 'open mpi|openrte'; then
    command+=(--bind-to none)
    [[ "$(id -u)" -eq 0 ]] && command+=(--allow-run-as-root)
    [[ -n "$hostfile" ]] && command+=(--hostfile "$hostfile")
    # Open MPI does not forward the environment to other machines unless asked
    for name in PATH LD_LIBRARY_PATH PYTHONPATH $(compgen -e | grep '^VGGSERVE_' || true); do
        [[ -n "${!name:-}" ]] && command+=(-x "$name")
    done
else
    [[ -n "$hostfile" ]] && command+=(-f "$hostfile")  # MPICH (Hydra) forwards the environment itself
fi
# shellcheck disable=SC2206  # MPIRUN_ARGS is meant to be word-split
[[ -n "${MPIRUN_ARGS:-}" ]] && command+=(${MPIRUN_ARGS})
command+=("$python" -m vggserve batch "${batch_args[@]+"${batch_args[@]}"}")

echo "batch.sh: ${command[*]}" >&2
[[ $dry_run -eq 1 ]] && exit 0
exec "${command[@]}"
