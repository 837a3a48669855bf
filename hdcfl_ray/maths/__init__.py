"""Maths the methods and HDC-FL share, on the ground floor: weighted averages of flat
models in a fixed client order (`aggregate`), so a global encoder and a prototype of the
same clients are the same bits; the server's step from that mean (`server_optimizer`)."""
