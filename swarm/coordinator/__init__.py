"""Membership and failover: join/heartbeat/leave, failure detection, views."""

from .server import Coordinator
from .table import ALIVE, DEAD, SUSPECT, MemberRecord, MemberTable

__all__ = ["Coordinator", "MemberTable", "MemberRecord", "ALIVE", "SUSPECT", "DEAD"]
