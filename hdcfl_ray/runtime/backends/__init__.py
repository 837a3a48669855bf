"""Where a run's server and client hosts live: this process or Ray actors.

`choice` picks the backend for a scenario (`runtime.backend`: ray, local, auto).
`local_backend` runs the server and one client host in this process, built by
`local_host`. `ray_backend` starts the `actors` on the cluster a `ray_session`
starts or joins, `placement` deciding how many hosts and which clients each owns,
`host_spec` how to rebuild a host that dies. Importing this package imports
neither Ray nor torch.
"""
