"""The pipeline's Pub/Sub I/O: reading with leases on local runners, publishing, settling."""
