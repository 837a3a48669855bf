"""HDC-FL's server-side maths on numpy arrays: head descriptors, grouping, soft
memberships, encoder prototypes and personalised encoders (docs/hdcfl.md).

Nothing here knows about Ray or torch; the algorithm module calls these on the
server's cache of flat float32 vectors."""
