"""VGG16 on pruned weights: the dense engine with each layer's kernel chosen from its measured sparsity.

    model = PrunedVGG16.load("vgg16-pruned90.safetensors", device="auto", max_batch_size=16)
    model.kernel_choices   # [(layer name, sparse_select.Choice), ...]: which kernel each layer got and why

At load, every conv and fully connected layer's weights are counted (fraction of exact zeros) and
`sparse_select.choose` picks dense or one of the sparse kernels (vggserve/ops/sparse_conv.py, sparse_fc.py) from
the tuned speed-up curves; no flag. Everything else (staging, submit, pooling, softmax) is VGG16's. The layers are
built dense first and the chosen ones replaced (their dense weights freed): an interim arrangement until the
engine's algorithm registry takes the sparse kernels as entries.
"""

import numpy as np

from ..ops import sparse_conv as sc
from ..ops.sparse_fc import SparseFc, default_params as fc_params
from ..ops.sparse_select import DENSE, choose, sparse_table
from ..runtime.params import shape_key
from ..weights.spec import INPUT_SIZE
from .vgg16 import VGG16


def measured(weight: np.ndarray) -> tuple[float, int]:
    """(fraction of zero weights, non-zero count)."""
    nnz = int(np.count_nonzero(weight))
    return 1.0 - nnz / max(weight.size, 1), nnz


class PrunedVGG16(VGG16):
    def _upload(self, tensors: dict):
        super()._upload(tensors)
        kind = self.device_info.kind
        table = sparse_table(self.params, kind)
        params = self.params.get("sparse_params", {})
        batch = self.max_batch_size
        self.kernel_choices = []
        workspace = None
        size = INPUT_SIZE
        for i, (c, layer) in enumerate(self.convs):
            weight = tensors[f"{c.name}.weight"]
            choice = choose(table, "conv", shape_key(c.cin, c.cout, size), batch, *measured(weight))
            self.kernel_choices.append((c.name, choice))
            if choice.algo != DENSE:
                p = {**sc.default_params(kind, choice.algo), **params.get(choice.algo, {})}
                if workspace is None:
                    workspace = sc.PadWorkspace(self.context, self.program_cache, p["PAD_WG"])
                self.convs[i] = (c, sc.sparse_conv(self.context, self.program_cache, p, weight,
                                                   tensors[f"{c.name}.bias"], max_batch=batch, max_h=size,
                                                   max_w=size, workspace=workspace))
            size //= 2 if c.pool_after else 1
        for i, (f, gemm, gemv, split) in enumerate(self.fcs):
            weight = tensors[f"{f.name}.weight"]
            choice = choose(table, "fc", shape_key(f.fin, f.fout, 1), batch, *measured(weight))
            self.kernel_choices.append((f.name, choice))
            if choice.algo != DENSE:
                p = {**fc_params(kind), **params.get(choice.algo, {})}
                layer = SparseFc(self.context, self.program_cache, p, weight, tensors[f"{f.name}.bias"],
                                 relu=int(f.relu), max_batch=batch)
                self.fcs[i] = (f, layer, layer, None)  # the forward pass calls it as its GEMV and its GEMM
        self.queue.finish()
