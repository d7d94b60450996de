"""What algorithms use to write their hooks (PyTorch on the client side, NumPy on the server side).

- ``context``: :class:`~raysim.toolkit.context.ClientContext`, a client's model, data, memory and
  random streams;
- ``train`` and ``sgd``: the one local-training loop and its SGD; ``batched``: many clients' training
  as one computation;
- ``features`` and ``prototypes``: feature extraction, class means and heads trained on them;
- ``distill``: FedDr+'s regulariser terms; ``aggregate``: weighted averages of uploads.
"""
