"""What the cluster's processes share to talk to each other.

``wire`` is the protocol's codec (docs/protocol.md: JSON bodies and their checks, no HTTP),
``aiohttp_glue`` serves it with aiohttp, ``metrics`` holds the Prometheus helpers every process shares,
``http`` the lean client of the task path, ``signing`` the signatures of requests and answers,
``cluster_file`` the file that names every process and holds the token, ``message_faults`` what a sender
does to its state messages while a fault is on, ``actions`` what the hosts' cores ask their shells to do,
``tasks`` a host's background tasks, and ``process`` how one dispatcher or node process runs (uvloop,
limits, logging, SIGTERM).
"""
