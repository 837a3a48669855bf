"""Diagnostics computed from a run's numbers: grouping quality and stability,
membership entropy, personalisation gain, client-accuracy fairness summaries."""
