"""Adapters that put a workspace inside the agent frameworks people use.

Each adapter is a module of its own and imports its framework when it is imported, never
before, so ``import agentvfs`` and ``import agentvfs.integrations`` need none of them. Install
a framework with its extra:

========================================  =====================================
module                                    install
========================================  =====================================
:mod:`agentvfs.integrations.pydantic_ai`  ``pip install 'agentvfs[pydantic-ai]'``
:mod:`agentvfs.integrations.deepagents`   ``pip install 'agentvfs[deepagents]'``
:mod:`agentvfs.integrations.openai_agents` ``pip install 'agentvfs[openai-agents]'``
:mod:`agentvfs.integrations.claude`       ``pip install 'agentvfs[claude]'``
========================================  =====================================

``docs/integrations.md`` shows each one in an agent loop.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtraError

__all__ = ["require"]


def require(module: str, extra: str, adapter: str) -> ModuleType:
    """Import a framework for an adapter, or say which extra installs it.

    Parameters
    ----------
    module : str
        The framework's top-level module (``"deepagents"``).
    extra : str
        The agentvfs extra that installs it (``"deepagents"``).
    adapter : str
        The adapter module asking, for the message (``"agentvfs.integrations.deepagents"``).

    Returns
    -------
    module
        The imported framework module.

    Raises
    ------
    MissingExtraError
        When the framework, or a module it needs, is not installed; the message names the
        extra to install. Also a :class:`ModuleNotFoundError`.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtraError(adapter, extra, exc.name or module) from None
