# run from the repository root with .whl/v/lockstep_entropy.cl = 7af81d8's kernels/jpeg_entropy.cl patched with lockstep_entropy.patch
from pathlib import Path
import sys
src = Path('.whl/v/lockstep_entropy.cl').read_text()
def fn(s, start):
    i = s.index(start); return s[i:s.index("\n}\n", i) + 3]
src13 = src.replace("#define JE_MULTI 14", "#define JE_MULTI 13")
run = fn(src13, "inline void je_sync_run(")
runl = (run.replace("je_sync_run(", "je_sync_run_l(")
        .replace("__global const int *tab", "__local const int *tab")
        .replace("__global const je_multi_t *multi", "__local const je_multi_t *multi")
        .replace("__global const int *tdc = tab, *tac = tab;", "__local const int *tdc = tab, *tac = tab;")
        .replace("__global const je_multi_t *mac = multi;", "__local const je_multi_t *mac = multi;")
        .replace("__global const int *t = dc ? tdc : tac;", "__local const int *t = dc ? tdc : tac;")
        .replace("mac = multi + ac * JE_MULTI_N;", "mac = multi + (ac >> 1) * JE_MULTI_N;"))
assert runl.count("__local") == 5, runl.count("__local")
sym = fn(src13, "inline int je_symbol(").replace("je_symbol(", "je_symbol_l(").replace("__global const int *t", "__local const int *t")
runl = runl.replace("je_symbol(", "je_symbol_l(")
sync = fn(src13, "__kernel void jpeg_sync(")
load = """
    __local int lt[4 * JH_TAB];
    __local je_multi_t lm[2 * JE_MULTI_N];
    {
        const int j0 = min((int)(get_group_id(0) * get_local_size(0)), nchunks - 1);
        __global const int *s0 = meta + seg_at + chunk[j0 * JE_CHUNK_INTS] * JH_SEG;
        __global const int *c0 = meta + comp_at + (meta + img_at + s0[0] * JH_IMG)[2] * JH_COMP;
        const int ids[4] = {c0[4], c0[5], c0[JH_COMP + 4], c0[JH_COMP + 5]};
        for (int i = get_local_id(0); i < 4 * JH_TAB; i += get_local_size(0))
            lt[i] = meta[tab_at + ids[i / JH_TAB] * JH_TAB + i % JH_TAB];
        for (int i = get_local_id(0); i < 2 * JE_MULTI_N; i += get_local_size(0))
            lm[i] = multi[ids[1 + 2 * (i / JE_MULTI_N)] * JE_MULTI_N + i % JE_MULTI_N];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int j = get_global_id(0);"""
syncl = sync.replace("\n    const int j = get_global_id(0);", load, 1)
syncl = syncl.replace("je_mcu_init(&m, comp + im[2] * JH_COMP, im[1]);",
    "je_mcu_init(&m, comp + im[2] * JH_COMP, im[1]); m.dc0 = 0; m.ac0 = 1; m.dc1 = m.dc2 = 2; m.ac1 = m.ac2 = 3;")
syncl = syncl.replace("je_sync_run(data, s[2], tab,", "je_sync_run_l(data, s[2], lt,").replace("&d2, mt,", "&d2, lm,")
assert syncl.count("je_sync_run_l(") == 2 and syncl.count("lm,") == 2, (syncl.count("je_sync_run_l("), syncl.count("lm,"))
out = src13.replace(sync, "") + "\n" + sym + "\n" + runl + "\n" + syncl
Path('.whl/v/local13_entropy.cl').write_text(out)
Path('.whl/v/lockstep13_entropy.cl').write_text(src13)
