"""Running the program on proxies into a trace, and what it did besides."""
