"""Verdicts: a measured result against a reference (simulation or theory), metric by metric."""
