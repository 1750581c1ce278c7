"""Helpers of the builder's tests (unit/ and e2e/): engines, proxies, builds, fixtures' parts."""
