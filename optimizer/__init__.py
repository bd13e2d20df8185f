"""Optimizer: searches parallel plans in the simulator. Never imports torch.

Not built yet: see the issue "Optimizer: search parallelism, placement and collective plans
in the simulator; export them".
"""
