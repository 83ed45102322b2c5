"""Shared by the dispatcher and the agent: job kinds, PodSets, wire messages and the I/O boundaries.

Nothing in this package knows which side it runs on.
"""

__version__ = "0.1.0"
