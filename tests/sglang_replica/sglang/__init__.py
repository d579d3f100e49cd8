"""A replica of SGLang 0.5.23's wire protocol and process tree, for profkit's CPU tests (see ../README.md).

Not SGLang: it has SGLang's name so that `python -m sglang.launch_server` starts it from a Python
whose sys.path has tests/sglang_replica first (what profkit's --server-python points at).
"""

__version__ = "0.5.23"
