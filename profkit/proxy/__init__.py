"""profkit's proxy engine: a small GLM-5.2-shaped serving engine (torch only, imported lazily).

Importing this package does not import torch; `profkit.proxy.config` is torch-free too. Start it
with `python -m profkit.proxy.server --help`.
"""

from .config import SWITCHES, SWITCH_HELP, parse_opts  # noqa: F401
