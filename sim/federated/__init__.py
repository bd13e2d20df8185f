"""Federated training on a virtual clock: client populations, the server's shared link,
FedAvg / FedProx rounds and FedBuff (:func:`simulate_fl`)."""

from sim.federated.simulate import FLResult, simulate_fl

__all__ = ["FLResult", "simulate_fl"]
