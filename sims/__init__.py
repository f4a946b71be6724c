"""Workload generators and simulations (GeoNames and, later, skew variants)."""
