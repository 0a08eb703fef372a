# the rounds' states (exits, entries used, settled flags, statuses, reasons, checkpoints) and the pixels of a tree's
# device decoder on the test corpus and the hostile inputs, six chunkings, multi-symbol tables on and off, into an
# .npz: `python states.py TREE OUT.npz` for two trees, then compare the arrays (PoCL, session 35)
import sys, numpy as np
tree = sys.argv[1]; out = sys.argv[2]
sys.path.insert(0, tree); sys.path.insert(0, tree + '/tests')
import pyopencl as cl
from vggserve.runtime import devices as devs
from vggserve.decoding.device import JpegDecoder, prepare
import test_device_jpeg as t
import jpeg_corpus as corpus
dev = devs.cl_device(devs.resolve('cpu')); ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
datas = [d for _, d in corpus.pillow_corpus()[::2]] + t.round_cases(5) + [d for _, d in t.hostile_inputs() if prepare(d)]
res = {}
for cb, rounds, lb, ck in [(8, 3, 0, 1), (37, 4, None, 3), (128, 6, None, 3), (64, 5, 300, 7), (192, 20, None, 3), (96, 8, 0, 15)]:
    for multi in (True, False):
        dec = JpegDecoder(ctx, dev, chunk_bytes=cb, rounds=rounds, lookback=lb, checkpoints=ck, multi=multi)
        got = t.sync_states(dec, q, datas)
        ckp = t.checkpoints_of(dec, q, got[0].shape[0])
        key = f"{cb}-{rounds}-{lb}-{ck}-{multi}"
        for name, a in zip(("exits", "used", "settled", "ok", "reasons", "ckpts"), got + (ckp,)):
            res[key + name] = np.asarray(a if name != "reasons" else [str(x) for x in a])
        # the decoded pixels too
        pix, _ = t.decode_with(dec, q, datas)
        res[key + "pix"] = np.concatenate([x.ravel() for x in pix])
np.savez(out, **res)
print(len(datas), 'files', len(res), 'arrays')
