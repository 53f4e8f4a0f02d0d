"""What everything stands on: the proxy, dtypes, the user's line, problems, logs."""
