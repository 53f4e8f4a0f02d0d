"""Python state a program reads, and the guards that re-check it per call."""
