pytest_plugins = ["ads_kernel_tools.pytest_plugin", "pytester"]
