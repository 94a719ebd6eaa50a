"""The door to the upstreams: the catalog, routing, visibility, lookup, the gate's checks and the call."""
