"""``python -m lbtestbed.dispatcher --cluster FILE --index I [--listen HOST:PORT]``: dispatcher I."""

from lbtestbed.dispatcher.app import build_app
from lbtestbed.dispatcher.host import DispatcherHost
from lbtestbed.transport.process import process_args, serve

cluster, index, listen = process_args("dispatcher")
me = cluster.dispatchers[index]
host = DispatcherHost(
    cluster.experiment(), index, len(cluster.dispatchers), cluster.node_urls(), cluster.token
)
serve(build_app(host), me.url, f"dispatcher-{index}", listen)
