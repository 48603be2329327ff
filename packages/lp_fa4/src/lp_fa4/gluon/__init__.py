"""Hopper (sm_90) Gluon kernels of lp_fa4: ``fwd_sm90`` (the softmax forward) and ``dispatch`` (the
one support predicate that routes a forward call to it or to the portable Triton kernels)."""
