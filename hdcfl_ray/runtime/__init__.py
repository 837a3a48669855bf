"""Running a scenario: the driver loop and what it drives.

- `driver`: prepares a run (every input check, before Ray starts), loops over the
  rounds, writes the run directory; `initial_model`: the seed-derived starting weights.
- `server/`: the federation protocol: the synchronous and asynchronous servers, the
  round tail they share, who trains (sampling, virtual clock), and how the server
  reaches client hosts (host pool, transport, messages). Torch-free.
- `client/`: client execution: the client host that owns logical clients, the
  context a method trains through, local SGD and evaluation, the tensor cache.
- `backends/`: where the server and the hosts live: the local backend (this
  process) or the Ray backend (actors, placement, the Ray session).
"""
