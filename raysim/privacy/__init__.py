"""Differential privacy: the accountant (:mod:`raysim.privacy.accounting`), client-level DP on the
server (:mod:`raysim.privacy.client_level`) and sample-level DP-SGD in the clients' training
(:mod:`raysim.privacy.dp_sgd`); the settings are ``privacy.*`` (:class:`raysim.config.PrivacyConfig`)."""
