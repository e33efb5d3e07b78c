"""The benchmarks' percentile is the product's (egpu.stats): one function for every figure."""

from egpu.stats import percentile

__all__ = ["percentile"]
