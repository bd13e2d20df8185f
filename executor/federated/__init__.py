"""Real federated runs on CPU: one server and client processes over gloo, FedAvg / FedProx
rounds on a non-IID split of a bundled dataset, with the server's link and the clients'
links emulated by pacing (:mod:`executor.federated.pacer`)."""
