"""What a run reports and how it is read back: the metrics (``metrics``, ``analysis``), the run
directory's tables, TensorBoard and the progress bar (``output``, ``tensorboard``), the partition's
picture (``partition_view``) and the comparison reports of runs and suites (``report``)."""
