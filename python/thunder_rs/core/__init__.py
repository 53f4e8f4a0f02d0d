"""The layer under the torch language and the executors: proxies, program state, recording,
acquisition and the jitted callable, as sub-packages that import only those before them
(base, state, lang, acquisition, run; tests/test_layers.py keeps them so)."""
