"""trainsim simulator: specs, cost models and the simulate() entry point."""
