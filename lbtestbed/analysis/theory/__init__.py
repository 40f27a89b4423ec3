"""Theory: the closed forms, fixed points and bounds of the papers, for any spec (``lbt predict``)."""

from lbtestbed.analysis.theory.predict import predict, transient_table

__all__ = ["predict", "transient_table"]
