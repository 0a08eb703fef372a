#!/bin/sh
# Entrypoint of the image built from deploy/Dockerfile.
#
#   docker run IMAGE [serve options]          the HTTP service on 0.0.0.0:$VGGSERVE_PORT (8000 unless set with -e;
#                                             serve options as for `vggserve serve`, a --port among them wins)
#   docker run IMAGE serve [options]          the same
#   docker run IMAGE batch|classify|devices|weights|calibrate|bench|tune|loadtest ...    that vggserve command
#   docker run IMAGE mpiexec -n 2 vggserve batch ...                          the MPI launcher (MPICH, in the image)
set -eu
case "${1:-}" in
    serve)
        shift
        exec vggserve serve --host 0.0.0.0 --port "${VGGSERVE_PORT:-8000}" "$@" ;;
    batch|classify|devices|weights|calibrate|bench|tune|loadtest|--version|--help|-h)
        exec vggserve "$@" ;;
    mpiexec|mpirun|vggserve|python|python3|sh|bash)
        exec "$@" ;;
    *)
        exec vggserve serve --host 0.0.0.0 --port "${VGGSERVE_PORT:-8000}" "$@" ;;
esac
