"""Triton kernels (``_rownorm``, ``_rms_gemm``) and their host-side launchers (``launch``)."""
