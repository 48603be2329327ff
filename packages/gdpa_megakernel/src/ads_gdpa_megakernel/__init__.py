"""ads_gdpa_megakernel: GDPA fused with a Q LayerNorm, residual adds and an RMSNorm over all heads.

What is fused in 0.1 (three kernels per direction, around ads-gdpa's attention):

* forward: a Triton prologue (LayerNorm of each token's H·D features, fp32 Chan statistics, the
  normalised q written in q's dtype, mean/rstd saved), ads-gdpa's ``gdpa_varlen`` kernels, and one
  Triton epilogue per token (+ q, RMSNorm over H·D, + residual; rrms saved). The intermediate
  sums y = a + q and z = RMSNorm(y) are never written.
* backward: one Triton kernel for the RMSNorm backward (dy, deterministic d rms weight partials),
  ads-gdpa's backward for dq/dk/dv, and one for the LayerNorm backward that adds the q-residual
  branch's gradient on the fly (deterministic d weight / d bias partials).

The full single-kernel fusion needs two extension points in ads-gdpa's Gluon forward (sm90):
an **epilogue hook** that receives each head's output tile before it is stored, so one program
per query tile can walk the H heads and stage their outputs in shared memory (64 rows x H·D = 512
bf16 features = 64 KB at the production H=4, D=128), then apply + q, the RMSNorm over H·D and
+ residual before a single store; and a **prologue hook** in the Q load path that normalises
each loaded query tile with per-token LayerNorm statistics computed before the first GEMM (one
extra pass over the tile's H·D features, or the stats from a tiny pre-pass). With both, the Q
LayerNorm output, the attention output and the epilogue's reads disappear from HBM; the backward
then needs the matching dO hook (the RMSNorm backward produces dO per query tile) in ads-gdpa's
backward. ``BENCHMARKS.md`` estimates the traffic of each stage.

>>> from ads_gdpa_megakernel import gdpa_megakernel, GDPABlock  # doctest: +SKIP
"""

from .__about__ import __version__
from .interface import HEAD_DIMS, gdpa_megakernel
from .modules import GDPABlock

__all__ = ["GDPABlock", "HEAD_DIMS", "gdpa_megakernel", "__version__"]
