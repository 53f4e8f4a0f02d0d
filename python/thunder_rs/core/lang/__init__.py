"""Language contexts and recording: what a call on proxies records."""
