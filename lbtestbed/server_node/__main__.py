"""``python -m lbtestbed.server_node --cluster FILE --index J [--listen HOST:PORT]``: node host J."""

from lbtestbed.server_node.app import build_app
from lbtestbed.server_node.host import NodeHost
from lbtestbed.transport.process import Budget, ConnectionGuard, process_args, raise_fd_limit, serve

cluster, exp, index, listen = process_args("server_node")
me = cluster.node_hosts[index]
host = NodeHost(
    exp,
    me.nodes,
    [d.url for d in cluster.dispatchers],
    cluster.token,
    cluster.max_tasks,
    me.url,
)
host.origin = cluster.origin  # a node host restarted during a run takes up the run's clock
host.origin_monotonic = cluster.origin_monotonic if cluster.origin_machine == host.machine else 0.0
host.guard = ConnectionGuard(Budget.of("server_node", raise_fd_limit()).connections)
serve(build_app(host), me.url, f"nodes-{index}", listen, host.guard, stats=host.http)
