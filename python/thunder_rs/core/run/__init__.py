"""The jitted callable: cache, per-call path, compilation, autograd connection, reports."""
