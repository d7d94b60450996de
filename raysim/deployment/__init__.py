"""Simulated deployments (issue 28, in progress): who is available, who drops out, how long each
client's work takes on its device, and when a round can aggregate, all drawn from (seed, round,
client, purpose) so that serial and Ray give the same numbers.

- ``clock``: device times and the round policies (all, deadline, over-selection);
- ``draws``: availability (always, Bernoulli, diurnal), dropouts and heterogeneous devices.

Not yet wired into the engine: the settings (``deployment.*``) come with the wiring.
"""
