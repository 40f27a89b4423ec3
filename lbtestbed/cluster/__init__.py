"""A local cluster: starting and stopping its processes, network namespaces, and a Prometheus beside it.

``launcher`` brings a cluster up from an experiment and takes it down, ``processes`` is the operating
system's side of that (ports, pids, signals), ``netns`` puts node processes in network namespaces, and
``prometheus`` runs a real Prometheus server that scrapes the cluster.
"""
