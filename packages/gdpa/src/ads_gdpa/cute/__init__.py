"""CuTe DSL kernels for Hopper (optional: ``pip install ads-gdpa[cute]``); nothing here is imported
unless the CuTe backend is selected."""
