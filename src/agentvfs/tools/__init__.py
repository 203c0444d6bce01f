"""Agent tools over a workspace.

The helpers the tools are built from (output limits counted with tiktoken's offline
``cl100k_base`` encoding, line ranges, literal replacement, globs) live in private modules;
the tools themselves are exposed here as they land.
"""

__all__: list[str] = []
