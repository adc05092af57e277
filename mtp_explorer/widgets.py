"""The JupyterLab widgets of mtp-explorer: :class:`Explorer` and its parts (see :mod:`mtp_explorer.ui`).

``register_view(figure, width="full" | "half")`` adds a live view to every Explorer made after it.
"""

from __future__ import annotations

from .ui import *  # noqa: F401,F403
from .ui import __all__  # noqa: F401
