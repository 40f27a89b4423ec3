"""``python -m lbtestbed.dispatcher --cluster FILE --index I [--listen HOST:PORT]``: dispatcher I."""

from lbtestbed.dispatcher.app import build_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.transport.cluster_file import journal_of
from lbtestbed.transport.process import Budget, ConnectionGuard, process_args, raise_fd_limit, serve

cluster, exp, index, listen = process_args("dispatcher")
me = cluster.dispatchers[index]
budget = Budget.of("dispatcher", raise_fd_limit())
host = DispatcherHost(
    exp,
    index,
    exp.policy.dispatchers,
    cluster.node_urls(),
    cluster.token,
    me.url,
    journal_of(me),  # so that a restarted dispatcher still lists what its predecessor saw
)
host.core.max_in_flight = budget.in_flight
host.guard = ConnectionGuard(budget.connections)
serve(build_app(host), me.url, f"dispatcher-{index}", listen, host.guard, stats=host.http)
