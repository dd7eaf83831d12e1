"""Network as a permission: the egress allowlist and the host-side proxy that enforces it.

The sandbox itself has no route anywhere. A profile with ``[network] mode = "allowlist"`` gets
one proxy per run, reached through a Unix socket bridged to a loopback port in the sandbox:

- :mod:`sandcell.network.allowlist`: the profile's ``host:port`` rules (pure);
- :mod:`sandcell.network.addresses`: which addresses may be reached; one pinned resolution;
- :mod:`sandcell.network.sni`: the server name of a TLS ClientHello (pure);
- :mod:`sandcell.network.http_head`: strict HTTP/1 heads (pure);
- :mod:`sandcell.network.caps`, :mod:`sandcell.network.relay`: the per-run caps, byte relaying;
- :mod:`sandcell.network.targets`, :mod:`sandcell.network.handler`: one connection's checks;
- :mod:`sandcell.network.proxy`: :class:`~sandcell.network.proxy.EgressProxy`, the server;
- :mod:`sandcell.network.records`: the report of every attempt, for the run record;
- :mod:`sandcell.network.bridge`: the loopback-port forwarder that runs inside the sandbox.

Nothing is imported here, so that loading a profile (which parses the allowlist) does not load
the proxy.
"""
