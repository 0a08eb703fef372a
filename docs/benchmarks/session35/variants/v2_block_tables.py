from pathlib import Path
import sys
p = Path(sys.argv[1]); s = p.read_text()
old_ck = "        if (ck && *k == 0) {\n            while (ci < JE_CKPTS && p >= ck_from + (ci + 1) * ck_step) {"
new_ck = ("        if (ck && *k == 0 && ci < JE_CKPTS && p >= ck_from + (ci + 1) * ck_step) {  /* a checkpoint is due */\n"
          "            while (ci < JE_CKPTS && p >= ck_from + (ci + 1) * ck_step) {")
assert old_ck in s; s = s.replace(old_ck, new_ck, 1)
old = """        if (*k == 0 || fresh) {  /* a new block (or the first symbol of this call): its component and tables */
            fresh = 0;
            c = (*u >= m->b1) + (*u >= m->b2);
            tdc = tab + (c == 0 ? m->dc0 : (c == 1 ? m->dc1 : m->dc2)) * JH_TAB;
            const int ac = c == 0 ? m->ac0 : (c == 1 ? m->ac1 : m->ac2);
            tac = tab + ac * JH_TAB;
            if (multi) mac = multi + ac * JE_MULTI_N;
            if (coef) {
"""
new = """        /* the block's component and tables, found at every step: a branch at each block start would split a warp
         * whose lanes start blocks at different steps */
        c = (*u >= m->b1) + (*u >= m->b2);
        tdc = tab + (c == 0 ? m->dc0 : (c == 1 ? m->dc1 : m->dc2)) * JH_TAB;
        const int ac = c == 0 ? m->ac0 : (c == 1 ? m->ac1 : m->ac2);
        tac = tab + ac * JH_TAB;
        if (multi) mac = multi + ac * JE_MULTI_N;
        if (coef && (*k == 0 || fresh)) {  /* a new block (or the first symbol of this call): where it goes */
            fresh = 0;
            {
"""
assert old in s; s = s.replace(old, new, 1)
p.write_text(s)
