"""A workspace described by a configuration file (``agentvfs mcp --config``)."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from typing import Any

from .sandbox import LocalSandbox
from .vfs import CompositeFilesystem, FsspecFilesystem, LocalFilesystem, WorkspaceFilesystem
from .workspace import Workspace

__all__ = ["apply_environment", "load_config", "workspace_from_config"]

_CONFIG_KEYS = frozenset(
    {
        "root", "url", "read_only", "storage_options", "tools", "name", "sandbox", "bm25", "auto_index_paths",
        "index_dir", "absolute_paths", "env", "env_file",
    }
)
_SANDBOX_KEYS = frozenset({"working_directory", "isolation", "allow_network", "env"})


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a server configuration file: TOML when it ends in ``.toml``, JSON otherwise.

    Keys: ``root`` (a local directory) or ``url`` (an fsspec URL), ``read_only``,
    ``storage_options`` (for ``url``), ``tools`` (the tools config, e.g.
    ``{"mastra_workspace_delete": {"require_approval": true}}``), ``name``, ``sandbox``
    (``{"working_directory", "isolation", "allow_network", "env"}``: adds the command tools; a
    ``url`` is FUSE-mounted into it at ``/workspace``), and search: ``bm25``,
    ``auto_index_paths``, ``index_dir``. A relative ``root`` is taken relative to the file's
    directory. ``env_file`` (a file of ``KEY=VALUE`` lines, relative to the configuration's
    directory) and ``env`` (an object) set the server's environment first
    (:func:`apply_environment`): credentials for storage clients. ``absolute_paths`` (with
    ``root``): ``"workspace"`` (the default here, as for a ``url``) takes ``/notes.txt`` from
    the workspace root, ``"host"`` as a host path (``LocalFilesystem``'s default).

    Raises
    ------
    ValueError
        The file is not valid JSON/TOML, not an object, or has an unknown key.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        if os.fspath(path).endswith(".toml"):
            config: Any = tomllib.loads(raw.decode("utf-8"))
        else:
            config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{os.fspath(path)}: invalid configuration: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{os.fspath(path)}: the configuration must be an object")
    unknown = sorted(set(config) - _CONFIG_KEYS)
    if unknown:
        raise ValueError(f"{os.fspath(path)}: unknown configuration key(s): {', '.join(unknown)} (expected: {', '.join(sorted(_CONFIG_KEYS))})")
    here = os.path.dirname(os.path.abspath(path))
    for key in ("root", "env_file"):
        value = config.get(key)
        if isinstance(value, str):
            config[key] = os.path.join(here, os.path.expanduser(value))
    return config


def apply_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """Put the configuration's ``env_file`` (``KEY=VALUE`` lines; ``#`` comments, ``export``
    and quotes allowed) and then ``env`` (an object) into this process's environment, where
    storage clients read credentials (``AWS_ACCESS_KEY_ID``, ``GOOGLE_APPLICATION_CREDENTIALS``,
    ...). An MCP client starts the server with a bare environment; this is how credentials
    reach it without being written into the client's configuration. Returns what was set.

    Raises
    ------
    ValueError
        ``env`` is not an object of strings, or a line of ``env_file`` is not ``KEY=VALUE``.
    OSError
        ``env_file`` cannot be read.
    """
    found: dict[str, str] = {}
    env_file = config.get("env_file")
    if env_file is not None:
        with open(os.path.expanduser(str(env_file)), encoding="utf-8") as handle:
            for number, raw in enumerate(handle, 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                line = line.removeprefix("export ").strip()
                key, sep, value = line.partition("=")
                key, value = key.strip(), value.strip()
                if not sep or not key.replace("_", "").isalnum():
                    raise ValueError(f"{env_file}:{number}: expected KEY=VALUE, got {line[:40]!r}")
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                    value = value[1:-1]
                found[key] = value
    env = config.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must be an object of strings")
    found.update(env)
    os.environ.update(found)
    return found


def workspace_from_config(config: Mapping[str, Any]) -> Workspace:
    """Build the (not yet initialised) workspace a configuration describes.

    Raises
    ------
    ValueError
        Neither or both of ``root`` and ``url`` are given, or a value has the wrong type.
    """
    root, url = config.get("root"), config.get("url")
    if (root is None) == (url is None):
        raise ValueError("give exactly one of root (a local directory) or url (an fsspec URL)")
    read_only = config.get("read_only", False)
    if not isinstance(read_only, bool):
        raise ValueError(f"read_only must be true or false, got {read_only!r}")
    options = config.get("storage_options") or {}
    if not isinstance(options, dict):
        raise ValueError("storage_options must be an object")
    tools = config.get("tools")
    if tools is not None and not isinstance(tools, dict):
        raise ValueError("tools must be an object")
    fs: WorkspaceFilesystem
    if root is not None:
        if options:
            raise ValueError("storage_options apply to url, not to root")
        absolute = config.get("absolute_paths", "workspace")
        if absolute not in ("host", "workspace"):
            raise ValueError(f"absolute_paths must be \"host\" or \"workspace\", got {absolute!r}")
        fs = LocalFilesystem(os.path.expanduser(str(root)), read_only=read_only, absolute_paths=absolute)
    else:
        fs = FsspecFilesystem(str(url), storage_options=options, read_only=read_only)
    search: dict[str, Any] = {}
    if config.get("bm25") is not None:
        search["bm25"] = config["bm25"]
    if config.get("auto_index_paths") is not None:
        paths = config["auto_index_paths"]
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError("auto_index_paths must be a list of strings")
        search["auto_index_paths"] = paths
    if config.get("index_dir") is not None:
        search["index_dir"] = os.path.expanduser(str(config["index_dir"]))
    name = config.get("name") or "agentvfs-mcp"
    sandbox_config = config.get("sandbox")
    if sandbox_config is None:
        return Workspace(filesystem=fs, tools=tools, name=name, **search)
    if not isinstance(sandbox_config, dict):
        raise ValueError("sandbox must be an object")
    unknown = sorted(set(sandbox_config) - _SANDBOX_KEYS)
    if unknown:
        raise ValueError(f"sandbox: unknown key(s): {', '.join(unknown)} (expected: {', '.join(sorted(_SANDBOX_KEYS))})")
    workdir = sandbox_config.get("working_directory") or (str(root) if root is not None else None)
    sandbox = LocalSandbox(
        working_directory=os.path.expanduser(str(workdir)) if workdir else None,
        isolation=sandbox_config.get("isolation", "none"),
        native_sandbox={"allow_network": bool(sandbox_config.get("allow_network", False))},
        env=sandbox_config.get("env"),
    )
    if root is not None:
        # Commands run in the directory itself.
        return Workspace(filesystem=fs, sandbox=sandbox, tools=tools, name=name, **search)
    workspace = Workspace(mounts={"/workspace": fs}, sandbox=sandbox, tools=tools, name=name, **search)
    # The file tools take "notes.txt" for "workspace/notes.txt": the one mount is the default.
    if isinstance(workspace.filesystem, CompositeFilesystem):
        workspace.filesystem.default_mount = "/workspace"
    return workspace
