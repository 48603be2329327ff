"""Test setup: the shared plugin (markers gpu/sm90/slow, fixture ``device``, interpreter patches)."""

import os

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]


def _patch_interpreter_index() -> None:
    """triton 3.6's interpreter turns scalar tensors into Python ints with ``int(ndarray)``, which
    NumPy >= 2.4 rejects for 1-element arrays (every runtime ``range`` bound in a kernel). Use
    ``.item()`` semantics instead. Interpreter only; remove once the tools plugin or Triton does it.
    """
    from triton.runtime import interpreter

    if getattr(interpreter, "_ads_gdpa_index_patch", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._ads_gdpa_index_patch = True


if os.environ.get("TRITON_INTERPRET", "0") == "1":
    _patch_interpreter_index()
