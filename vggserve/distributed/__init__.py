"""Several devices at once over MPI (mpi4py): the `vggserve batch` job and batch sharding for the service.

Modules:
    job         run_batch(BatchOptions): the mpirun batch job (docs/batch.md)
    workqueue   dynamic chunk sharing: chunk sizes, the worker loop every rank runs, the MPI messages
    coordinator rank 0: deals chunks and answers reports on the main thread while its own chunks run on another
    pipeline    one rank's decode-ahead classification of chunks
    store       results.jsonl / <stem>.errors.jsonl: kill-safe appends, resume, torn-line repair
    inputs      --input as a directory, a list file or one image
    devices     --device spec -> this rank's device, by local rank
    binding     load_rank_model: every rank loads its model; all agree on failure
    sharding    ShardedModel / worker_loop / run_sharded: one batch scattered over the ranks (HTTP service)
    mpi         local rank, sleeping waits, aborting every rank
    cores       a rank's share of its host (HostShare: sizes its decode processes or threads and copy threads)
    stopping    SIGTERM and Ctrl-C end the job cleanly, saying how far it got
    summary     the final summary

Nothing here imports mpi4py at import time; MPI starts when a function first needs it.
"""
