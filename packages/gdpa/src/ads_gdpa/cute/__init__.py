"""CuTe DSL kernels for Hopper (optional: ``pip install ads-gdpa[cute]``); nothing here is imported
unless a call goes to the CuTe backend."""
