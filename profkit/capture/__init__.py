"""A run -> traces/<run_id>/: the server's process lifecycle, the profiler window, the run manifest (no analysis: flows/ does it)."""
