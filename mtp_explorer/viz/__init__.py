"""The figure layer: plotly figures of traces, oracles and sweeps (no widgets)."""
