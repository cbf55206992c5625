"""zkcontroller's controller: the ZooKeeper layout and codecs, the embedded ZooKeeper, election with
epoch fencing, the single event thread, and the group coordinator (sans-IO core + kazoo layer)."""

__version__ = "0.1.0"
