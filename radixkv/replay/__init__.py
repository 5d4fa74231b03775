"""Replay of recorded or generated traffic through scheduler and cache.

replay.py (run_replay: sequential, simulated or real; one ReplayResult, built by
ReplayResult.build), simulator.py (the scheduler under a simulated clock), cost_model.py (seconds
a step would take), report.py (the printed summary), plot.py (hit rate and pool occupancy over
time). Torch loads only for a real run (an engine given: the caller builds `LLM(model, ...)`).
"""
