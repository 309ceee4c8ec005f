"""Communication layer: the only way an algorithm talks to other partitions.

See ``Comm`` in geodml.comm.collectives for the interface, geodml.comm.ledger for byte
accounting, geodml.comm.wan for topologies and the link model, geodml.comm.transport for the
ZeroMQ peer transport.
"""

from geodml.comm.collectives import Comm
from geodml.comm.ledger import KINDS, Ledger

__all__ = ["Comm", "Ledger", "KINDS"]
