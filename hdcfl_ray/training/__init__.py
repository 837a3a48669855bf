"""The local-training library: plain torch, below the methods and the runtime.

`local_training` trains and scores one client's model (the loop every method's
`ClientContext.train` runs, SGD with momentum as torch.optim.SGD runs it, a loss tally
kept on the device); `precision` the mixed-precision scopes it runs under. Methods and
the runtime's client hosts call these; they import nothing above the models and the
contract."""
