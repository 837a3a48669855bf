"""The server side of the federation protocol, torch-free so a server actor never loads torch.

`sync_server` runs synchronous rounds, `async_server` server versions on the virtual
clock; both end a round through `round_tail`. `settings` is what a server is built
with; `sampling` and `virtual_clock` decide who trains and for how long; `host_pool`,
`transport` and `messages` are how the server reaches the client hosts.
"""
