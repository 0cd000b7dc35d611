"""swarm: decentralized reinforcement learning over ZeroMQ gossip.

Symmetric peers train their own copy of a model, exchange compressed parameter
deltas with their neighbours and share replay samples; a lightweight
coordinator handles membership and failover and is never on the data path.
"""

__version__ = "0.1.0"

__all__ = [
    "Peer", "SyncPeer", "Coordinator",
    "SwarmConfig", "PeerConfig", "CoordinatorConfig", "load_config",
    "SwarmError", "ConfigError", "WireError", "TransportError", "MembershipError",
    "PeerTimeout", "GossipError", "ReplayError",
]

# The module of each name above, imported when the name is first used. `import swarm`
# itself then imports nothing: the `swarm` script imports the package before its entry
# point (swarm/__main__.py) can catch a Ctrl-C, which in those milliseconds ended in a
# traceback; and `swarm coordinator` starts fast.
_WHERE = {
    "Peer": "peer", "SyncPeer": "peer", "Coordinator": "coordinator",
    "SwarmConfig": "config", "PeerConfig": "config", "CoordinatorConfig": "config", "load_config": "config",
    **{name: "errors" for name in __all__ if name.endswith("Error") or name == "PeerTimeout"},
}

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from .config import CoordinatorConfig, PeerConfig, SwarmConfig, load_config
    from .coordinator import Coordinator
    from .errors import (ConfigError, GossipError, MembershipError, PeerTimeout, ReplayError,
                         SwarmError, TransportError, WireError)
    from .peer import Peer, SyncPeer


#: the package's submodules: ``import swarm; swarm.errors.WireError`` works as it did
#: when this module imported ``errors`` and ``config`` itself
_SUBMODULES = frozenset({"buffer", "checks", "cli", "compress", "config", "coordinator", "errors",
                         "experiment", "gossip", "link", "peer", "rl", "tasks", "transport", "wire"})


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")   # the import binds it here too
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'swarm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value   # looked up here from now on
    return value


def __dir__() -> list:
    return sorted({*globals(), *__all__})
