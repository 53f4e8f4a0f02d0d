"""Proxies, the recorder, language contexts and acquisition of functions and modules."""
