"""Client execution: `client_host` (the plain object behind a client host actor) owns
logical clients and runs a method's client hooks through `client_context`;
`local_training` is local SGD and evaluation; `tensor_cache` keeps transformed data.
Importing this package imports no torch; its modules do where they need it."""
