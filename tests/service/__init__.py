"""The service: the real server started as a process, driven over HTTP by real clients."""
