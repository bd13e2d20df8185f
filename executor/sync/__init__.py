"""Real runs of data-parallel synchronisation strategies (``plan.sync``) with
torch.distributed: workers and parameter-server ranks under torchrun, on real bundled data
(:mod:`executor.sync.task`)."""
