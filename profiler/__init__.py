"""Profiler: real kernel and collective times with torch, written to a profile DB.

Not built yet: see the issue "Profiler: real kernel and collective times with torch, profile
DB, cost model". Until then the simulator uses the hardware catalog's roofline.
"""
