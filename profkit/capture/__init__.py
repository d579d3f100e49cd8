"""Process lifecycle, HTTP to the server under test, the profiler window, the run manifest."""
