"""Gluon (sm_90) kernels: ``fwd_sm90`` (the ``linear_*norm`` forward with the row block in shared
memory) and ``dispatch`` (which calls it takes)."""
