"""Hot reload of the config file: on SIGHUP and when the file changes (`watch`), a valid config
becomes a new runtime for new requests, built around the running one's parts (`handover`)."""

from gateway.reload.handover import Handover, Leftovers, successor
from gateway.reload.watch import Reloader, Snapshot, parse_snapshot, read

__all__ = ["Handover", "Leftovers", "Reloader", "Snapshot", "parse_snapshot", "read", "successor"]
