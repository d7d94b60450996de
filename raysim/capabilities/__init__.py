"""Optional features of an algorithm, each a frozen object declared on its class, each in its own
module (docs/design.md, "Algorithm hooks"):

- ``batching``: ``Batching(pinned=...)``, several clients trained as one computation, or why not;
- ``finetune``: ``FineTune(parts=..., default_epochs=...)``, "-FT" personalisation;
- ``regularizers``: ``Regularizable()``, FedDr+'s Table 1 regularisers;
- ``extra_rounds``: ``ExtraRounds(prologue=..., epilogue=...)``, passes outside the training rounds;
- ``round_log``: ``RoundLog()``, scalars, texts and pictures logged each round;
- ``validation``: ``Validation()``, the global model's validation accuracy read during the run;
- ``settings``: the ``algo.*`` settings the capabilities take (``ft_epochs``, ``regularizers``, ...).

A new capability is one module here and one class attribute on ``algorithms.base.Algorithm``.
"""
