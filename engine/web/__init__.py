"""peerctl's HTTP face: the JSON API under ``/v1``, server-sent events of
what changed, ``/metrics`` and the web page, served by every peer (``peer
--api``) or by ``serve --api`` on a machine that is not a host.

It promises (docs/api.md):
- every route answers what the command line's ``--format json`` prints,
  from the same operations functions (engine/operations/);
- a write that starts an automation answers ``202`` with ``Location:
  /v1/automations/ID``; ``/wait`` blocks until it ends or a timeout;
- bad input is a ``4xx`` with ``{"error": ONE LINE}`` and nothing written;
  no traceback reaches a client;
- a viewer's write is ``403`` before anything is read; unauthenticated
  requests are ``401``; writes carried by a browser's ambient credentials
  (cookie, client certificate) need the CSRF token;
- it runs on its own thread and event loop, with bounded pools for the
  blocking operations and bounded connections, apart from the peer's engine.

Modules:
- :mod:`.server`: ``ApiServer(api, "HOST:PORT").start()`` on its own thread
  (loopback only without TLS unless ``insecure``), and ``serve_cluster``;
- :mod:`.app`: the aiohttp application, what every request goes through;
- :mod:`.routes`: the route table, one module per noun, one thin call of
  engine/operations/ each;
- :mod:`.identity`: who asks (client certificate, bearer token or the
  page's session) and CSRF;
- :mod:`.revocation`: the open event streams and console websockets by
  token and session, ended within a second when either is deleted or expires;
- :mod:`.events`: ``/v1/events``, server-sent events keyed by etcd revision;
- :mod:`.openapi`: the OpenAPI document, made from the route table;
- :mod:`.console`: a VM's serial console in the page, through a websocket;
  :mod:`.console_client` the command line's side of it (``console --via api``);
- :mod:`.metrics`: ``/metrics``, a Prometheus exposition from :mod:`.watched`
  (keys of etcd kept current by watches) and :mod:`.domain_metrics` (this
  host's domains, from libvirt).
"""
