"""Knobs a run chooses for itself: a method's data-dependent knob set to `auto`
(PACFL's threshold, a cluster count, a proximal coefficient; each method declares
its own in `MethodSpec.auto_knobs`) is chosen before the run starts, by the rule
`hdcfl-ray calibrate` applies: one shortened run per value of the knob's grid,
scored on images each client holds out of its own training data (never the test
set), the value with the highest final mean accuracy kept (docs/calibration.md).

* `plan`: which knobs are auto, their candidates, the shortened schedule and the
  candidate scenarios (no training; `hdcfl-ray validate` prints it);
* `selection`: the rule that picks a value from the candidates' scores;
* `record`: what a run records of its choices (the manifest's `auto_knobs`);
* `cache`: where a choice is kept per setting and seed, so a sweep chooses once;
* `choose`: running the candidates and choosing, knob after knob.

No module here names a method."""
