"""Client-level differential privacy (DP-FedAvg, McMahan et al. 2018): clipping each
client's update, the Gaussian mechanism on their sum, the adaptive clip of Andrew et al.
(2021) and the accountant that turns the releases of a run into (epsilon, delta).
Plain numpy; the accountant alone needs Opacus (the `dp` extra)."""
