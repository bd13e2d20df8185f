"""Executor: runs a plan for real with torch.distributed and compares it with the simulator.

Not built yet: see the issue "Executor: run a plan for real with torch.distributed, measure
it, close the loop with the simulator".
"""
