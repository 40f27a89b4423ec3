"""What the cluster's processes share to talk to each other.

``wire`` is the HTTP/JSON protocol (docs/protocol.md), ``cluster_file`` the file that names every
process and holds the token, ``message_faults`` what a sender does to its state messages while a fault
is on, and ``process`` how one dispatcher or node process runs (uvloop, limits, logging, SIGTERM).
"""
