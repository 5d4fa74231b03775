"""Replay of recorded or generated traffic through scheduler and cache.

replay.py (run_replay: sequential, simulated or real; ReplayResult), simulator.py (the scheduler
under a simulated clock), cost_model.py (seconds a step would take), plot.py (hit rate and pool
occupancy over time). Torch loads only for a real run (a model given).
"""
