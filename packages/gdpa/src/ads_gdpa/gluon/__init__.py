"""Gluon (``triton.experimental.gluon``) GDPA kernels for Hopper: ``fwd_sm90`` and ``bwd_sm90``.

Importing this package imports no kernel: ``ads_gdpa.dispatch`` decides from its support tables
whether a call runs here and imports the kernel module for the GPU's architecture then.
"""
