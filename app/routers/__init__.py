"""HTTP routes, one module per audience: pages (HTML), api (JSON), live (SSE), ops (probes)."""
